"""The sparse model-parallel step equals the dense optax step on every mesh shape, with and
without gradient accumulation; fp16 loss scaling skips overflowing steps and rescues
gradients that would underflow."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tiny_step import KH, B, L, problem

from astra_jax.data.batch import LabelBatch, TrainBatch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.parallel import sharding
from astra_jax.training import loss_scale, optim, steps
from astra_jax.xc import loss


def _run(step_fn, state, batches, put_batch):
  losses = []
  for i, b in enumerate(batches):
    state, value, _ = step_fn(state, put_batch(b), jax.random.key(i))
    losses.append(float(value))
  state = steps.fold_classifier(state)
  return losses, jax.device_get(state.encoder), np.asarray(state.classifier)


def _dense_reference(graphdef, enc, oc, batches, w0):
  """The dense optax step (autodiff w.r.t. all of W) on one device."""
  tx = optim.make_optimizer(oc, 10)
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w0)}
  step = steps.make_train_step(graphdef, tx)
  return _run(
    step, steps.init_dense_state(tx, params), batches, lambda b: jax.tree.map(jnp.asarray, b)
  )


def _sparse(graphdef, enc, oc, batches, w0, shape, scaling="off", init_scale=1.0):
  tx = optim.encoder_optimizer(oc, 10)
  mesh = sharding.make_mesh(*shape)
  rows = sharding.padded_rows(len(w0), mesh)  # padded rows start at 0, as in the trainer
  w_padded = np.concatenate([w0, np.zeros((rows - len(w0), w0.shape[1]), w0.dtype)])
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w_padded)}
  state = steps.shard_state(steps.init_sparse_state(tx, params, init_scale), mesh)
  if shape[1] > 1:
    assert state.classifier.sharding.spec == jax.sharding.PartitionSpec("model")
  step = steps.make_sparse_train_step(
    graphdef, tx, optim.classifier_schedule(oc, 10), oc.classifier_weight_decay, mesh, B, scaling
  )
  return _run(step, state, batches, lambda b: sharding.shard_batch(b, mesh))


def _assert_same(got, ref, w0):
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
  np.testing.assert_array_equal(got[2][len(w0) :], 0.0)  # padded rows: never sampled
  np.testing.assert_allclose(got[2][: len(w0)], ref[2], rtol=1e-5, atol=1e-6)
  assert not np.allclose(got[2][: len(w0)], w0)
  # Adam amplifies float noise on ~zero gradients up to lr (see test_sparse_sgd.py).
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(ref[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("shape", [(1, 1), (8, 1), (2, 4), (1, 8)])
def test_sharded_step_equals_dense_single_device_step(shape):
  assert jax.device_count() == 8
  setup = problem(num_shards=shape[1])
  _assert_same(_sparse(*setup, shape), _dense_reference(*setup), setup[-1])


def test_kept_positives_weighted_in_the_sharded_step():
  # Rows with 3 positives, k_p = 2: the sampler keeps 2 with weight 3/2; the model-parallel
  # kernel must weight them as the dense estimator does.
  setup = problem(num_shards=4, k_p=2)
  assert np.all(setup[3][0].labels.pos_weight == 1.5)
  _assert_same(_sparse(*setup, (2, 4)), _dense_reference(*setup), setup[-1])


@pytest.mark.parametrize("per_query", [False, True])
def test_padded_last_shard_equals_dense_step(per_query):
  """61 labels on 4 shards of 16 rows: the last shard has 13 real rows and 3 padded."""
  setup = problem(num_shards=4, per_query=per_query, num_labels=61)
  _assert_same(_sparse(*setup, (2, 4)), _dense_reference(*setup), setup[-1])


@pytest.mark.parametrize("shape", [(1, 1), (8, 1), (2, 4), (1, 8)])
def test_per_query_draws_sharded_step_equals_dense_single_device_step(shape):
  setup = problem(num_shards=shape[1], per_query=True)
  assert setup[3][0].labels.rand_ids.shape == (1, B, shape[1] * 24)
  _assert_same(_sparse(*setup, shape), _dense_reference(*setup), setup[-1])


def _with_masked_columns(batch, num_shards, extra):
  """The batch with `extra` more hard and random columns per shard, all masked: each a
  copy of the block's first column, so it would change the step if it were not."""
  labels = batch.labels._asdict()
  for ids, mask in (("hard_ids", "hard_mask"), ("rand_ids", "rand_mask")):
    keys = (ids, mask) + (("rand_weight",) if ids == "rand_ids" else ())
    for k in keys:
      v = labels[k].reshape(*labels[k].shape[:-1], num_shards, -1)
      pad = np.zeros_like(v[..., :1]) if k == mask else v[..., :1]
      labels[k] = np.concatenate([v] + [pad] * extra, -1).reshape(*v.shape[:-2], -1)
  return batch._replace(labels=LabelBatch(**labels))


@pytest.mark.parametrize("per_query", [False, True])
def test_masked_columns_leave_the_step_unchanged(per_query):
  """The curricula pad their batches to one width with masked columns (sampler.py)."""
  graphdef, enc, oc, batches, w0 = setup = problem(num_shards=4, per_query=per_query)
  padded = [_with_masked_columns(b, 4, extra=3) for b in batches]
  assert padded[0].labels.hard_ids.shape[-1] == 4 * (KH + 3)
  got = _sparse(graphdef, enc, oc, padded, w0, (2, 4))
  _assert_same(got, _sparse(*setup, (2, 4)), w0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_step_and_fold_write_w_into_its_own_buffer(momentum):
  """The trainer advises W's buffer (and the velocity's) once
  (host_memory.back_with_huge_pages): the donated step, the re-base that begins a momentum
  period and the fold must keep writing into those buffers, not new ones."""
  graphdef, enc, oc, batches, w0 = problem(num_shards=1, per_query=True)
  oc.classifier_weight_decay = 1e-3
  tx = optim.encoder_optimizer(oc, 10)
  mesh = sharding.make_mesh(1, 1)
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w0)}
  period = 2 if momentum else 0  # a re-base every other step
  state = steps.shard_state(steps.init_sparse_state(tx, params, momentum_period=period), mesh)
  step = steps.make_sparse_train_step(
    graphdef,
    tx,
    optim.classifier_schedule(oc, 10),
    oc.classifier_weight_decay,
    mesh,
    B,
    momentum=momentum,
  )
  arrays = lambda s: [s.classifier] + ([s.momentum.velocity] if momentum else [])
  buffers = [x.unsafe_buffer_pointer() for x in arrays(state)]
  for i, b in enumerate(batches):
    state, _, _ = step(state, sharding.shard_batch(b, mesh), jax.random.key(i))
    assert [x.unsafe_buffer_pointer() for x in arrays(state)] == buffers
  state = steps.fold_classifier(state)
  assert [x.unsafe_buffer_pointer() for x in arrays(state)] == buffers
  assert not np.allclose(np.asarray(state.classifier), w0)


@pytest.mark.parametrize("shape,per_query", [((1, 1), False), ((2, 4), False), ((2, 4), True)])
def test_gradient_accumulation_sums_micro_batch_gradients(shape, per_query):
  graphdef, enc, oc, batches, w0 = problem(
    num_shards=shape[1], micro_batches=2, dropout=0.0, per_query=per_query
  )
  got = _sparse(graphdef, enc, oc, batches, w0, shape)
  # Independent reference: autodiff of the mean over both micro-batches of the estimator,
  # written out here without the step's scan, then the optax chain.
  tx = optim.make_optimizer(oc, 10)
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w0)}
  state = tx.init(params)

  def total(p, b):
    enc_model = nnx.merge(graphdef, p["encoder"])
    return (
      sum(
        loss.sampled_bce(
          enc_model(b.input_ids[i]), p["classifier"], jax.tree.map(lambda v, i=i: v[i], b.labels)
        )
        for i in range(2)
      )
      / 2
    )

  losses = []
  for b in batches:
    b = jax.tree.map(jnp.asarray, b)
    value, g = jax.value_and_grad(total)(params, b)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
    losses.append(float(value))
  _assert_same(
    got, (losses, jax.device_get(params["encoder"]), np.asarray(params["classifier"])), w0
  )


def test_dynamic_loss_scaling_in_float16():
  setup = problem(num_shards=1, dtype="float16")
  # A scale so large that float16 cotangents overflow: the first steps are skipped and
  # the scale halves until they fit; nothing changes on a skipped step.
  graphdef, enc, oc, batches, w0 = setup
  tx = optim.encoder_optimizer(oc, 10)
  mesh = sharding.make_mesh(1, 1)
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w0)}
  state = steps.shard_state(steps.init_sparse_state(tx, params, 2.0**40), mesh)
  step = steps.make_sparse_train_step(
    graphdef, tx, optim.classifier_schedule(oc, 10), oc.classifier_weight_decay, mesh, B, "dynamic"
  )
  before = jax.device_get((state.params, state.opt, state.scale))
  state, _, _ = step(state, sharding.shard_batch(batches[0], mesh), jax.random.key(0))
  assert float(state.loss_scale["scale"]) == 2.0**39 and int(state.step) == 0
  after = jax.device_get((state.params, state.opt, state.scale))
  for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)):  # W, encoder, Adam, scale
    np.testing.assert_array_equal(a, b)
  # With a workable scale the float16 step tracks the float32 one.
  f32 = _sparse(*problem(num_shards=1), (1, 1))
  scaled = _sparse(*setup, (1, 1), "dynamic", 2.0**10)
  np.testing.assert_allclose(scaled[0], f32[0], rtol=2e-2)
  np.testing.assert_allclose(scaled[2], f32[2], atol=2e-2)


def test_loss_scaling_rescues_float16_gradients_that_underflow():
  # Classifier rows of norm ~1e-3 make dloss/dE(x) ~1e-5 per query: the encoder's float16
  # cotangents fall below float16's smallest subnormal (6e-8) and flush to zero without
  # scaling, so Adam leaves those entries where they were; scaled by 2^15 they survive.
  def encoder_after_two_steps(dtype, scaling, init_scale):
    graphdef, enc, oc, batches, w0 = problem(num_shards=1, dtype=dtype)
    before = jax.tree.leaves(jax.device_get(enc))
    # the first step has lr 0 (warmup), the second moves the encoder
    after = jax.tree.leaves(
      _sparse(graphdef, enc, oc, batches[:2], 1e-3 * w0, (1, 1), scaling, init_scale)[1]
    )
    flat = lambda xs: np.concatenate([np.ravel(x) for x in xs]).astype(np.float64)
    return flat(after), flat(after) != flat(before)

  f32, moved32 = encoder_after_two_steps("float32", "off", 1.0)
  unscaled, moved_unscaled = encoder_after_two_steps("float16", "off", 1.0)
  scaled, moved_scaled = encoder_after_two_steps("float16", "dynamic", 2.0**15)
  assert moved32.mean() > 0.9
  assert moved_unscaled.mean() < moved32.mean() - 0.05  # underflow froze entries
  np.testing.assert_array_equal(moved_scaled, moved32)
  assert np.abs(scaled - f32).max() < 1e-3 < np.abs(unscaled - f32).max()


def test_full_baseline_step_counts_every_positive_not_only_k_p():
  # Rows with 5 positives, k_p = 2: the full-L step's loss is eq. 1 with all 5 as positives
  # (the 3 not sampled into pos_ids must not be trained as negatives).
  graphdef, enc, oc, _, w0 = problem(num_shards=1, dropout=0.0)
  rng = np.random.default_rng(1)
  rows = [list(rng.choice(L, 5, replace=False)) for _ in range(B)]
  sampler = NegativeSampler(SparseRows.from_lists(rows, L), k_p=2, k_h=0, k_r=4, all_positives=5)
  batch = TrainBatch(
    rng.integers(1, 40, (1, B, 10)).astype(np.int32),
    jax.tree.map(lambda v: v[None], sampler(np.arange(B), rng)),
  )
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w0)}
  tx = optim.make_optimizer(oc, 10)
  emb, _ = steps.encode(
    graphdef, params["encoder"], jnp.asarray(batch.input_ids[0]), jax.random.key(0)
  )
  targets = np.zeros((B, L))
  for i, r in enumerate(rows):
    targets[i, r] = 1
  want = float(loss.full_bce(emb, jnp.asarray(w0), jnp.asarray(targets)))
  step = steps.make_train_step(graphdef, tx, full_block=24)  # 64 labels: 3 blocks, 1 partial
  _, value, _ = step(
    steps.init_dense_state(tx, params), jax.tree.map(jnp.asarray, batch), jax.random.key(0)
  )
  np.testing.assert_allclose(float(value), want, rtol=1e-5)


def test_loss_scale_schedule():
  s = loss_scale.init(8.0)
  s = loss_scale.adjust(s, jnp.bool_(False))
  assert float(s["scale"]) == 4.0 and int(s["good_steps"]) == 0
  for _ in range(3):
    s = loss_scale.adjust(s, jnp.bool_(True), period=3)
  assert float(s["scale"]) == 8.0 and int(s["good_steps"]) == 0


def test_mesh_errors_padding_and_process_rows():
  with pytest.raises(ValueError, match="needs 6 devices, have 8"):
    sharding.make_mesh(3, 2)
  mesh = sharding.make_mesh(-1, 4)
  assert mesh.shape == {"data": 2, "model": 4}
  assert sharding.padded_rows(10, mesh) == 12
  assert sharding.make_mesh(1, 1).devices.size == 1
  assert sharding.process_token_rows(mesh, 2, 16).all()  # one process holds every row
