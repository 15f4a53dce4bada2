"""Training part of the model (`train.freeze_encoder`, `train.freeze_old_rows`): frozen parts
stay bit for bit, and the rows that train move exactly as they do in a step that trains
every row. The BCE estimator is a sum of per-(query, label) terms, so with the encoder
frozen a row's update depends on its own scores alone, whatever the other rows do."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from tiny_step import B, L, problem

from astra_jax.config import base as config_base
from astra_jax.parallel import sharding
from astra_jax.runtime.errors import InputError
from astra_jax.training import checkpoint, optim, steps

STEPS = 3
BETA = 0.9


def _train(shape, trainable_rows, momentum):
  """(encoder start, encoder after, W start, W after (padded rows cut), the final state) for
  STEPS steps with the encoder frozen and, when given, only `trainable_rows` trainable."""
  graphdef, enc, oc, batches, w0 = problem(num_shards=shape[1])
  oc.classifier_weight_decay = 0.0
  mesh = sharding.make_mesh(*shape)
  rows = sharding.padded_rows(L, mesh)
  w_padded = np.concatenate([w0, np.zeros((rows - L, w0.shape[1]), w0.dtype)])
  trainable = None
  if trainable_rows is not None:
    mask = np.zeros(rows, bool)
    mask[trainable_rows] = True
    trainable = jax.device_put(mask, NamedSharding(mesh, P("model")))
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w_padded)}
  tx = optax.set_to_zero()
  state = steps.shard_state(
    steps.init_sparse_state(
      tx, params, momentum_period=STEPS if momentum else 0, mesh=mesh, trainable=trainable
    ),
    mesh,
  )
  step = steps.make_sparse_train_step(
    graphdef,
    tx,
    optim.classifier_schedule(oc, STEPS),
    0.0,
    mesh,
    B,
    momentum=momentum,
    train_encoder=False,
  )
  for i, b in enumerate(batches[:STEPS]):
    state, _, _ = step(state, sharding.shard_batch(b, mesh), jax.random.key(i))
  state = steps.fold_classifier(state)
  w = np.asarray(state.classifier)[:L]
  return jax.device_get(enc), jax.device_get(state.encoder), w0, w, state


@pytest.mark.parametrize("momentum", [0.0, BETA])
@pytest.mark.parametrize("shape", [(1, 1), (2, 4)])
def test_only_the_trainable_rows_move_and_as_without_the_mask(shape, momentum):
  new = np.arange(0, L, 3)  # every third label is new
  old = np.setdiff1d(np.arange(L), new)
  enc0, enc, w0, w, state = _train(shape, new, momentum)
  _, _, _, w_all, _ = _train(shape, None, momentum)
  for a, b in zip(jax.tree.leaves(enc0), jax.tree.leaves(enc), strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(w[old], w0[old])
  assert not np.allclose(w_all[old], w0[old])  # the batches do touch the old rows
  assert not np.allclose(w[new], w0[new])
  np.testing.assert_allclose(w[new], w_all[new], rtol=1e-5, atol=1e-6)
  if shape[1] > 1:
    assert state.trainable.sharding.spec == P("model")


def test_the_mask_is_saved_with_the_step_and_restored(tmp_path):
  new = np.arange(5, 20)
  *_, state = _train((1, 8), new, 0.0)
  ck = checkpoint.Checkpoints(str(tmp_path))
  ck.save(STEPS, *steps.saved_layout(state), {"step": STEPS})
  ck.close()
  like = state.replace(trainable=jnp.zeros_like(state.trainable))
  ck = checkpoint.Checkpoints(str(tmp_path))
  params, opt_state, _ = ck.restore(*steps.saved_layout(like))
  ck.close()
  restored = steps.from_saved(like, params, opt_state, STEPS)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(restored.trainable)), new)
  assert restored.trainable.sharding.spec == P("model")


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"train.freeze_old_rows": True}, "train.freeze_old_rows: needs train.init_from"),
    (
      {"train.freeze_old_rows": True, "train.init_from": "wd"},
      "needs optim.classifier_weight_decay=0 \\(got 0.0001\\)",
    ),
    (
      {"train.freeze_encoder": True, "warmstart.epochs": 2},
      "the warm start \\(warmstart.epochs=2\\) would train the frozen encoder",
    ),
    (
      {"train.freeze_encoder": True, "optim.classifier_update": "dense"},
      "freezing part of the model needs the sparse step",
    ),
  ],
)
def test_a_freeze_the_run_cannot_honour_is_one_error(load_config, changes, message):
  c = load_config("experiments/demo.py")
  for key, value in changes.items():
    section, name = key.split(".")
    c[section][name] = value
  with pytest.raises(InputError, match=message):
    config_base.validate(c)
