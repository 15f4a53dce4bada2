import numpy as np
import pytest

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.sampler import NegativeSampler


def test_masks_follow_the_positive_and_hard_sets():
  L = 30
  positives = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [11], []]  # row 0 has more than k_p
  labels = SparseRows.from_lists(positives, L)
  sampler = NegativeSampler(labels, k_p=4, k_h=3, k_r=200)
  hard = np.array([[12, 3, -1], [11, 13, 14], [15, 16, 17]])
  b = sampler(np.arange(3), np.random.default_rng(0), hard)
  # Positives: a subset of the row's labels, padded with a mask.
  assert set(b.pos_ids[0][b.pos_mask[0]]) <= set(positives[0])
  assert b.pos_mask[0].sum() == 4
  assert list(b.pos_ids[1][b.pos_mask[1]]) == [11] and b.pos_mask[2].sum() == 0
  # Hard: positives and missing (-1) slots masked out.
  np.testing.assert_array_equal(
    b.hard_mask, [[True, False, False], [False, True, True], [True, True, True]]
  )
  # Random: a draw is masked exactly when it is any positive (even one not among the k_p
  # kept) or a valid hard negative of that row -- checked by brute force.
  for i in range(3):
    excluded = set(positives[i]) | {h for h, m in zip(hard[i], b.hard_mask[i]) if m}
    want = np.array([r not in excluded for r in b.rand_ids])
    np.testing.assert_array_equal(b.rand_mask[i], want)
  assert not b.rand_mask[0].all()  # with 200 draws over 30 labels some hit positives
  np.testing.assert_array_equal(b.rand_weight, np.full(200, L / 200, np.float32))


def test_draws_are_uniform():
  L = 10
  sampler = NegativeSampler(SparseRows.from_lists([[0]], L), k_p=1, k_h=0, k_r=50000)
  b = sampler(np.arange(1), np.random.default_rng(0))
  counts = np.bincount(b.rand_ids, minlength=L)
  # chi-square against uniform, 9 dof: 99.9% quantile is 27.9
  expected = 50000 / L
  assert ((counts - expected) ** 2 / expected).sum() < 27.9


def test_per_shard_draws_cover_each_shard_uniformly():
  # 10 labels over 3 shards of 4 rows: [0, 4), [4, 8), [8, 10).
  L, k_r = 10, 30000
  sampler = NegativeSampler(SparseRows.from_lists([[0]], L), k_p=1, k_h=0, k_r=k_r, num_shards=3)
  b = sampler(np.arange(1), np.random.default_rng(0), np.zeros((1, 0), np.int32))
  for s, (lo, hi) in enumerate([(0, 4), (4, 8), (8, 10)]):
    block = b.rand_ids[s * k_r : (s + 1) * k_r]
    assert block.min() >= lo and block.max() < hi
    counts = np.bincount(block - lo, minlength=hi - lo)
    expected = k_r / (hi - lo)
    assert ((counts - expected) ** 2 / expected).sum() < 16.3  # 99.9% quantile, <= 3 dof
    np.testing.assert_array_equal(
      b.rand_weight[s * k_r : (s + 1) * k_r], np.float32((hi - lo) / k_r)
    )


def test_shard_errors():
  labels = SparseRows.from_lists([[0]], 5)
  with pytest.raises(ValueError, match="cannot fill 4 classifier shards"):
    NegativeSampler(labels, k_p=1, k_h=1, k_r=2, num_shards=4)
  sampler = NegativeSampler(SparseRows.from_lists([[0]], 10), k_p=1, k_h=1, k_r=2, num_shards=2)
  with pytest.raises(ValueError, match="not grouped by classifier shard"):
    sampler(np.arange(1), np.random.default_rng(0), np.array([[7, 2]]))  # block 0 = [0, 5)
  sampler(np.arange(1), np.random.default_rng(0), np.array([[2, -1]]))


def test_shared_member_matches_the_pairwise_lookup():
  """shared_member (the batch's shared random ids) against rowsets.member on the broadcast
  (B, K) array, with repeated shared ids and repeated set entries."""
  from astra_jax.data import rowsets

  rng = np.random.default_rng(3)
  for _ in range(20):
    b, k, n = rng.integers(1, 9), rng.integers(1, 30), rng.integers(0, 60)
    shared = rng.integers(0, 25, k)
    set_rows, set_ids = rng.integers(0, b, n), rng.integers(0, 25, n)
    expected = rowsets.member(np.broadcast_to(shared, (b, k)), set_rows, set_ids)
    np.testing.assert_array_equal(rowsets.shared_member(shared, b, set_rows, set_ids), expected)


def test_rows_with_many_positives_keep_a_uniform_subset():
  """A row with 10 positives and k_p = 3: each draw is 3 distinct of its labels, each label
  kept with probability 3/10 (binomial, 6 standard deviations); a short row keeps all."""
  labels = SparseRows(
    np.array([0, 10, 12]), np.array([*range(10, 20), 3, 4], np.int32), np.ones(12, np.float32), 30
  )
  sampler = NegativeSampler(labels, k_p=3, k_h=0, k_r=5)
  rng = np.random.default_rng(0)
  counts = np.zeros(30)
  n = 3000
  for _ in range(n):
    batch = sampler(np.array([0, 1]), rng)
    first = batch.pos_ids[0][batch.pos_mask[0]]
    assert len(set(first)) == 3 and set(first) <= set(range(10, 20))
    counts[first] += 1
    assert sorted(batch.pos_ids[1][batch.pos_mask[1]]) == [3, 4]
  p = 0.3
  assert np.all(np.abs(counts[10:20] / n - p) < 6 * np.sqrt(p * (1 - p) / n))


@pytest.mark.parametrize("num_shards", [1, 2])
def test_per_query_draws_masks_and_shards(num_shards):
  # Each query draws its own k_r per shard (the paper's Algorithm 1); a draw is masked
  # exactly when it is one of that query's positives or valid hard negatives.
  L, k_r = 30, 40
  positives = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 20], []]
  labels = SparseRows.from_lists(positives, L)
  sampler = NegativeSampler(
    labels, k_p=4, k_h=2, k_r=k_r, num_shards=num_shards, per_query_random=True
  )
  R = L // num_shards
  hard = np.array([[12, 3], [13, 11], [14, -1]])
  hard = np.concatenate([s * R + hard % R for s in range(num_shards)], 1)
  hard[2, 1::2] = -1
  b = sampler(np.arange(3), np.random.default_rng(0), hard)
  assert b.rand_ids.shape == b.rand_mask.shape == (3, num_shards * k_r)
  for s in range(num_shards):
    block = b.rand_ids[:, s * k_r : (s + 1) * k_r]
    assert block.min() >= s * R and block.max() < (s + 1) * R
  np.testing.assert_array_equal(b.rand_weight, np.full(num_shards * k_r, R / k_r, np.float32))
  for i in range(3):
    excluded = set(positives[i]) | {h for h, m in zip(hard[i], b.hard_mask[i]) if m}
    want = np.array([r not in excluded for r in b.rand_ids[i]])
    np.testing.assert_array_equal(b.rand_mask[i], want)
  assert not b.rand_mask[0].all()
  # Queries draw independently: rows differ.
  assert (b.rand_ids[0] != b.rand_ids[1]).any()


@pytest.mark.parametrize("mode", ["table", "chunks", "filter", "filter_reuse"])
def test_member_matches_brute_force(monkeypatch, mode):
  """The (row, id) table in one chunk and in chunks of 1-3 rows; the id filter, also with
  one thread's table reused by 30 calls of different shapes (each must leave it all-False)."""
  from astra_jax.data import rowsets

  monkeypatch.setattr(rowsets, "_CHUNK_BYTES", {"table": 1 << 21, "chunks": 40}.get(mode, 0))
  monkeypatch.setattr(rowsets, "_TABLE_PER_ID", 1 << 20)
  reuse = mode == "filter_reuse"
  rng = np.random.default_rng(4)
  for _ in range(30):
    b, k, n, width = (
      rng.integers(1, 9),
      rng.integers(1, 30),
      rng.integers(0, 60),
      rng.integers(1, 40),
    )
    ids = rng.integers(-1, width, (b, k))
    set_rows, set_ids = rng.integers(0, b + 2, n), rng.integers(0, width, n)  # rows >= b: never
    pairs = set(zip(set_rows.tolist(), set_ids.tolist()))
    expected = np.array(
      [[v >= 0 and (i, v) in pairs for v in row] for i, row in enumerate(ids.tolist())], bool
    ).reshape(b, k)
    np.testing.assert_array_equal(rowsets.member(ids, set_rows, set_ids, reuse), expected)


def test_rows_of_lists_each_rows_labels_in_order():
  """(position, label) pairs against the rows' lists, with empty and repeated rows."""
  from astra_jax.data import rowsets

  lists = [[3, 1], [], [7], [0, 2, 4, 6], []]
  labels = SparseRows.from_lists(lists, 8)
  for rows in ([0, 1, 2, 3, 4], [3, 3, 1, 0], [1, 4], []):
    which, ids = rowsets.rows_of(labels, np.array(rows, np.int64))
    want = [(i, l) for i, r in enumerate(rows) for l in lists[r]]
    assert list(zip(which.tolist(), ids.tolist())) == want


@pytest.mark.parametrize("per_query", [False, True])
def test_random_columns_past_num_random_are_masked(per_query):
  # The curricula's batches keep one width: of 10 columns per shard, 6 train, with the
  # weight of 6 draws (shard rows / 6); the other 4 are masked for every query.
  L, S = 30, 2
  labels = SparseRows.from_lists([[0, 1], [16], []], L)
  sampler = NegativeSampler(labels, k_p=2, k_h=2, k_r=8, num_shards=S, per_query_random=per_query)
  b = sampler(np.arange(3), np.random.default_rng(0), num_random=6, random_columns=10)
  assert b.rand_mask.shape == (3, S * 10)
  assert b.rand_ids.shape == ((3, S * 10) if per_query else (S * 10,))
  np.testing.assert_array_equal(b.rand_weight, np.full(S * 10, 15 / 6, np.float32))
  used = np.tile(np.arange(10) < 6, S)
  assert not b.rand_mask[:, ~used].any()
  ids = np.broadcast_to(b.rand_ids, (3, S * 10))
  positives = [{0, 1}, {16}, set()]
  for i in range(3):  # the used columns: masked exactly on the query's positives
    want = np.array([r not in positives[i] for r in ids[i]])
    np.testing.assert_array_equal(b.rand_mask[i, used], want[used])
  with pytest.raises(ValueError, match="random_columns=4 < num_random=6"):
    sampler(np.arange(3), np.random.default_rng(0), num_random=6, random_columns=4)


def test_hard_columns_past_num_hard_are_masked():
  # 3 mined columns per shard of which 2 train: the third is no negative (and does not
  # exclude random draws), in both shards.
  L, S = 12, 2
  labels = SparseRows.from_lists([[0], [7]], L)
  sampler = NegativeSampler(labels, k_p=1, k_h=2, k_r=4, num_shards=S, per_query_random=True)
  hard = np.array([[1, 2, 3, 7, 8, 9], [0, 4, 5, 7, 11, 6]])  # row 1: 7 is a positive
  b = sampler(np.arange(2), np.random.default_rng(0), hard, num_hard=2)
  np.testing.assert_array_equal(b.hard_mask, [[1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 1, 0]])
  for i in range(2):  # 3 and 9 / 5 and 6 may be drawn as random negatives
    excluded = {0} | {1, 2, 7, 8} if i == 0 else {7} | {0, 4, 11}
    want = np.array([r not in excluded for r in b.rand_ids[i]])
    np.testing.assert_array_equal(b.rand_mask[i], want)


def test_positive_weight_is_positives_over_k_p_when_some_are_left_out():
  # |P| = 5, 2, 0 with k_p = 2: weights 5/2, 1 (all kept), 1 (no positives).
  labels = SparseRows.from_lists([[0, 1, 2, 3, 4], [5, 6], []], 10)
  b = NegativeSampler(labels, k_p=2, k_h=0, k_r=3)(np.arange(3), np.random.default_rng(0))
  np.testing.assert_array_equal(b.pos_weight, np.array([2.5, 1.0, 1.0], np.float32))
  assert b.pos_weight.dtype == np.float32 and b.pos_mask.sum(1).tolist() == [2, 2, 0]
