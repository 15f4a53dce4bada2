import jax
import numpy as np
import pytest

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.training.pipeline import TrainBatches, data_group_bounds, epoch_order


def make(n=50, batch=8, seed=0, **kw):
  tokens = np.arange(n * 3, dtype=np.int32).reshape(n, 3)
  labels = SparseRows.from_lists([[i % 7] for i in range(n)], 7)
  return TrainBatches(tokens, NegativeSampler(labels, 2, 0, 4), batch, seed, prefetch=2, **kw)


def test_epoch_is_a_permutation_and_deterministic():
  b = make()
  assert b.steps_per_epoch == 6  # 50 // 8, the remainder dropped
  rows = [x.rows for x, _ in b.epoch(0)]
  flat = np.concatenate(rows)
  assert len(set(flat)) == 48 and flat.max() < 50
  again = [x for x, _ in make().epoch(0)]
  for x, y in zip(again, b.epoch(0)):
    jax.tree.map(np.testing.assert_array_equal, x, y[0])
  assert not np.array_equal(flat, np.concatenate([x.rows for x, _ in b.epoch(1)]))


def test_one_data_group_keeps_one_permutation_of_all_rows():
  want = np.random.default_rng([3, 2, 0]).permutation(50)[:48]
  np.testing.assert_array_equal(epoch_order(3, 2, 50, 8), want)


def test_each_data_group_draws_its_block_of_every_micro_batch_from_its_own_rows():
  # 2 micro-batches of 3 groups x 2 rows; 50 rows in parts [0, 17), [17, 33), [33, 50).
  bounds = data_group_bounds(50, 3)
  np.testing.assert_array_equal(bounds, [0, 17, 33, 50])
  b = make(batch=12, micro_batches=2, data_groups=3)
  assert b.steps_per_epoch == 16 // 4  # the smallest part, 16 rows, 4 per step
  for epoch in (0, 1):
    order = epoch_order(0, epoch, 50, 12, 2, 3)
    assert len(order) == 4 * 12 and len(set(order)) == len(order)
    blocks = order.reshape(4, 2, 3, 2)  # (step, micro-batch, group, rows)
    for g in range(3):
      assert ((blocks[:, :, g] >= bounds[g]) & (blocks[:, :, g] < bounds[g + 1])).all()
    rows = np.concatenate([x.rows for x, _ in b.epoch(epoch)])
    np.testing.assert_array_equal(rows, order)
    np.testing.assert_array_equal(b.rows_before(epoch, 3), order[:36])
  assert not np.array_equal(epoch_order(0, 0, 50, 12, 2, 3), epoch_order(0, 1, 50, 12, 2, 3))


def test_the_data_groups_blocks_are_where_the_label_sharding_puts_them():
  # epoch_order's layout is the label side's: on a 2 x 2 mesh, the devices of data group g
  # hold block g of each micro-batch's rows.
  from jax.sharding import NamedSharding

  from astra_jax.data.batch import LABEL_AXES
  from astra_jax.parallel import sharding

  mesh = sharding.make_mesh(2, 2, jax.devices()[:4])
  spec = sharding._spec(LABEL_AXES.pos_ids, True)
  where = NamedSharding(mesh, spec).devices_indices_map((3, 8, 5))
  for g in range(2):
    for device in mesh.devices[g]:
      assert where[device][1] == slice(4 * g, 4 * (g + 1))
  assert sharding.local_data_groups(mesh) == [0, 1]  # one process holds both groups


def test_a_process_builds_the_label_side_of_its_data_groups_only():
  # 2 micro-batches of 3 groups x 2 rows, random draws per query: each group's block is the
  # sampler's output for its rows with its own stream (seed, epoch, step, 1, micro-batch,
  # group), whichever groups the process builds; the groups it does not hold are zeros.
  n = 50
  tokens = np.arange(n * 3, dtype=np.int32).reshape(n, 3)
  labels = SparseRows.from_lists([[i % 7, (i + 3) % 7] for i in range(n)], 7)
  sampler = NegativeSampler(labels, 1, 0, 4, per_query_random=True)
  make_b = lambda **kw: TrainBatches(
    tokens, sampler, 12, 5, prefetch=2, micro_batches=2, data_groups=3, **kw
  )
  every, mine = make_b(), make_b(held_groups=[1])
  order = every.order(2)
  x, y = every.make_batch(2, 1, order, None), mine.make_batch(2, 1, order, None)
  rows = x.rows.reshape(2, 3, 2)  # (micro-batch, group, row)
  np.testing.assert_array_equal(x.rows, y.rows)
  for i in range(2):
    for g in range(3):
      want = sampler(rows[i, g], np.random.default_rng([5, 2, 1, 1, i, g]))
      for name in ("pos_ids", "pos_mask", "rand_ids", "rand_mask", "pos_weight"):
        got_all = getattr(x.batch.labels, name)[i, 2 * g : 2 * g + 2]
        got_mine = getattr(y.batch.labels, name)[i, 2 * g : 2 * g + 2]
        np.testing.assert_array_equal(got_all, getattr(want, name), name)
        if g == 1:
          np.testing.assert_array_equal(got_mine, got_all, name)
        else:
          assert not got_mine.any(), name
  # The groups draw apart: no two blocks share their random draws.
  draws = x.batch.labels.rand_ids.reshape(6, -1)
  assert len({tuple(d) for d in draws}) == 6


def test_batch_contents_match_rows():
  for x, prep_s in make().epoch(0):
    assert x.batch.input_ids.shape == (1, 8, 3) and x.batch.labels.rand_ids.shape == (1, 4)
    np.testing.assert_array_equal(x.batch.input_ids[0, :, 0], x.rows * 3)
    np.testing.assert_array_equal(x.batch.labels.pos_ids[0, :, 0], x.rows % 7)
    assert prep_s >= 0


def test_micro_batches_and_process_local_tokens():
  # 4 micro-batches of 2 rows, each with its own draws; this "process" reads tokens of the
  # first row of each micro-batch only.
  local = np.zeros((4, 2), bool)
  local[:, 0] = True
  for x, _ in make(micro_batches=4, token_rows=local).epoch(0):
    assert x.batch.input_ids.shape == (4, 2, 3) and x.batch.labels.rand_ids.shape == (4, 4)
    rows = x.rows.reshape(4, 2)
    np.testing.assert_array_equal(x.batch.labels.pos_ids[..., 0], rows % 7)
    np.testing.assert_array_equal(x.batch.input_ids[:, 0, 0], rows[:, 0] * 3)
    assert (x.batch.input_ids[:, 1] == 0).all()
  assert len({tuple(r) for r in x.batch.labels.rand_ids}) > 1
  with pytest.raises(Exception, match=r"not divisible by config\.train\.grad_accum_steps=3"):
    make(micro_batches=3)


def test_resume_mid_epoch_gives_the_same_batches():
  b = make()
  full = [x for x, _ in b.epoch(2)]
  tail = [x for x, _ in b.epoch(2, start_step=4)]
  for x, y in zip(full[4:], tail):
    np.testing.assert_array_equal(x.batch.labels.rand_ids, y.batch.labels.rand_ids)
    np.testing.assert_array_equal(x.rows, y.rows)


def test_errors_in_the_thread_reach_the_consumer():
  b = make()
  b.tokens = None  # make_batch fails inside the producer thread
  with pytest.raises(TypeError):
    list(b.epoch(0))


def test_early_exit_stops_the_thread():
  b = make(n=400)
  it = b.epoch(0)
  next(it)
  it.close()  # returns at once; queued batches are cancelled and the threads end
  _assert_threads_end("batches-epoch0")


def _assert_threads_end(prefix):
  import threading
  import time

  alive = lambda: [t for t in threading.enumerate() if t.name.startswith(prefix)]
  deadline = time.time() + 30
  while alive() and time.time() < deadline:
    time.sleep(0.05)
  assert not alive()


def test_several_threads_hand_over_the_same_batches_in_order(monkeypatch):
  """Three threads, where early steps take longest (so later ones finish first): the same
  batches, in the same order, as one thread."""
  import time

  one = [x for x, _ in make(n=120).epoch(1)]
  b = make(n=120, threads=3)
  make_batch = b.make_batch

  def slow_first(epoch, step, *a, **kw):
    time.sleep(0.02 * max(0, 3 - step))
    return make_batch(epoch, step, *a, **kw)

  monkeypatch.setattr(b, "make_batch", slow_first)
  many = [x for x, _ in b.epoch(1)]
  assert len(many) == len(one) == 15
  for x, y in zip(one, many):
    jax.tree.map(np.testing.assert_array_equal, x, y)
  it = b.epoch(2)
  next(it)
  it.close()  # with batches still in flight
  _assert_threads_end("batches-epoch2")
