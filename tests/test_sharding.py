"""The model-parallel step equals the single-device sparse step on every mesh shape."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from astra_jax import optim, sharding, sparse_sgd, train
from astra_jax.data.xc_format import SparseRows
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.sampler import NegativeSampler

L, B, D = 64, 16, 8


def _setup():
  cfg = EncoderConfig(vocab_size=40, hidden_size=D, num_layers=1, num_heads=2,
                      intermediate_size=16, max_position=16, embedding_dropout=0.3)
  graphdef, enc = nnx.split(Encoder(cfg, nnx.Rngs(0)), nnx.Param)
  oc = ml_collections.ConfigDict(dict(encoder_lr=1e-2, classifier_lr=0.5, warmup_steps=1,
                                      encoder_weight_decay=0.0, classifier_weight_decay=0.05,
                                      classifier_momentum=0.0, grad_clip_norm=0.0))
  rng = np.random.default_rng(0)
  labels = SparseRows.from_lists([list(rng.choice(L, 3, replace=False)) for _ in range(40)], L)
  sampler = NegativeSampler(labels, k_p=4, k_h=5, k_r=24)
  batches = []
  for step in range(3):
    b = sampler(rng.choice(40, B, replace=False), rng, rng.integers(0, L, (B, 5)))
    b["input_ids"] = rng.integers(1, 40, (B, 10)).astype(np.int32)
    b.pop("rows", None)
    batches.append(b)
  w0 = 0.5 * np.asarray(jax.random.normal(jax.random.key(1), (L, D)))
  return graphdef, enc, oc, batches, w0


def _run(step_fn, params, opt_state, batches, put_batch=lambda b: b):
  losses = []
  for i, b in enumerate(batches):
    params, opt_state, value, _ = step_fn(params, opt_state,
                                          put_batch({k: jnp.asarray(v) for k, v in b.items()}),
                                          jax.random.key(i))
    losses.append(float(value))
  w, _ = sparse_sgd.fold(params["classifier"], opt_state["scale"])
  return losses, jax.device_get(params["encoder"]), np.asarray(w)


@pytest.mark.parametrize("shape", [(8, 1), (2, 4), (1, 8)])
def test_sharded_step_equals_single_device(shape):
  assert jax.device_count() == 8
  graphdef, enc, oc, batches, w0 = _setup()
  tx = optim.encoder_optimizer(oc, 10)
  sched = optim.classifier_schedule(oc, 10)
  copy = lambda t: jax.tree.map(jnp.array, t)

  params = {"encoder": copy(enc), "classifier": jnp.asarray(w0)}
  single = train.make_sparse_train_step(graphdef, tx, sched, oc.classifier_weight_decay)
  ref = _run(single, params, train.init_sparse_opt_state(tx, params), batches)

  mesh = sharding.make_mesh(*shape)
  params = {"encoder": copy(enc), "classifier": jnp.asarray(w0)}
  params, opt_state = sharding.shard_params(params, train.init_sparse_opt_state(tx, params), mesh)
  assert params["classifier"].sharding.spec == jax.sharding.PartitionSpec("model")
  step = train.make_sharded_train_step(graphdef, tx, sched, oc.classifier_weight_decay, mesh, B)
  got = _run(step, params, opt_state, batches, lambda b: sharding.shard_batch(b, mesh))

  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
  np.testing.assert_allclose(got[2], ref[2], rtol=1e-5, atol=1e-6)
  assert not np.allclose(got[2], w0)
  # Adam amplifies float noise on ~zero gradients up to lr (see test_sparse_sgd.py).
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(ref[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-4)


def test_mesh_errors_and_padding():
  with pytest.raises(ValueError, match="needs 6 devices, have 8"):
    sharding.make_mesh(3, 2)
  mesh = sharding.make_mesh(-1, 4)
  assert mesh.shape == {"data": 2, "model": 4}
  assert sharding.padded_rows(10, mesh) == 12
