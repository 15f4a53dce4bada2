"""Hard-negative mining, the Algorithm-1 schedule and the refresh worker."""

import os
import signal
import time

import numpy as np
import pytest

from astra_jax.ann import exact_topk, grouped_index, index as index_lib, scann_files
from astra_jax.ann.index import IndexKnobs
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives import mining
from astra_jax.negatives.refresh import (
  InProcessRefresh,
  RefreshFailed,
  RefreshJob,
  RefreshWorker,
  load_labels,
  run_job,
  save_labels,
)
from astra_jax.negatives.schedule import NegativeSchedule, NegativeSplit
from astra_jax.negatives.strategies import IndexOver, get as strategy

EXACT = IndexKnobs(kind="exact")


def clustered(n_rows, d=32, n_clusters=200, seed=0):
  """Label vectors in groups around shared centres, like trained classifier rows of
  confusable labels."""
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(n_clusters, d))
  rows = centres[rng.integers(0, n_clusters, n_rows)] + 0.5 * rng.normal(size=(n_rows, d))
  return rows.astype(np.float32), rng


def test_exact_index_is_brute_force():
  w, rng = clustered(500)
  q = rng.normal(size=(40, 32)).astype(np.float32)
  got = index_lib.ExactIndex(w, query_block=16).search(q, 7)
  np.testing.assert_array_equal(got, np.argsort(-(q @ w.T), axis=1, kind="stable")[:, :7])


@pytest.mark.parametrize("backend", ["exact", "scann"])
def test_mined_negatives_never_contain_positives(backend):
  w, rng = clustered(3000)
  q = rng.normal(size=(300, 32)).astype(np.float32)
  exact_top = index_lib.ExactIndex(w).search(q, 40)
  # Positives: many of each query's own top labels (the hard case for filling k), plus
  # some random ones; one row with none.
  rows = [
    sorted(set(exact_top[i, : rng.integers(0, 30)]) | set(rng.integers(0, 3000, 3)))
    for i in range(300)
  ]
  rows[0] = []
  labels = SparseRows.from_lists(rows, 3000)
  k = 10
  idx = mining.build_index(w, k, backend)
  neg = mining.mine(idx, q, labels, k, 3000)
  assert neg.shape == (300, k) and neg.dtype == np.int32
  assert (neg >= 0).all()  # always filled: extra candidates are retrieved as needed
  for i in range(300):
    assert not set(neg[i]) & set(rows[i])
    assert len(set(neg[i])) == k
  if backend == "exact":  # exactly the top-k non-positives
    for i in range(300):
      want = [l for l in np.argsort(-(q[i] @ w.T), kind="stable") if l not in set(rows[i])][:k]
      np.testing.assert_array_equal(neg[i], want)


def test_scann_slots_it_cannot_fill_are_empty_not_label_zero():
  # 2 of 200 leaves searched hold fewer rows than k: ScaNN pads with id 0 (NaN score),
  # which must not become k copies of the shard's first label.
  w, rng = clustered(3000, d=16)
  q = rng.normal(size=(20, 16)).astype(np.float32)
  offset = 3000  # the index holds shard 1's rows, labels [3000, 6000)
  labels = SparseRows.from_lists([[offset + int(rng.integers(3000))] for _ in range(20)], 6000)
  idx = mining.build_index(w, 32, "scann", {"num_leaves": 200, "leaves_to_search": 2})
  neg = mining.mine(idx, q, labels, 32, 3000, offset=offset)
  assert (neg < 0).any()  # the case this test is about happened
  for row in neg:
    ids = row[row >= 0]
    assert len(set(ids)) == len(ids) and ((ids >= offset) & (ids < 2 * offset)).all()


def test_scann_padding_survives_strict_promotion(monkeypatch):
  # ScaNN returns uint32 ids; numpy >= 2.5 raises when np.where meets a Python -1 and a uint32
  # array (found on a GPU host's numpy 2.5). Emulate that rule on this host's numpy.
  real_where = np.where

  def strict_where(cond, *values):
    if any(isinstance(v, int) and v < 0 for v in values) and any(
      isinstance(v, np.ndarray) and v.dtype.kind == "u" for v in values
    ):
      raise OverflowError("Python integer -1 out of bounds for uint32")
    return real_where(cond, *values)

  monkeypatch.setattr(index_lib.np, "where", strict_where)
  w, rng = clustered(3000, d=16)
  idx = mining.build_index(w, 32, "scann", {"num_leaves": 200, "leaves_to_search": 1})
  ids = idx.search(rng.normal(size=(20, 16)).astype(np.float32), 32)
  assert ids.dtype == np.int32 and (ids < 0).any() and (ids < 3000).all()


def test_scann_recall_with_default_knobs():
  w, rng = clustered(100_000, d=64, n_clusters=2000)
  # Queries near label vectors, as trained query embeddings are near their positives' rows.
  q = (w[rng.integers(0, len(w), 500)] + 0.3 * rng.normal(size=(500, 64))).astype(np.float32)
  idx = mining.build_index(w, 50, "scann")
  assert isinstance(idx, index_lib.ScannIndex)
  exact = index_lib.ExactIndex(w).search(q, 50)
  assert mining.overlap_at_k(idx.search(q, 50), exact) >= 0.9


def test_scann_search_rescoring_every_row_of_every_leaf_is_exact():
  # With every leaf searched and every candidate re-scored exactly, nothing is left to the
  # partition or the AH codes: the top k is exact search's (distinct random scores, no ties).
  rng = np.random.default_rng(5)
  w = rng.normal(size=(2000, 16)).astype(np.float32)
  q = rng.normal(size=(50, 16)).astype(np.float32)
  params = index_lib.scann_defaults(2000, 10, num_leaves=20, leaves_to_search=2, reorder=10)
  idx = index_lib.ScannIndex(w, 10, params)
  exact = index_lib.ExactIndex(w).search(q, 10)
  np.testing.assert_array_equal(idx.search(q, 10, leaves_to_search=20, reorder=2000), exact)
  # The build's own knobs (2 of 20 leaves) miss some of it.
  assert mining.overlap_at_k(idx.search(q, 10), exact) < 1.0


def test_coarse_groups_find_separated_clusters():
  # Three clusters at least 100 apart with unit noise: k-means++ seeds one centre in each
  # (a second seed in a seeded cluster has odds ~1e-4) and Lloyd's steps keep them there.
  # Distances between clusters differ by 100 or more, so each row's second group is clear.
  rng = np.random.default_rng(0)
  centres = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 300.0]], np.float32)
  truth = np.repeat(np.arange(3), [50, 70, 30])
  rows = (centres[truth] + rng.normal(size=(150, 2))).astype(np.float32)
  near = grouped_index.coarse_groups(rows, 3, spill=2, block=16)
  group = near[:, 0]
  # the same partition up to the groups' names, and the same names on a second call
  for c in range(3):
    assert len(np.unique(group[truth == c])) == 1
  assert len(np.unique(group)) == 3
  np.testing.assert_array_equal(near, grouped_index.coarse_groups(rows, 3, spill=2))
  # each row's second group is another cluster's, the nearer of the two other centres
  assert (near[:, 1] != near[:, 0]).all()
  second = {c: group[truth == c][0] for c in range(3)}
  d = ((rows[:, None] - centres[None]) ** 2).sum(-1)
  d[np.arange(150), truth] = np.inf
  np.testing.assert_array_equal(near[:, 1], [second[c] for c in np.argmin(d, 1)])


def _nearest_centre(rows: np.ndarray, centres: np.ndarray) -> np.ndarray:
  """Each row's nearest centre by squared L2, as ScaNN assigns rows to plain leaves."""
  return np.argmin(((rows[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)


def test_leaf_centres_are_the_centres_scann_opens_leaves_by():
  # Plain leaves (no AVQ, no SOAR): ScaNN puts each row in the leaf of its nearest centre
  # (squared L2) and opens a query's leaves by inner product with the centres. So with one
  # leaf searched and every candidate kept, the ids found are exactly the rows whose nearest
  # centre is the query's best-scoring one, computed here from leaf_centres alone.
  rng = np.random.default_rng(1)
  w = rng.normal(size=(3000, 8)).astype(np.float32)
  q = rng.normal(size=(20, 8)).astype(np.float32)
  params = index_lib.scann_defaults(3000, 10, num_leaves=12, leaves_to_search=1, reorder=3000)
  idx = index_lib.ScannIndex(w, 10, params)
  centres = idx.leaf_centres()
  assert centres.shape == (12, 8)
  home = _nearest_centre(w, centres)
  for query in q:
    found = idx.search(query[None], 3000, leaves_to_search=1, reorder=3000)[0]
    leaf = np.argmax(centres @ query)
    np.testing.assert_array_equal(np.sort(found[found >= 0]), np.flatnonzero(home == leaf))


def test_assign_leaves_follows_its_definition():
  # Row by row, by hand: the nearest centre (squared L2), and SOAR's second the centre c != c1
  # minimising |x - c|^2 + lambda ((x - c) . r / |r|)^2 with r = x - c1.
  rng = np.random.default_rng(5)
  rows = rng.normal(size=(200, 6)).astype(np.float32)
  centres = rng.normal(size=(9, 6)).astype(np.float32)
  got = grouped_index.assign_leaves(rows, centres, soar_lambda=1.5)
  plain = grouped_index.assign_leaves(rows, centres, soar_lambda=None)
  for i, x in enumerate(rows.astype(np.float64)):
    dist = [((x - c) ** 2).sum() for c in centres.astype(np.float64)]
    first = int(np.argmin(dist))
    r = x - centres[first]
    loss = [
      np.inf if j == first else dist[j] + 1.5 * ((x - c) @ r / np.linalg.norm(r)) ** 2
      for j, c in enumerate(centres.astype(np.float64))
    ]
    assert (got[i, 0], got[i, 1], plain[i, 0]) == (first, int(np.argmin(loss)), first)
  # SOAR's second is not simply the second-nearest centre
  nearest2 = np.argsort(((rows[:, None] - centres[None]) ** 2).sum(-1), 1)[:, 1]
  assert (got[:, 1] != nearest2).any()
  # one centre: no second leaf
  assert (grouped_index.assign_leaves(rows, centres[:1], 1.5)[:, 1] == -1).all()


def test_scann_token_file_is_scanns_layout():
  # ScaNN's own layout: a row's two leaves interleaved, the smaller first, -1 last.
  tokens = np.array([[3, 1], [0, 2], [5, -1]], np.int32)
  np.testing.assert_array_equal(scann_files.token_file(tokens), [1, 3, 0, 2, 5, -1])
  np.testing.assert_array_equal(scann_files.token_file(tokens[:, :1]), [3, 0, 5])


@pytest.mark.parametrize("soar", [None, 1.5])
def test_grouped_scann_index_is_one_index_over_its_groups_leaves(soar):
  # The partition ScaNN is given: each row in its nearest leaf (and SOAR's second) among the
  # leaves of its two nearest groups; a query finds exactly the rows of its m best leaves by
  # inner product with the centres; opening every leaf with a full re-ranking is exact.
  rng = np.random.default_rng(3)
  w = rng.normal(size=(3000, 8)).astype(np.float32)
  q = rng.normal(size=(15, 8)).astype(np.float32)
  params = index_lib.scann_defaults(
    3000, 10, num_leaves=30, leaves_to_search=5, reorder=3000, group_rows=1000, soar_lambda=soar
  )
  idx = grouped_index.GroupedScannIndex(w, 10, params)
  assert len(idx.partition.first_leaf) == 4 and abs(idx.num_leaves - 30) <= 3
  np.testing.assert_array_equal(idx.leaf_centres(), idx.partition.centres)  # read back from ScaNN
  near = grouped_index.coarse_groups(w, 3, spill=2)
  part = idx.partition
  for i in range(0, 3000, 7):
    leaves = np.concatenate(
      [np.arange(part.first_leaf[g], part.first_leaf[g + 1]) for g in sorted(near[i])]
    )
    want = grouped_index.assign_leaves(w[i : i + 1], part.centres[leaves], soar)[0]
    np.testing.assert_array_equal(part.row_leaves[i], leaves[want])
  for query in q:
    found = idx.search(query[None], 3000, leaves_to_search=5, reorder=3000)[0]
    best = np.argsort(-(idx.partition.centres @ query))[:5]
    want = np.flatnonzero(np.isin(idx.partition.row_leaves, best).any(1))
    np.testing.assert_array_equal(np.sort(found[found >= 0]), want)
  exact = index_lib.ExactIndex(w).search(q, 10)
  np.testing.assert_array_equal(idx.search(q, 10, idx.num_leaves, 6000), exact)
  assert mining.overlap_at_k(idx.search(q, 10), exact) < 1.0  # 5 of ~30 leaves miss some


def test_build_index_groups_only_when_asked():
  w = np.random.default_rng(4).normal(size=(3000, 8)).astype(np.float32)
  knobs = {"num_leaves": 12, "leaves_to_search": 2}
  assert isinstance(mining.build_index(w, 5, "scann", knobs), index_lib.ScannIndex)
  grouped = mining.build_index(w, 5, "scann", {**knobs, "group_rows": 1500})
  assert isinstance(grouped, grouped_index.GroupedScannIndex)
  assert len(grouped.partition.first_leaf) == 3  # two groups
  # a group as large as the rows is one index
  assert index_lib.scann_defaults(3000, 5, group_rows=3000).group_rows == 0


def test_scann_defaults_scale_with_labels():
  small, big = index_lib.scann_defaults(10_000, 50), index_lib.scann_defaults(10_000_000, 50)
  assert small.num_leaves < big.num_leaves and small.num_leaves_to_search <= small.num_leaves
  assert big.reorder >= 200 and index_lib.scann_defaults(10_000, 50, num_leaves=7).num_leaves == 7


@pytest.mark.parametrize(
  "tau_s, tau_r, epochs, refreshes, sources",
  [
    # Algorithm 1: random before tau_s; a refresh at every epoch t >= tau_s with
    # t mod tau_r = 0 (and at tau_s, whose hard negatives Algorithm 1 uses), whose negatives
    # are used until the next refresh.
    (5, 5, 16, [5, 10, 15], [None] * 5 + [5] * 5 + [10] * 5 + [15]),
    (5, 10, 31, [5, 10, 20, 30], [None] * 5 + [5] * 5 + [10] * 10 + [20] * 10 + [30]),
    (10, 20, 61, [10, 20, 40, 60], [None] * 10 + [10] * 10 + [20] * 20 + [40] * 20 + [60]),
    (2, 3, 9, [2, 3, 6], [None, None, 2, 3, 3, 3, 6, 6, 6]),
    (0, 1, 3, [0, 1, 2], [0, 1, 2]),
    (4, 10, 6, [4], [None] * 4 + [4, 4]),
  ],
)
def test_schedule_follows_algorithm_1(tau_s, tau_r, epochs, refreshes, sources):
  s = NegativeSchedule(
    strategy("random+w_hard"), k_h=5, k_r=20, tau_s=tau_s, tau_r=tau_r, epochs=epochs
  )
  assert s.refresh_epochs == refreshes
  assert [s.source(e) for e in range(epochs)] == sources
  for e in range(epochs):
    assert s.split(e, have_hard=s.source(e) is not None) == (
      (5, 20) if s.source(e) is not None else (0, 25)
    )
  # Embeddings for the refresh of epoch r are collected during epoch r - 2.
  for r in refreshes:
    assert s.collect_epoch(r) == (r - 2 if r >= 2 else None)
    if r >= 2:
      assert s.refresh_collected_in(r - 2) == r


def test_strategies_keep_the_number_of_negatives():
  for name in (
    "random",
    "random+w_hard",
    "random+e_hard",
    "w_hard",
    "e_hard",
    "curriculum",
    "curriculum+e_hard",
    "uptodate",
  ):
    s = NegativeSchedule(strategy(name), k_h=10, k_r=40, tau_s=2, tau_r=2, epochs=8)
    for e in range(8):
      h, r = s.split(e, have_hard=True)
      assert h + r == 50 and h <= max(s.mined_k(), 10)
  assert NegativeSchedule(strategy("w_hard"), 10, 40, 2, 2, 8).split(3, True) == (50, 0)
  # The curriculum's hard share: 10/50 at tau_s = 2, 0.5 x 50 at the last epoch (7).
  for name, over in (
    ("curriculum", IndexOver.CLASSIFIER),
    ("curriculum+e_hard", IndexOver.LABEL_TEXT),
  ):
    c = NegativeSchedule(strategy(name), 10, 40, 2, 2, 8)
    assert [c.split(e, True)[0] for e in range(8)] == [0, 0, 10, 13, 16, 19, 22, 25]
    assert c.index_over == over and c.mined_k() == 25
    # ... while its batches keep one shape from tau_s on: 25 hard + 40 random columns.
    assert [c.columns(e, True) for e in range(8)] == [(0, 50)] * 2 + [(25, 40)] * 6
    assert c.columns(3, False) == (0, 50)
  assert NegativeSchedule(strategy("random+w_hard"), 10, 40, 2, 2, 8).columns(3, True) == (10, 40)
  assert NegativeSchedule(strategy("random"), 10, 40, 2, 2, 8).refresh_epochs == []
  assert NegativeSchedule(strategy("e_hard"), 10, 40, 2, 2, 8).index_over is IndexOver.LABEL_TEXT


def _job_inputs(tmp_path, epoch=3, k=8, backend="exact", fault=""):
  w, rng = clustered(2000)
  q = rng.normal(size=(500, 32)).astype(np.float32)
  labels = SparseRows.from_lists(
    [list(rng.choice(2000, 3, replace=False)) for _ in range(500)], 2000
  )
  np.save(tmp_path / "w.npy", w)
  np.save(tmp_path / "q.npy", q)
  save_labels(str(tmp_path / "labels.json"), labels)
  return RefreshJob(
    epoch,
    str(tmp_path / "w.npy"),
    str(tmp_path / "q.npy"),
    str(tmp_path / "labels.json"),
    str(tmp_path / f"out{epoch}.npy"),
    str(tmp_path / f"stats{epoch}.json"),
    k,
    backend,
    fault=fault,
  )


@pytest.mark.parametrize("backend", ["exact", "scann"])
def test_worker_gives_the_same_negatives_as_a_synchronous_refresh(tmp_path, backend):
  job = _job_inputs(tmp_path, backend=backend)
  worker = RefreshWorker()
  worker.start(job, str(tmp_path / "job.json"))
  stats = worker.wait()
  pipelined = np.load(job.out_path)
  sync_job = RefreshJob(
    **{
      **job.__dict__,
      "out_path": str(tmp_path / "sync.npy"),
      "stats_path": str(tmp_path / "sync.json"),
    }
  )
  run_job(sync_job)
  np.testing.assert_array_equal(pipelined, np.load(sync_job.out_path))
  assert stats["epoch"] == 3 and stats["build_s"] >= 0 and 0 <= stats["recall"] <= 1


@pytest.mark.parametrize(
  "fault, message", [("raise", "exit code 1"), ("kill", "killed by signal 9")]
)
def test_failing_worker_is_reported_and_writes_nothing(tmp_path, fault, message):
  job = _job_inputs(tmp_path, fault=fault)
  worker = RefreshWorker()
  worker.start(job, str(tmp_path / "job.json"))
  with pytest.raises(RefreshFailed, match=message):
    worker.wait()
  assert not os.path.exists(job.out_path)
  assert not [f for f in os.listdir(tmp_path) if f.startswith("out")]


def test_one_index_per_shard_equals_brute_force_per_shard(tmp_path):
  # Shards [0, 700) and [700, 2000) of W, plus a process that holds only the second one
  # (its vectors file has those rows alone).
  job = _job_inputs(tmp_path)
  w = np.load(job.vectors_path)
  q = np.load(job.queries_path)
  labels = load_labels(job.labels_path)
  job.shards = [[0, 700], [700, 2000]]
  run_job(job)
  got = np.load(job.out_path)
  assert got.shape == (500, 16)
  for s, (lo, hi) in enumerate(job.shards):
    scores = q @ w[lo:hi].T
    for i in range(0, 500, 37):
      pos = set(labels.indices[labels.indptr[i] : labels.indptr[i + 1]])
      ranked = [lo + l for l in np.argsort(-scores[i], kind="stable") if lo + l not in pos][:8]
      assert set(got[i, 8 * s : 8 * (s + 1)]) == set(ranked)
  np.save(tmp_path / "w1.npy", w[700:])
  local = RefreshJob(
    **{
      **job.__dict__,
      "vectors_path": str(tmp_path / "w1.npy"),
      "shards": [[700, 2000]],
      "out_path": str(tmp_path / "local.npy"),
    }
  )
  run_job(local)
  np.testing.assert_array_equal(np.load(local.out_path), got[:, 8:])
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # nothing half written


def _ten_queries() -> SparseRows:
  """10 training rows of 2 positives each over 12 labels (row i: labels 2i, 2i+1 mod 12)."""
  return SparseRows(
    np.arange(0, 21, 2, dtype=np.int64),
    np.arange(20, dtype=np.int32) % 12,
    np.ones(20, np.float32),
    12,
  )


def test_a_block_of_query_rows_is_mined_as_in_the_full_refresh(tmp_path):
  # A process whose data groups train on rows [123, 377) mines those rows alone (its
  # positives read at their own row numbers), for the one W shard it holds.
  job = _job_inputs(tmp_path)
  w = np.load(job.vectors_path)
  job.shards = [[0, 700], [700, 2000]]
  run_job(job)
  full = np.load(job.out_path)
  np.save(tmp_path / "w1.npy", w[700:])
  block = RefreshJob(
    **{
      **job.__dict__,
      "vectors_path": str(tmp_path / "w1.npy"),
      "shards": [[700, 2000]],
      "out_path": str(tmp_path / "block.npy"),
      "stats_path": str(tmp_path / "block.json"),
      "query_rows": [123, 377],
    }
  )
  stats = run_job(block)
  np.testing.assert_array_equal(np.load(block.out_path), full[123:377, 8:])
  assert stats["num_queries"] == 254 and stats["query_rows"] == [123, 377]


def test_a_process_holds_the_negatives_of_its_query_rows_and_shards(tmp_path):
  """One process of a 2 x 2 mesh (data group 1: rows [5, 10); W shard 1) mines and serves
  exactly the full manager's negatives there and -1 elsewhere; a checkpointed file mined
  for all rows serves its rows, one mined for other rows does not."""
  from astra_jax.negatives.manager import HardNegatives

  labels = _ten_queries()
  schedule = NegativeSchedule(strategy("random+w_hard"), k_h=2, k_r=4, tau_s=0, tau_r=1, epochs=2)
  rng = np.random.default_rng(0)
  w, q = rng.normal(size=(12, 4)), rng.normal(size=(10, 4))
  embed = lambda rows: q[rows]
  shards = [[0, 6], [6, 12]]
  full = HardNegatives(
    schedule, str(tmp_path / "full"), labels, 4, EXACT, shards=shards, num_shards=2
  )
  want = np.asarray(full.start_epoch(0, lambda: w, embed)[0][np.arange(10)])  # (10, 2, 2)

  def process(workdir, query_rows):
    return HardNegatives(
      schedule,
      str(workdir),
      labels,
      4,
      EXACT,
      shards=[[6, 12]],
      shard_ids=[1],
      num_shards=2,
      query_rows=query_rows,
    )

  one = process(tmp_path / "one", (5, 10))
  hard = np.asarray(one.start_epoch(0, lambda: w[6:], embed)[0][np.arange(10)])
  np.testing.assert_array_equal(hard[5:, 1], want[5:, 1])
  assert (hard[:5] == -1).all() and (hard[:, 0] == -1).all()
  assert np.load(one.current_path).shape == (5, 2)  # its rows only
  assert one.refreshes[-1]["query_rows"] == [5, 10]

  # A checkpoint of a run that mined every row (one process): its file serves rows [5, 10).
  np.save(os.path.join(one.dir, "hard_epoch0.npy"), np.load(full.current_path)[:, 2:])
  state = {**one.state_dict(), "query_rows": [0, 10]}
  one.load_state(state)
  np.testing.assert_array_equal(
    np.asarray(one.start_epoch(1, None, None, np.arange(0))[0][np.arange(10)])[5:, 1],
    want[5:, 1],
  )
  other = process(tmp_path / "one", (0, 5))
  other.load_state({**state, "query_rows": [5, 10]})
  assert other.current is None  # mined for rows it does not train on


def test_checkpointed_negatives_follow_the_workdir_and_the_shard_count(tmp_path):
  """A checkpoint's hard negatives are found by file name in the (moved) workdir, and ones
  mined for another number of W shards are not used (their blocks are per old shard)."""
  from astra_jax.negatives.manager import HardNegatives

  labels = _ten_queries()
  schedule = NegativeSchedule(strategy("random+w_hard"), k_h=2, k_r=4, tau_s=1, tau_r=1, epochs=4)

  def manager(workdir, shards):
    bounds = [[s * 12 // shards, (s + 1) * 12 // shards] for s in range(shards)]
    return HardNegatives(
      schedule,
      str(workdir),
      labels,
      dim=4,
      index=EXACT,
      shards=bounds,
      num_shards=shards,
    )

  a = manager(tmp_path / "a", 2)
  mined = np.tile(np.array([[0, 1, 6, 7]], np.int32), (10, 1))
  np.save(os.path.join(a.dir, "hard_epoch1.npy"), mined)
  a._commit(1, np.load(os.path.join(a.dir, "hard_epoch1.npy")))
  state = a.state_dict()
  assert state["current_path"] == "hard_epoch1.npy" and state["num_shards"] == 2
  os.rename(tmp_path / "a", tmp_path / "moved")
  b = manager(tmp_path / "moved", 2)
  b.load_state(state)
  np.testing.assert_array_equal(b.current, mined)
  assert b.current_path == os.path.join(str(tmp_path / "moved"), "negatives", "hard_epoch1.npy")
  c = manager(tmp_path / "moved", 1)
  c.load_state(state)
  assert c.current is None and c.current_epoch is None
  assert c.schedule.split(2, c.current is not None) == (0, 6)  # random until a refresh


def _tiny_refresh(tmp_path, tau_r: int, epochs: int):
  """A refresh manager over 10 queries (2 positives each) and 12 label rows, exact search:
  (a factory of managers on one workdir, W's rows, the queries' embeddings)."""
  from astra_jax.negatives.manager import HardNegatives

  labels = _ten_queries()
  schedule = NegativeSchedule(
    strategy("random+w_hard"), k_h=2, k_r=4, tau_s=2, tau_r=tau_r, epochs=epochs
  )
  rng = np.random.default_rng(0)
  w, q = rng.normal(size=(12, 4)), rng.normal(size=(10, 4))
  make = lambda: HardNegatives(schedule, str(tmp_path), labels, dim=4, index=EXACT)
  return make, (lambda: w), (lambda rows: q[rows])


def test_at_most_the_negatives_in_use_and_the_ones_being_mined_are_on_disk(tmp_path):
  """Refreshes at epochs 2, 3 and 4 (each collected in the epoch before): after every swap
  only the file in use is left; while a worker mines, that file and its output. A
  checkpoint taken before a swap names the replaced file: it resumes by mining again."""
  from astra_jax.negatives.refresh import RefreshFailed

  make, vectors, embed = _tiny_refresh(tmp_path, tau_r=1, epochs=5)
  m = make()
  hard_files = lambda: sorted(f for f in os.listdir(m.dir) if f.startswith("hard_"))

  def check(epoch):  # the file in use, and the output of a running (or finished) worker
    assert len(m.pending) <= 1
    allowed = [f"hard_epoch{r}.npy" for r in m.pending]
    if m.current_path is not None:
      allowed.append(os.path.basename(m.current_path))
    assert set(hard_files()) <= set(allowed) and len(hard_files()) <= 2, (epoch, hard_files())

  saved = {}
  for epoch in range(5):
    saved[epoch] = m.state_dict()  # the checkpoint at (epoch, 0), taken before the swap
    m.start_epoch(epoch, vectors, embed)
    check(epoch)
    m.end_epoch(epoch, vectors, embed)
    for worker in m.pending.values():
      worker.proc.wait()
    check(epoch)
  assert [x["epoch"] for x in m.refreshes] == [2, 3, 4] and all(x["ok"] for x in m.refreshes)
  mined_4 = np.array(m.current)
  # The checkpoint at (4, 0) names hard_epoch3.npy, deleted at the swap: the refresh for
  # epoch 4 runs again from its inputs and gives the same negatives.
  assert saved[4]["current_path"] == "hard_epoch3.npy" and saved[4]["pending"] == [4]
  b = make()
  b.load_state(saved[4], resumes_at=(4, 0))
  assert b.current is None
  b.start_epoch(4, vectors, embed)
  np.testing.assert_array_equal(b.current, mined_4)
  # Inside an epoch the negatives are needed as they are: their loss is an error.
  with pytest.raises(RefreshFailed, match=r"hard_epoch3\.npy: the checkpoint's hard negatives"):
    b.load_state(saved[4], resumes_at=(3, 5))
  b.close()


def test_a_killed_workers_temporary_output_is_removed(tmp_path):
  """A worker killed mid-mining (SIGKILL, out of memory) cannot remove its N x k temporary
  file; the manager does once that refresh is over."""
  make, vectors, embed = _tiny_refresh(tmp_path, tau_r=2, epochs=3)
  m = make()
  m.start_epoch(0, vectors, embed)
  m.end_epoch(0, vectors, embed)  # collected in epoch 0: the refresh for epoch 2 starts
  leftover = os.path.join(m.dir, "hard_epoch2.npy.tmp-12345.npy")  # a killed worker's
  np.save(leftover, np.zeros((10, 2), np.int32))
  m.start_epoch(1, vectors, embed)
  m.start_epoch(2, vectors, embed)
  assert m.refreshes[-1]["ok"]
  m.finish()
  assert not [f for f in os.listdir(m.dir) if ".tmp-" in f]


def test_curriculum_epochs_keep_the_mined_columns_and_say_how_many_train(tmp_path):
  """A curriculum's batches keep all mined columns per shard; the split says how many of
  them (and of the random columns) train: the sampler masks the rest."""
  from astra_jax.negatives.manager import HardNegatives

  labels = _ten_queries()
  # T = 6, mined 3 per shard; hard 2/6 of T at tau_s = 1 rising to 3 (half) at epoch 3.
  schedule = NegativeSchedule(strategy("curriculum"), k_h=2, k_r=4, tau_s=1, tau_r=10, epochs=4)
  m = HardNegatives(
    schedule,
    str(tmp_path),
    labels,
    dim=4,
    index=EXACT,
    shards=[[0, 6], [6, 12]],
    num_shards=2,
  )
  mined = np.tile(np.array([[0, 1, 2, 6, 7, 8]], np.int32), (10, 1))
  m._commit(1, mined)
  for epoch, h, r in ((2, 2, 4), (3, 3, 3)):
    hard, split = m.start_epoch(epoch, None, None)
    assert split == NegativeSplit(num_hard=h, num_random=r, random_columns=4)
    np.testing.assert_array_equal(np.asarray(hard[np.arange(4)]).reshape(4, 6), mined[:4])


def test_exact_index_tiles_equal_one_argsort():
  # Row blocks far smaller than L (and than k's multiple) must give the one-block answer:
  # the running top-k merge keeps the best k and orders ties by id.
  w, rng = clustered(2000, d=16)
  w[1000:1010] = w[5]  # exact ties across blocks
  q = rng.normal(size=(30, 16)).astype(np.float32)
  want = np.argsort(-(q @ w.T), axis=1, kind="stable")[:, :25]
  for tile_floats in (1 << 25, 7 * 40, 1):  # one block; 40-row blocks; k-row blocks
    got = index_lib.ExactIndex(w, query_block=7, tile_floats=tile_floats).search(q, 25)
    np.testing.assert_array_equal(got, want)


def test_fixed_cost_knobs_keep_rows_per_query_flat():
  # The fixed-cost rule: rows a query scores stay at the budget from 1e6 to 1e8 rows,
  # leaves grow with L at ~1000 rows each; the default rule scores a third of L.
  for L in (10**6, 10**7, 10**8):
    p = index_lib.scann_defaults(L, 50, rows_per_query=64_000, soar_lambda=1.5)
    assert 64_000 <= index_lib.rows_scored_per_query(L, p) < 64_000 + 2 * L / p.num_leaves
    assert L / p.num_leaves <= 1000
    # The centres see as many rows per leaf at every L (all of W once it has fewer).
    per_leaf = index_lib.TRAINING_ROWS_PER_LEAF
    assert p.training_sample_size == min(L, max(250_000, per_leaf * p.num_leaves))
  old = index_lib.scann_defaults(10**7, 50)
  assert index_lib.rows_scored_per_query(10**7, old) >= 10**7 // 3 - 10**7 // old.num_leaves
  # An explicit leaf size: L / leaf_rows leaves under either rule, below the 2 sqrt(L) floor
  # too (2,000 leaves at 10^6); an explicit count wins.
  fixed_cost = index_lib.scann_defaults(10**6, 50, rows_per_query=64_000, leaf_rows=2000)
  assert fixed_cost.num_leaves == 500
  assert index_lib.scann_defaults(10**6, 50, leaf_rows=4000).num_leaves == 250
  assert index_lib.scann_defaults(10**6, 50, num_leaves=7, leaf_rows=4000).num_leaves == 7
  # Shrinking leaves: 2,000 x (10^6 / L)^0.5 rows, by hand: 2,000 at 10^6 (500 leaves),
  # 1,000 at 4 x 10^6 (4,000 leaves), round(632.46) = 632 at 10^7 (10^7 // 632 = 15,822).
  for L, leaves in ((10**6, 500), (4 * 10**6, 4000), (10**7, 15_822)):
    p = index_lib.scann_defaults(L, 32, rows_per_query=256_000, leaf_rows=2000, leaf_shrink=0.5)
    assert p.num_leaves == leaves


def test_step_embeddings_are_collected_one_step_late_and_all_by_the_epochs_end(tmp_path):
  """collect_step takes each step's device embeddings; on one process a step's arrive with
  the next one (the copy overlaps it), flush() stores the one in flight (a checkpoint's
  memmap holds every step so far), and rows no step saw are embedded at the epoch's end."""
  import jax.numpy as jnp

  make, vectors, embed = _tiny_refresh(tmp_path, tau_r=2, epochs=3)
  m = make()
  m.start_epoch(0, vectors, embed)  # epoch 0 collects for the refresh of epoch 2
  assert m.collecting
  pooled = np.arange(40, dtype=np.float32).reshape(10, 4) + 100.0  # not what embed gives
  m.collect_step(np.arange(0, 4), jnp.asarray(pooled[0:4]))
  assert not m.filled.any()
  m.collect_step(np.arange(4, 8), jnp.asarray(pooled[4:8]))
  assert m.filled[:4].all() and not m.filled[4:].any()
  m.flush()
  assert m.filled[:8].all() and not m.filled[8:].any()
  m.end_epoch(0, vectors, embed)
  queries = np.load(os.path.join(m.dir, "queries_epoch2.npy"))
  np.testing.assert_array_equal(queries[:8], pooled[:8])
  np.testing.assert_array_equal(queries[8:], embed(np.arange(8, 10)).astype(np.float32))
  m.close()


def test_a_refresh_worker_survives_the_jobs_sigterm_from_its_first_instant(tmp_path):
  # Sent at once after the fork, before the worker's own code runs: the mask it inherits
  # keeps the signal pending until it is ignored. Its thread pools follow job.threads.
  job = _job_inputs(tmp_path, backend="scann")
  job.threads = 2
  worker = RefreshWorker()
  worker.start(job, str(tmp_path / "job.json"))
  os.kill(worker.proc.pid, signal.SIGTERM)
  os.kill(worker.proc.pid, signal.SIGINT)
  proc = f"/proc/{worker.proc.pid}"
  for _ in range(200):  # until the child has exec'd the worker (its environment before is ours)
    with open(f"{proc}/cmdline", "rb") as f:
      if b"astra_jax.negatives.refresh" in f.read():
        break
    time.sleep(0.01)
  with open(f"{proc}/environ", "rb") as f:
    environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
  assert environ[b"OPENBLAS_NUM_THREADS"] == environ[b"OMP_NUM_THREADS"] == b"2"
  stats = worker.wait()
  assert stats["epoch"] == job.epoch
  reference = RefreshJob(
    **{
      **job.__dict__,
      "out_path": str(tmp_path / "sync.npy"),
      "stats_path": str(tmp_path / "sync.json"),
    }
  )
  run_job(reference)
  np.testing.assert_array_equal(np.load(job.out_path), np.load(reference.out_path))


def test_refresh_worker_offers_itself_to_the_oom_killer_first():
  import subprocess
  import sys

  r = subprocess.run(
    [
      sys.executable,
      "-c",
      "from astra_jax.negatives import refresh\n"
      "assert refresh.prefer_as_oom_victim()\n"
      "print(open('/proc/self/oom_score_adj').read().strip())",
    ],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert r.returncode == 0, r.stderr[-1000:]
  assert r.stdout.strip() == "1000"


def test_overlap_at_k_by_hand():
  found = np.array([[1, 2, 3], [4, -1, -1], [7, 8, 9]])
  truth = np.array([[3, 2, 9], [4, 5, -1], [-1, -1, -1]])
  # 2 of 3, 1 of the 2 true ones (empty slots ignored), and a row with no truth counts as 1.
  assert mining.overlap_at_k(found, truth) == pytest.approx((2 / 3 + 1 / 2 + 1) / 3)


def test_row_subset_keeps_the_rows_in_the_order_asked():
  from astra_jax.data import sparse_rows
  from astra_jax.data.sparse_rows import WithLabelRows

  labels = SparseRows.from_lists([[1, 2], [3], [], [4, 5, 6]], 7)
  sub = sparse_rows.row_subset(labels, np.array([3, 0, 2]))
  assert [sub.row(i).tolist() for i in range(3)] == [[4, 5, 6], [1, 2], []]
  assert sub.num_cols == 7
  # Rows past the training rows of a WithLabelRows are the labels' own rows (label j: [j]).
  both = sparse_rows.row_subset(WithLabelRows(labels), np.array([5, 1]))
  assert [both.row(i).tolist() for i in range(2)] == [[1], [3]]


@pytest.mark.parametrize(
  "knobs",
  [{}, {"avq": 1.0, "soar_lambda": 1.5}, {"avq": 1.0, "soar_lambda": 1.5, "group_rows": 500}],
)
def test_negatives_recall_is_the_mined_negatives_against_brute_force(tmp_path, knobs):
  # The refresh reports two recalls on its sample: the index's top k against exact search,
  # and the k negatives it mined (positives removed) against the k an exact refresh mines.
  # The second is computed here by brute force, independent of mining.mine.
  job = _job_inputs(tmp_path, backend="scann")
  job = RefreshJob(
    **{
      **job.__dict__,
      "recall_sample": 500,
      "scann_knobs": {"num_leaves": 40, "leaves_to_search": 3, **knobs},
    }
  )
  stats = run_job(job)
  mined = np.load(job.out_path)
  w, q, labels = np.load(job.vectors_path), np.load(job.queries_path), load_labels(job.labels_path)
  scores = q @ w.T
  shares = []
  for i in range(len(q)):
    order = [j for j in np.argsort(-scores[i], kind="stable") if j not in set(labels.row(i))]
    shares.append(len(set(order[: job.k]) & set(mined[i])) / job.k)
  assert stats["negatives_recall"] == pytest.approx(np.mean(shares), abs=1e-4)
  # Run here, synchronously: the peak it reports is this process's, up to now. Linux raises
  # its high-water mark lazily (pages freed by madvise before the mark caught up with them
  # lower what a later read reports), so the earlier read may exceed a later one slightly.
  import resource

  later = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  assert 0 < stats["peak_rss_bytes"] <= 1.1 * later
  # 3 of 40 leaves (of ~80 in the grouped build: its rows are in two groups each)
  assert 0.2 < stats["negatives_recall"] < 1.0
  exact = run_job(
    RefreshJob(**{**job.__dict__, "backend": "exact", "out_path": str(tmp_path / "e.npy")})
  )
  assert exact["negatives_recall"] == exact["recall"] == 1.0


def test_the_exact_sample_mines_past_more_positives_than_it_searched_for():
  # k = 2 caps the first search at k + 4k = 10 rows; the second query's 12 positives are its
  # 12 best rows, so its negatives must come from a second, deeper search.
  from astra_jax.negatives.refresh import _exact_sample

  rng = np.random.default_rng(0)
  rows = rng.normal(size=(300, 8)).astype(np.float32)
  q = rng.normal(size=(2, 8)).astype(np.float32)
  order = np.argsort(-(q @ rows.T), axis=1)
  # The rows are a W shard of global labels 1000..1299: positives are global label ids.
  positives = SparseRows.from_lists(
    [[int(order[0, 1]) + 1000], (order[1, :12] + 1000).tolist()], 1300
  )
  top, negatives = _exact_sample(rows, q, positives, 2, offset=1000)
  np.testing.assert_array_equal(top, order[:, :2])
  np.testing.assert_array_equal(negatives[0], [order[0, 0] + 1000, order[0, 2] + 1000])
  np.testing.assert_array_equal(negatives[1], order[1, 12:14] + 1000)


def test_device_index_is_exact_with_ties_broken_by_lower_id():
  rng = np.random.default_rng(0)
  rows = rng.integers(-2, 3, size=(3000, 4)).astype(np.float32)  # many equal scores
  queries = rng.integers(-2, 3, size=(70, 4)).astype(np.float32)
  got = exact_topk.DeviceIndex(rows, query_block=32, label_block=1024).search(queries, 9)
  scores = queries @ rows.T
  for i in range(len(queries)):
    want = np.lexsort((np.arange(len(rows)), -scores[i]))[:9]  # score down, then id up
    np.testing.assert_array_equal(got[i], want)


def test_device_refresh_mines_what_the_host_exact_refresh_mines(tmp_path):
  job = _job_inputs(tmp_path, backend="exact")
  job.shards = [[0, 700], [700, 2000]]
  run_job(job)
  device = RefreshJob(
    **{**job.__dict__, "backend": "device", "out_path": str(tmp_path / "device.npy")}
  )
  refresh = InProcessRefresh()
  refresh.start(device, str(tmp_path / "device_job.json"))
  assert refresh.busy and not os.path.exists(device.out_path)  # it runs at the wait
  stats = refresh.wait()
  np.testing.assert_array_equal(np.load(device.out_path), np.load(job.out_path))
  assert stats["recall"] == 1.0 and stats["in_process"] and not refresh.busy


def test_a_synchronous_refresh_embeds_its_queries_a_block_at_a_time(tmp_path, monkeypatch):
  """With nothing pipelined (tau_s = 0) the queries are embedded EMBED_BLOCK_ROWS rows at a
  time into the refresh's file (not all at once in RAM): every row, in order."""
  from astra_jax.negatives import manager as manager_lib, mining

  monkeypatch.setattr(mining, "EMBED_BLOCK_ROWS", 3)
  labels = _ten_queries()
  schedule = NegativeSchedule(strategy("random+w_hard"), k_h=2, k_r=4, tau_s=0, tau_r=1, epochs=2)
  rng = np.random.default_rng(0)
  w, q = rng.normal(size=(12, 4)), rng.normal(size=(10, 4)).astype(np.float32)
  asked = []

  def embed(rows):
    asked.append(len(rows))
    return q[rows]

  hard = manager_lib.HardNegatives(schedule, str(tmp_path), labels, 4, EXACT)
  hard.start_epoch(0, lambda: w, embed)
  assert asked == [3, 3, 3, 1]
  np.testing.assert_array_equal(np.load(hard._paths(0).queries), q)
