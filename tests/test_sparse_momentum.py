"""Classifier momentum at the cost of the rows a step touches equals dense SGD with momentum
(optax's, decay inside the momentum as torch's), over long untouched stretches, on 1 x 1 and
2 x 4 meshes, with gradient accumulation, and across a checkpoint in the middle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_step import B, L, problem

from astra_jax.parallel import sharding
from astra_jax.training import checkpoint, optim, steps, train
from astra_jax.xc import classifier, sparse_momentum

BETA, WD = 0.9, 5e-3  # lr x wd up to 2e-3, under (1 - sqrt(BETA))^2 = 2.6e-3


def _dense_transition(lr, wd, beta):
  """A_t, the step's map of (w, m) without a gradient, in float64 (docs/DESIGN.md,
  section 3, written out)."""
  return np.array([[1 - lr * wd, -lr * beta], [wd, beta]])


@pytest.mark.parametrize("wd", [1e-4, 6e-3])
def test_period_coefficients_follow_the_dense_step(wd):
  """Over a whole period of a warmup + cosine schedule, reading an untouched row at step j
  is A_j applied to reading it at step j - 1, and the step's gradient coefficients add
  (-lr_j g, g) to (w, m); past the period every coefficient is NaN."""
  capacity = sparse_momentum.period_capacity(BETA)
  schedule = optim.schedule(0.4, 100, 3000)
  first = 40  # the period begins inside the warmup
  lrs = jax.vmap(schedule)(first + jnp.arange(capacity + 400))
  coef = np.asarray(sparse_momentum.period_coefficients(lrs, capacity, wd, BETA), np.float64)
  assert coef.shape == (capacity + 2, 6) and np.isnan(coef[-1]).all()
  read = coef[:, :4].reshape(-1, 2, 2)  # (w, m) = read_j (q, r)
  lrs = np.asarray(lrs, np.float64)
  travel = lrs.max() * BETA / (1 - BETA)  # a steady gradient's remaining travel at most
  for j in range(1, capacity + 1):
    lr = lrs[j - 1]
    # Columns scale alike (q's by its slow decay, r's by beta^j): compare each column to
    # its own size.
    want = _dense_transition(lr, wd, BETA) @ read[j - 1]
    size = np.abs(want).max(axis=0)
    np.testing.assert_allclose(read[j] / size, want / size, rtol=2e-5, atol=1e-6)
    # w's share of a gradient is -lr, the slow coordinate's -(lr + s) less the fast one's
    # s: it is exact to float32 of the remaining travel s, not of lr (small in the warmup).
    np.testing.assert_allclose(read[j] @ coef[j, 4:], [-lr, 1.0], rtol=1e-5, atol=1e-5 * travel)


def test_coefficients_are_nan_where_the_modes_are_complex():
  """lr wd = 0.02 > (1 - sqrt(0.9))^2: no real slow mode, so no coefficients to trust."""
  lrs = jnp.full((300,), 0.4, jnp.float32)
  assert np.isnan(np.asarray(sparse_momentum.period_coefficients(lrs, 50, 0.05, BETA))).all()


@pytest.mark.parametrize("capacity", [7, None])
def test_rows_untouched_for_thousands_of_steps_match_the_dense_recurrence(capacity):
  """Single array, no mesh: rows never touched after step 3, rows touched every 17 or 500
  steps, a row touched twice per step, through periods of 7 steps or of the default
  length; the float64 dense recurrence as the truth. The beta mode of a 2,000-step gap
  (0.9^2000 = 1e-92) underflows: nothing may divide by it."""
  rows, d, steps = 12, 3, 2000
  capacity = capacity or sparse_momentum.period_capacity(BETA)
  rng = np.random.default_rng(0)
  schedule = optim.schedule(0.4, 200, steps)
  lrs = np.asarray(jax.vmap(schedule)(jnp.arange(steps)), np.float64)
  w = rng.normal(size=(rows, d))
  m = np.zeros((rows, d))
  state = sparse_momentum.init(rows, d, capacity)
  v = jnp.asarray(w, jnp.float32)
  begin = jax.jit(lambda v, state, t: sparse_momentum.begin_period(v, state, schedule, t, WD, BETA))

  @jax.jit
  def step(v, state, ids, grads):
    return sparse_momentum.add_gradients(v, sparse_momentum.begin_step(state), ids, grads)

  read = jax.jit(sparse_momentum.current_rows)
  for t in range(steps):
    if t % capacity == 0:
      v, state = begin(v, state, jnp.int32(t))
    ids = [4, 5, 5]  # touched every step, one twice
    if t < 3:
      ids += [0, 1]
    if t % 17 == 0:
      ids += [2]
    if t % 500 == 0:
      ids += [3]
    ids += [rows + 7] * (8 - len(ids))  # out of range (padding / another shard): dropped
    ids = np.asarray(ids)
    grads = 0.1 * rng.normal(size=(len(ids), d))
    g = np.zeros((rows, d))
    np.add.at(g, ids[ids < rows], grads[ids < rows])
    m = BETA * m + WD * w + g
    w = w - lrs[t] * m
    v, state = step(v, state, jnp.asarray(ids, jnp.int32), jnp.asarray(grads, jnp.float32))
    if t == 1234:  # what the kernel reads mid-period
      np.testing.assert_allclose(read(v, state, jnp.arange(rows)), w, rtol=1e-5, atol=1e-6)
  w_got, state = sparse_momentum.leave_period(v, state)
  np.testing.assert_allclose(w_got, w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state.velocity, m, rtol=1e-5, atol=1e-6)
  assert int(state.period_step) == 0 and not bool(state.in_period)


def test_a_skipped_step_changes_no_row():
  """A dynamic loss-scale overflow: nothing moves, not even the period's step."""
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)
  state = sparse_momentum.init(5, 2, 4)
  w, state = sparse_momentum.begin_period(w, state, lambda t: 0.5, jnp.int32(0), WD, BETA)
  ids = jnp.array([0, 3])
  state = sparse_momentum.begin_step(state)
  w, state = sparse_momentum.add_gradients(w, state, ids, jnp.ones((2, 2)))
  before = sparse_momentum.leave_period(w, state)
  state = sparse_momentum.begin_step(state, apply=False)
  w, state = sparse_momentum.add_gradients(w, state, ids, jnp.ones((2, 2)), apply=False)
  assert int(state.period_step) == 1
  after = sparse_momentum.leave_period(w, state)
  np.testing.assert_array_equal(after[0], before[0])
  np.testing.assert_array_equal(after[1].velocity, before[1].velocity)


@pytest.mark.parametrize("wd", [0.0, 6e-3])
def test_a_steps_gradient_leaves_the_w_that_step_read(wd):
  """What lets classifier_momentum_step update rows block by block: adding step j's
  gradients changes the rows read at period step j - 1 by float rounding only (in the dense
  step the gradient enters m_j first: (w_{j-1}, m_{j-1}) + (0, g / beta) maps onto it), while
  the rows read at step j move by about lr g."""
  rng = np.random.default_rng(2)
  rows, d = 6, 3
  w = jnp.asarray(rng.normal(size=(rows, d)), jnp.float32)
  state = sparse_momentum.init(rows, d, 40)
  schedule = lambda t: 0.2 + 0.01 * t
  w, state = sparse_momentum.begin_period(w, state, schedule, jnp.int32(0), wd, BETA)
  ids = jnp.arange(rows)
  for _ in range(25):  # the coefficients far from the period's start
    state = sparse_momentum.begin_step(state)
    grads = jnp.asarray(rng.normal(size=(rows, d)), jnp.float32)
    w, state = sparse_momentum.add_gradients(w, state, ids, grads)
  read = state
  before = sparse_momentum.current_rows(w, read, ids)
  begun = sparse_momentum.begin_step(state)
  grads = jnp.asarray(rng.normal(size=(rows, d)), jnp.float32)
  w, begun = sparse_momentum.add_gradients(w, begun, ids, grads)
  after = sparse_momentum.current_rows(w, read._replace(velocity=begun.velocity), ids)
  np.testing.assert_allclose(after, before, rtol=0, atol=1e-5 * float(jnp.abs(before).max()))
  moved = sparse_momentum.current_rows(w, begun, ids) - before
  assert float(jnp.abs(moved).min()) > 1e-3


def test_a_step_past_the_period_poisons_w():
  """The train step's wrapper begins a period in time; a caller that does not gets NaN."""
  w, state = sparse_momentum.begin_period(
    jnp.ones((3, 2)), sparse_momentum.init(3, 2, 2), lambda t: 0.1, jnp.int32(0), WD, BETA
  )
  for _ in range(3):
    state = sparse_momentum.begin_step(state)
    w, state = sparse_momentum.add_gradients(w, state, jnp.array([0]), jnp.ones((1, 2)))
  assert np.isnan(np.asarray(sparse_momentum.current_rows(w, state, jnp.array([1])))).all()


STEPS, RESUME_AT, PERIOD = 54, 27, 10


def _untouched_stretches(batches, num_shards, rng):
  """STEPS batches from tiny_step.problem in which rows 0, 1 of each W shard are not
  touched after step 3 and rows 2, 3 only every 17th step: their ids are moved to the
  shard's free rows, so every hard and random negative stays in its shard's block."""
  rows = -(-L // num_shards)
  out = []
  for t in range(STEPS):
    b = batches[rng.integers(len(batches))]
    moved = {}
    for k in ("pos_ids", "hard_ids", "rand_ids"):
      ids = getattr(b.labels, k)
      offset = ids % rows
      barred = ((offset < 2) & (t > 3)) | ((offset >= 2) & (offset < 4) & (t % 17 != 0))
      moved[k] = np.where(barred, ids - offset + 4 + (ids + t) % (rows - 4), ids)
    out.append(b._replace(labels=b.labels._replace(**moved)))
  return out


def _run(step_fn, state, batches, put, start=0, stop=STEPS):
  for t in range(start, stop):
    state, _, _ = step_fn(state, put(batches[t]), jax.random.key(t))
  return state


# block_bytes 1: each device's queries are scored and applied one at a time, so a row one
# query updated is read by the next (8 blocks on 1 x 1, 2 on 2 x 4 in one micro-batch); with
# dynamic loss scaling all gradients are applied after the kernel (nothing overflows here).
@pytest.mark.parametrize(
  "shape,micro_batches,block_bytes,loss_scaling",
  [
    ((1, 1), 2, None, "off"),
    ((2, 4), 2, None, "off"),
    ((1, 1), 2, 1, "off"),
    ((2, 4), 1, 1, "off"),
    ((2, 4), 2, 1, "dynamic"),
  ],
)
def test_sparse_momentum_step_equals_dense_optax_momentum(
  shape, micro_batches, block_bytes, loss_scaling, tmp_path, monkeypatch
):
  if block_bytes:
    monkeypatch.setattr(classifier, "UPDATE_BLOCK_BYTES", block_bytes)
  graphdef, enc, oc, batches, w0 = problem(
    num_shards=shape[1], micro_batches=micro_batches, per_query=True
  )
  oc.classifier_momentum, oc.classifier_lr, oc.warmup_steps = BETA, 0.3, 5
  oc.classifier_weight_decay = WD
  batches = _untouched_stretches(batches, shape[1], np.random.default_rng(1))
  fresh = lambda: {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w0)}

  # The dense reference: autodiff w.r.t. all of W and optim.py's optax chain.
  tx = optim.make_optimizer(oc, STEPS)
  params = fresh()
  dense_step = steps.make_train_step(graphdef, tx)
  dense = _run(
    dense_step, steps.init_dense_state(tx, params), batches, lambda b: jax.tree.map(jnp.asarray, b)
  ).params

  mesh = sharding.make_mesh(*shape)
  enc_tx = optim.encoder_optimizer(oc, STEPS)

  def sparse_start():
    return steps.shard_state(steps.init_sparse_state(enc_tx, fresh(), momentum_period=PERIOD), mesh)

  step = steps.make_sparse_train_step(
    graphdef,
    enc_tx,
    optim.classifier_schedule(oc, STEPS),
    oc.classifier_weight_decay,
    mesh,
    B,
    loss_scaling=loss_scaling,
    momentum=BETA,
  )
  put = lambda b: sharding.shard_batch(b, mesh)
  state = _run(step, sparse_start(), batches, put, stop=RESUME_AT)
  # The checkpoint is taken inside a period, which the resumed run goes on with.
  assert bool(state.momentum.in_period) and int(state.momentum.period_step) == RESUME_AT % PERIOD
  ck = checkpoint.Checkpoints(str(tmp_path))
  ck.save(RESUME_AT, *steps.saved_layout(state), {"step": RESUME_AT})
  ck.close()
  ck = checkpoint.Checkpoints(str(tmp_path))
  start = sparse_start()
  params, opt_state, _ = ck.restore(*steps.saved_layout(start))
  ck.close()
  state = steps.from_saved(start, params, opt_state, RESUME_AT)
  assert state.momentum.velocity.sharding.spec == jax.sharding.PartitionSpec("model")
  state = _run(step, state, batches, put, start=RESUME_AT)
  w = np.asarray(steps.fold_classifier(state).classifier)
  # Rows barred after step 3 moved on momentum and decay alone, as in the dense step.
  stale = np.arange(0, L, -(-L // shape[1]))
  assert not np.allclose(np.asarray(dense["classifier"])[stale], w0[stale])
  np.testing.assert_allclose(w, dense["classifier"], rtol=1e-5, atol=1e-5)
  # (The encoders are not compared: over 50 steps Adam turns the float noise of ~zero
  # gradients into steps of up to lr on those parameters, see test_sparse_sgd.py; the
  # encoder's path does not depend on the classifier's optimizer.)


def test_momentum_state_resumes_on_a_mesh_with_another_padding(tmp_path):
  """61 rows saved from one device, restored onto 4 W shards of 16 rows: the velocity moves
  with its rows, the padded rows are empty, the period's step and coefficients stay."""
  rng = np.random.default_rng(0)
  rows, d = 61, 3
  state = sparse_momentum.init(rows, d, 8)._replace(
    velocity=jnp.asarray(rng.normal(size=(rows, d)), jnp.float32),
    period_step=jnp.int32(5),
    coefficients=jnp.asarray(rng.normal(size=(10, 6)), jnp.float32),
    in_period=jnp.bool_(True),
  )
  w = jnp.asarray(rng.normal(size=(rows, d)), jnp.float32)
  one = sharding.make_mesh(1, 1)
  params, opt_state = steps.shard_params(
    {"encoder": {"b": jnp.ones(2)}, "classifier": w}, {"momentum": state}, one
  )
  ck = checkpoint.Checkpoints(str(tmp_path))
  ck.save(1, params, opt_state, {"step": 1})
  ck.close()
  mesh = sharding.make_mesh(2, 4)
  padded = sparse_momentum.init(64, d, 8)
  template = steps.shard_params(
    {"encoder": {"b": jnp.ones(2)}, "classifier": jnp.zeros((64, d))}, {"momentum": padded}, mesh
  )
  ck = checkpoint.Checkpoints(str(tmp_path))
  got_params, got_state, _ = ck.restore(*template)
  ck.close()
  got = got_state["momentum"]
  assert got.velocity.sharding.spec == jax.sharding.PartitionSpec("model")
  np.testing.assert_array_equal(got_params["classifier"][:rows], w)
  np.testing.assert_array_equal(got.velocity[:rows], state.velocity)
  np.testing.assert_array_equal(got.velocity[rows:], 0.0)
  np.testing.assert_array_equal(got.coefficients, state.coefficients)
  assert int(got.period_step) == 5 and bool(got.in_period)


@pytest.mark.e2e
def test_training_with_momentum_resumes_mid_epoch_to_the_uninterrupted_result(
  tmp_path, small_synthetic
):
  """The trainer's loop: stopped mid-epoch (rows stale in the saved state), resumed, it
  ends where an uninterrupted run ends; the epoch-end folds catch every row up."""
  c = small_synthetic(strategy="random")
  c.train.epochs, c.optim.classifier_momentum = 2, BETA
  whole = train.train_and_evaluate(c, str(tmp_path / "whole"))
  c.train.stop_after_steps = 30
  with pytest.raises(checkpoint.Preempted):
    train.train_and_evaluate(c, str(tmp_path / "cut"))
  c.train.stop_after_steps = 0
  resumed = train.train_and_evaluate(c, str(tmp_path / "cut"))
  assert resumed["steps"] == whole["steps"] > 30
  assert resumed["metrics"] == whole["metrics"]
  assert whole["P@1"] > whole["popularity_baseline"]["P@1"]
