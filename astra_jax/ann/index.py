"""Maximum-inner-product search over label vectors, and mining of hard negatives with it.

Two backends with one interface, `search(queries, k) -> (N, k) ids` (best first):
  * `ExactIndex`: blocked numpy matmul + partial sort; exact, O(N L d), for small L and tests.
  * `ScannIndex`: ScaNN (pybind API, no TensorFlow): a k-means tree + anisotropic
    quantisation + exact re-ranking. Knob defaults are scaled to L by `scann_defaults`.
No jax here: this module also runs inside the refresh worker process.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile

import numpy as np

from astra_jax.data import rowsets
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.runtime import tmpnames


class ExactIndex:
  """Brute-force top-k by inner product, in (query block x row block) tiles.

  The tiles bound memory by `tile_floats` whatever L is: a refresh's recall check searches
  1,000 queries against a shard of ~10^7 rows at SS-20M's size, which as one score array
  would take 38 GB. Each row block's top-k is merged into a running top-k."""

  def __init__(self, rows: np.ndarray, query_block: int = 4096, tile_floats: int = 1 << 25):
    self.rows = np.ascontiguousarray(rows, np.float32)
    self.query_block = query_block
    self.tile_floats = tile_floats

  def search(self, queries: np.ndarray, k: int) -> np.ndarray:
    L = len(self.rows)
    k = min(k, L)
    out = np.empty((len(queries), k), np.int32)
    row_block = max(k, self.tile_floats // max(1, min(self.query_block, len(queries))))
    for s in range(0, len(queries), self.query_block):
      q = np.asarray(queries[s : s + self.query_block], np.float32)
      best_ids = np.empty((len(q), 0), np.int64)
      best_scores = np.empty((len(q), 0), np.float32)
      for r in range(0, L, row_block):
        scores = q @ self.rows[r : r + row_block].T
        kk = min(k, scores.shape[1])
        top = (
          np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
          if kk < scores.shape[1]
          else np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        )
        ids = np.concatenate([best_ids, top + r], axis=1)
        cand = np.concatenate([best_scores, np.take_along_axis(scores, top, 1)], axis=1)
        order = np.lexsort((ids, -cand), axis=1)[:, :k]  # best first; ties: lower id first
        best_ids = np.take_along_axis(ids, order, 1)
        best_scores = np.take_along_axis(cand, order, 1)
      out[s : s + len(q)] = best_ids
    return out


@dataclasses.dataclass(frozen=True)
class ScannParams:
  num_leaves: int
  num_leaves_to_search: int
  reorder: int
  training_sample_size: int
  # Partitioner options for maximum inner product (None: off): anisotropic centres (AVQ)
  # and SOAR spilling (each row also in a second, orthogonality-amplified leaf).
  avq: float | None = None
  soar_lambda: float | None = None
  # > 0: the rows are split into (rows // group_rows) groups by a coarse k-means and each
  # group gets its own ScaNN index, its share of num_leaves; a query's leaves are still
  # the num_leaves_to_search best of all groups' leaf centres (GroupedScannIndex).
  group_rows: int = 0


LEAF_ROWS = 1000  # rows per leaf under the fixed-cost rule, once L is large
# Rows the leaf centres are trained on, per leaf, under the fixed-cost rule. On a trained W
# of 10^6 rows in 500 leaves (AVQ + SOAR; recall@32 at 32k / 128k rows per query): 50 per
# leaf 0.65 / 0.90, 250 0.78 / 0.95, 500 0.80 / 0.95, all 2,000 0.80 / 0.95. The earlier
# rule's floor of 250,000 rows gave 500 per leaf at 10^6 rows but 50 at 10^7, where the
# centres (and the leaves that follow them) were the noisier part of the growth in rows a
# query must score (docs/results/full_labels_knobs.md). The k-means then costs about
# 500 x iterations / leaf_rows times the assignment of the L rows to leaves, which any
# build pays: the same order in L.
TRAINING_ROWS_PER_LEAF = 500
# The rows at which leaf_shrink leaves leaf_rows as it is (scann_defaults).
LEAF_SHRINK_ROWS = 1_000_000


def scann_defaults(
  num_rows: int,
  k: int,
  num_leaves: int = 0,
  leaves_to_search: int = 0,
  reorder: int = 0,
  rows_per_query: int = 0,
  leaf_rows: int = 0,
  avq: float | None = None,
  soar_lambda: float | None = None,
  group_rows: int = 0,
  leaf_shrink: float = 0.0,
) -> ScannParams:
  """ScaNN knobs for mining k neighbours from `num_rows` rows (zeros: scaled to L).

  Two rules for the leaves:
  * rows_per_query = 0 (the default): ~2 sqrt(L) leaves, a third of them (at least 64)
    searched. Measured recall@k: benchmarks/refresh.py (L=1e5, groups of 8 confusable rows,
    k=50) 0.68 searching 1/10 of the leaves and re-ranking 200, 0.83 with 1/5 and 500, 0.92
    with 1/3 and 1000; the demo's trained W (L=2000, k=16, 89 leaves) 0.73 searching 32
    leaves, 0.94 searching 64. Hard negatives are near-ties: breadth matters. But a query
    then scores L/3 rows, and a refresh costs O(N L): ~10^15 row scores at SS-20M.
  * rows_per_query = R > 0, a fixed cost per query: ~2 sqrt(L) leaves while that leaves at
    most LEAF_ROWS rows in each, then L / LEAF_ROWS (their number grows with L, not their
    size; leaf_rows sets the size instead), as many leaves searched as hold R rows (SOAR's
    second copies counted), and the leaf centres trained on TRAINING_ROWS_PER_LEAF rows per
    leaf. Recall then holds as L grows only where a query's near-ties live in a
    neighbourhood whose size does not grow with L: benchmarks/refresh_knobs.py measures it.
  20 k candidates (at least 1,000) are re-ranked exactly either way (64,000 instead of 1,000
  changed no recall@32 measured on trained W of 10^6 and 10^7 rows: the loss is the leaves
  not searched).
  Recall at a fixed R falls as L grows at one leaf size (~3.2 times the rows at 10 times L
  on the full-label stand-in); leaves that shrink as L grows (leaf_shrink) hold it, and a
  build in groups (group_rows) keeps their build from growing as L^2 / leaf_rows.

  Args:
    num_rows: rows in the index (one W shard).
    k: neighbours wanted per query.
    num_leaves, leaves_to_search, reorder: explicit knobs (config.negatives.scann_*).
    rows_per_query: the fixed-cost rule's budget (config.negatives.scann_rows_per_query).
    leaf_rows: > 0, exactly num_rows / leaf_rows leaves (unless num_leaves is given), under
      either rule: a leaf size that holds for every shard of W, whatever their number
      (config.negatives.scann_leaf_rows).
    leaf_shrink: > 0, leaves of leaf_rows x (LEAF_SHRINK_ROWS / num_rows)^leaf_shrink rows
      instead (leaf_rows at 10^6 rows, smaller above; config.negatives.scann_leaf_shrink).
    avq, soar_lambda: partitioner options for inner products (None: off), as the serving
      index uses them (serve_index.serving_params).
    group_rows: > 0, build the leaves group by group (GroupedScannIndex), groups of about
      this many rows (config.negatives.scann_group_rows); 0, one index.
  Returns:
    The ScannParams to build with.
  """
  sqrt_rule = max(2 * math.sqrt(num_rows), 16)
  if leaf_rows and leaf_shrink:
    leaf_rows = max(1, round(leaf_rows * (LEAF_SHRINK_ROWS / num_rows) ** leaf_shrink))
  if leaf_rows and not num_leaves:
    leaves = num_rows // leaf_rows
  elif rows_per_query:
    leaves = num_leaves or int(min(max(sqrt_rule, num_rows / LEAF_ROWS), 200_000))
  else:
    leaves = num_leaves or int(min(sqrt_rule, 20000))
  leaves = max(1, min(leaves, num_rows))
  if leaves_to_search:
    search = leaves_to_search
  elif rows_per_query:
    search = math.ceil(rows_per_query / (num_rows / leaves * (2 if soar_lambda else 1)))
  else:
    search = max(min(leaves, 64), leaves // 3)
  if rows_per_query:
    sample = max(250_000, TRAINING_ROWS_PER_LEAF * leaves)
  else:
    # k-means on ~50 rows per leaf, capped: with ~2 sqrt(L) leaves the build must not grow
    # as L^2 (the fixed-cost rule's own cost is L^2 / leaf_rows whatever the sample).
    sample = max(250_000, min(50 * leaves, 1_000_000))
  return ScannParams(
    leaves,
    max(1, min(search, leaves)),
    reorder or max(20 * k, 1000),
    min(num_rows, sample),
    avq=avq,
    soar_lambda=soar_lambda,
    group_rows=group_rows if 0 < group_rows < num_rows else 0,
  )


def rows_scored_per_query(num_rows: int, params: ScannParams) -> int:
  """Rows a query scores in the searched leaves (SOAR's second copies counted); the leaves'
  centres, `params.num_leaves` of them, are scored too."""
  per_leaf = num_rows / params.num_leaves * (2 if params.soar_lambda else 1)
  return round(params.num_leaves_to_search * per_leaf)


class ScannIndex:
  def __init__(self, rows: np.ndarray, k: int, params: ScannParams, threads: int = 0):
    """threads > 0: the build's and search_batched_parallel's thread count (ScaNN's own
    default is every core of the machine, not the task's share: cpu_budget.py)."""
    import scann  # imported lazily: heavy, and only needed on the host that mines

    self.params = params
    rows = np.ascontiguousarray(rows, np.float32)
    builder = scann.scann_ops_pybind.builder(rows, k, "dot_product")
    if threads > 0:
      builder.set_n_training_threads(threads)
    self.searcher = (
      builder.tree(
        num_leaves=params.num_leaves,
        num_leaves_to_search=params.num_leaves_to_search,
        training_sample_size=params.training_sample_size,
        random_init=False,  # deterministic: same inputs, same negatives
        avq=params.avq,
        soar_lambda=params.soar_lambda,
        overretrieve_factor=2.0 if params.soar_lambda else None,
      )
      .score_ah(2, anisotropic_quantization_threshold=0.2)
      .reorder(params.reorder)
      .build()
    )
    if threads > 0:
      self.searcher.set_num_threads(threads)

  def search(
    self,
    queries: np.ndarray,
    k: int,
    leaves_to_search: int | None = None,
    reorder: int | None = None,
  ) -> np.ndarray:
    """(n, k) ids, -1 where the searched leaves held fewer than k rows (ScaNN pads those
    slots with id 0 and a NaN score: not k copies of label 0). leaves_to_search, reorder:
    instead of the build's (benchmarks search one build with several)."""
    return self.search_scored(queries, k, leaves_to_search, reorder)[0]

  def search_scored(
    self,
    queries: np.ndarray,
    k: int,
    leaves_to_search: int | None = None,
    reorder: int | None = None,
  ) -> tuple[np.ndarray, np.ndarray]:
    """`search`'s ids (int32, -1 for an empty slot) and their scores (float32, the exact
    inner products after re-ranking; -inf for an empty slot)."""
    ids, scores = self.searcher.search_batched_parallel(
      np.ascontiguousarray(queries, np.float32),
      final_num_neighbors=k,
      pre_reorder_num_neighbors=max(reorder or self.params.reorder, k),
      leaves_to_search=leaves_to_search or self.params.num_leaves_to_search,
    )
    # ScaNN returns uint32 ids: cast before -1 meets them (numpy >= 2.5 raises on a -1 that
    # would have to become a uint32).
    empty = np.isnan(scores)
    return (
      np.where(empty, -1, ids.astype(np.int32)),
      np.where(empty, -np.inf, scores).astype(np.float32),
    )

  def leaf_centres(self) -> np.ndarray:
    """(num_leaves, d) float32: the centres a query's leaves are ranked by, row i leaf i.

    Read from ScaNN's serialized partitioner (its Python API has no accessor); the
    serialization also writes the index's data, so this costs one write of it."""
    from scann.partitioning import partitioner_pb2

    tmp = tempfile.mkdtemp(prefix="scann-centres-")
    try:
      self.searcher.serialize(tmp, relative_path=True)
      partitioner = partitioner_pb2.SerializedPartitioner()
      with open(os.path.join(tmp, "serialized_partitioner.pb"), "rb") as f:
        partitioner.ParseFromString(f.read())
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    root = partitioner.kmeans.kmeans_tree.root
    order = [child.leaf_id for child in root.children]
    if order != list(range(len(order))):
      raise RuntimeError(f"ScaNN's leaves are not numbered in order: {order[:10]}...")
    return np.asarray([c.dimension for c in root.centers], np.float32)

  def save(self, path: str) -> None:
    """ScaNN's own serialization into the directory `path`, with asset paths relative to
    it so that the directory can be renamed into place afterwards."""
    os.makedirs(path, exist_ok=True)
    self.searcher.serialize(path, relative_path=True)

  @classmethod
  def load(cls, path: str, params: ScannParams) -> ScannIndex:
    """An index `save` wrote; `params` are the knobs it was built with."""
    import scann

    index = cls.__new__(cls)
    index.params = params
    index.searcher = scann.scann_ops_pybind.load_searcher(path, assets_backcompat_shim=False)
    return index


# The coarse k-means that splits rows into groups: centres trained on this many rows per
# group, for this many Lloyd iterations after k-means++ seeding, all with a fixed seed (the
# same rows give the same groups, and so the same negatives).
GROUP_TRAINING_ROWS = 256
GROUP_KMEANS_ITERATIONS = 10
# Groups each row is put in (its nearest centres). With one, a row's natural neighbours
# across a group's border land in leaves of another group, trained without them: on 500,000
# trained W rows in leaves of 500 (plain k-means), recall@32 at 64,000 rows per query read
# 0.82 for one flat index, 0.80 / 0.76 / 0.71 built in 2 / 6 / 25 groups, and 0.84 in 6
# groups with each row in two (twice the leaves and index, the same rows per leaf).
GROUP_SPILL = 2


def coarse_groups(
  rows: np.ndarray, num_groups: int, spill: int = 1, block: int = 1 << 18
) -> np.ndarray:
  """Each row's `spill` nearest centres of a k-means with `num_groups` (squared L2).

  Args:
    rows: (L, d) float32 rows (a memmap is read block by block).
    num_groups: centres, at most L.
    spill: groups per row (at most num_groups).
    block: rows assigned per matmul (bounds the (block, num_groups) score array).
  Returns:
    (L, spill) int32 group ids, nearest first."""
  rng = np.random.default_rng(0)
  sample = np.sort(rng.choice(len(rows), min(len(rows), GROUP_TRAINING_ROWS * num_groups), False))
  train = np.asarray(rows[sample], np.float32)
  # k-means++ seeding (each next centre drawn in proportion to its squared distance from
  # the nearest one so far): Lloyd's iterations from uniformly drawn rows can leave two
  # centres in one cluster and one across two.
  centres = np.empty((num_groups, train.shape[1]), np.float32)
  centres[0] = train[rng.integers(len(train))]
  nearest_sq = ((train - centres[0]) ** 2).sum(1, dtype=np.float64)
  for g in range(1, num_groups):
    total = nearest_sq.sum()
    pick = rng.choice(len(train), p=nearest_sq / total) if total > 0 else rng.integers(len(train))
    centres[g] = train[pick]
    nearest_sq = np.minimum(nearest_sq, ((train - centres[g]) ** 2).sum(1, dtype=np.float64))

  def closeness(x: np.ndarray) -> np.ndarray:
    # argmin |x - c|^2 = argmax (x . c - |c|^2 / 2)
    return x @ centres.T - 0.5 * (centres * centres).sum(1)

  for _ in range(GROUP_KMEANS_ITERATIONS):
    owner = np.argmax(closeness(train), axis=1)
    sums = np.zeros_like(centres, np.float64)
    np.add.at(sums, owner, train)
    counts = np.bincount(owner, minlength=num_groups)
    held = counts > 0  # a centre that lost all its rows stays where it was
    centres[held] = (sums[held] / counts[held, None]).astype(np.float32)
  spill = min(spill, num_groups)
  out = np.empty((len(rows), spill), np.int32)
  for s in range(0, len(rows), block):
    score = closeness(np.asarray(rows[s : s + block], np.float32))
    near = np.argpartition(-score, spill - 1, axis=1)[:, :spill] if spill < num_groups else None
    if near is None:
      near = np.broadcast_to(np.arange(num_groups), score.shape)
    order = np.argsort(-np.take_along_axis(score, near, 1), axis=1, kind="stable")
    out[s : s + block] = np.take_along_axis(near, order, 1)
  return out


class GroupedScannIndex:
  """A ScaNN index built group by group, searched as one.

  A flat index's build seeds its leaf centres by k-means++ over their training sample and
  assigns every row to a leaf, leaves x rows work each: with leaves of a fixed size,
  O(L^2) (49 minutes for 20,000 leaves of 500 rows at 10^7 rows on 2 cores). Here a coarse
  k-means splits the rows into groups of about `params.group_rows` rows, each row in its
  GROUP_SPILL nearest groups, and each group gets its own ScaNN index with its share of the
  leaves (leaves of the same size), so the build is O(L x group_rows / leaf rows). A query
  scores every group's leaf centres (one matmul), takes the num_leaves_to_search best
  across groups, and searches each group with as many leaves as it holds of those; the
  groups' candidates are merged by their exact scores, a row found in two groups once."""

  def __init__(
    self,
    rows: np.ndarray,
    k: int,
    params: ScannParams,
    threads: int = 0,
    spill: int = GROUP_SPILL,
    progress=None,
  ):
    """spill: groups per row (GROUP_SPILL); progress: called with (groups built, groups)
    after each group (None: silent)."""
    self.params = params
    num_rows = len(rows)
    num_groups = max(1, num_rows // params.group_rows)
    group = coarse_groups(rows, num_groups, spill)
    row_of = np.repeat(np.arange(num_rows), group.shape[1])
    order = np.argsort(group.ravel(), kind="stable")
    bounds = np.searchsorted(group.ravel()[order], np.arange(num_groups + 1))
    # Leaves of the same size as one flat index of num_leaves would have.
    rows_per_leaf = num_rows / params.num_leaves
    sample_share = params.training_sample_size / num_rows
    self.members: list[np.ndarray] = []
    self.indexes: list[ScannIndex] = []
    centres, leaf_group = [], []
    for g in range(num_groups):
      members = row_of[order[bounds[g] : bounds[g + 1]]]
      if not len(members):
        continue
      group_params = dataclasses.replace(
        params,
        num_leaves=max(1, min(len(members), round(len(members) / rows_per_leaf))),
        training_sample_size=max(1, min(len(members), round(len(members) * sample_share))),
        group_rows=0,
      )
      index = ScannIndex(np.asarray(rows[members], np.float32), k, group_params, threads)
      centres.append(index.leaf_centres())
      leaf_group.append(np.full(len(centres[-1]), len(self.indexes), np.int32))
      self.members.append(members.astype(np.int64))
      self.indexes.append(index)
      if progress is not None:
        progress(g + 1, num_groups)
    self.centres = np.concatenate(centres)
    self.leaf_group = np.concatenate(leaf_group)

  @property
  def num_leaves(self) -> int:
    return len(self.centres)

  def search(
    self,
    queries: np.ndarray,
    k: int,
    leaves_to_search: int | None = None,
    reorder: int | None = None,
    query_block: int = 1024,
  ) -> np.ndarray:
    """As ScannIndex.search: (n, k) ids into the rows, best first, -1 for an empty slot.
    leaves_to_search counts leaves across all groups. query_block: queries whose leaf
    centre scores are ranked at once (the scores and their partitioned copy, 8 bytes per
    query and centre: 0.26 GB for 1,024 queries and 31,642 centres)."""
    queries = np.ascontiguousarray(queries, np.float32)
    n, groups = len(queries), len(self.indexes)
    m = min(leaves_to_search or self.params.num_leaves_to_search, self.num_leaves)
    # Leaves each query opens in each group: its m best leaf centres across all groups.
    opened = np.zeros((n, groups), np.int32)
    for s in range(0, n, query_block):
      block = queries[s : s + query_block]
      if m >= self.num_leaves:
        opened[s : s + len(block)] = np.bincount(self.leaf_group, minlength=groups)
        continue
      scores = block @ self.centres.T
      # Each query's m-th best score by a partition of the values, then the leaves at or
      # above it: 2.6 times faster than argpartition's indices at 1,024 x 31,642 (0.10
      # against 0.26 s), and no (block, K) int64 array. A tie at the m-th score (float
      # scores of distinct centres; not seen) would open one leaf more.
      kth = self.num_leaves - m
      threshold = np.partition(scores, kth, axis=1)[:, kth]
      query, leaf = np.nonzero(scores >= threshold[:, None])
      del scores
      counts = np.bincount(query * groups + self.leaf_group[leaf], minlength=len(block) * groups)
      opened[s : s + len(block)] = counts.reshape(len(block), groups)
    best_ids = np.full((n, k), -1, np.int64)
    best_scores = np.full((n, k), -np.inf, np.float32)
    budget = reorder or self.params.reorder
    for g, index in enumerate(self.indexes):
      for leaves in np.unique(opened[:, g]):
        if leaves == 0:
          continue
        rows = np.flatnonzero(opened[:, g] == leaves)
        # Each group re-ranks its share of the budget, in proportion to the leaves the
        # query opens in it: at 10^7 rows a query opens leaves in tens of groups, and the
        # whole budget in each re-scored tens of times what a flat index does.
        share = max(k, math.ceil(budget * leaves / m))
        ids, scores = index.search_scored(queries[rows], k, int(leaves), share)
        ids = np.where(ids >= 0, self.members[g][np.maximum(ids, 0)], -1)
        both_ids = np.concatenate([best_ids[rows], ids], axis=1)
        both_scores = np.concatenate([best_scores[rows], scores], axis=1)
        # best first, empty slots (-inf) last; a stable sort keeps ties in the order the
        # groups were searched (lexsort by id too took a third of the search's time).
        order = np.argsort(-both_scores, axis=1, kind="stable")
        both_ids = np.take_along_axis(both_ids, order, 1)
        both_scores = np.take_along_axis(both_scores, order, 1)
        # A row found in two groups has the same exact score in both (the same float row
        # re-scored by the same kernel), so its copies sit side by side: keep the first.
        again = np.zeros(both_ids.shape, bool)
        again[:, 1:] = (both_ids[:, 1:] == both_ids[:, :-1]) & (both_ids[:, 1:] >= 0)
        keep = np.argsort(again, axis=1, kind="stable")[:, :k]
        best_ids[rows] = np.take_along_axis(both_ids, keep, 1)
        best_scores[rows] = np.take_along_axis(both_scores, keep, 1)
    return np.where(np.isfinite(best_scores), best_ids, -1).astype(np.int32)


def build_index(
  rows: np.ndarray,
  k: int,
  backend: str,
  scann_knobs: dict | None = None,
  threads: int = 0,
  progress=None,
):
  """backend: "exact", "scann", or "auto" (exact up to 50k rows, where a matmul is cheap).
  threads > 0: ScaNN's thread count (the exact index's matmul follows the BLAS pool, which
  the refresh worker's environment sets). progress: a grouped build's callback
  (GroupedScannIndex)."""
  if backend == "auto":
    backend = "exact" if len(rows) <= 50_000 else "scann"
  if backend == "exact":
    return ExactIndex(rows)
  if backend == "scann":
    params = scann_defaults(len(rows), k, **(scann_knobs or {}))
    if params.group_rows:
      return GroupedScannIndex(rows, k, params, threads, progress=progress)
    return ScannIndex(rows, k, params, threads)
  raise ValueError(f"unknown index backend {backend!r}; use auto, exact or scann")


def remove_positives(
  candidates: np.ndarray, rows: np.ndarray, positives: SparseRows, k: int
) -> tuple[np.ndarray, np.ndarray]:
  """Drops each query's positives from its ranked candidates and keeps the first k.

  Returns (negatives (n, k) int32 with -1 where fewer than k remain, short (n,) bool)."""
  pos_rows, pos_ids = rowsets.rows_of(positives, rows)
  kept = rowsets.drop_and_compact(candidates, rowsets.member(candidates, pos_rows, pos_ids), k)
  return kept.astype(np.int32), (kept < 0).any(1)


def mine(
  index,
  queries: np.ndarray,
  positives: SparseRows,
  k: int,
  num_labels: int,
  batch: int = 65536,
  offset: int = 0,
  out: np.ndarray | None = None,
  query_offset: int = 0,
) -> np.ndarray:
  """Each query's k top-scoring labels that are not its positives, (N, k) int32.

  The index holds `num_labels` rows whose global label ids start at `offset` (one shard of
  W). Retrieves k + (the row's positives, capped) candidates; rows left short (many
  positives among the top) are searched again with a larger k. out: an (N, k) array to fill
  (e.g. a column block of a memmap, so N x k never has to fit in RAM). query_offset: query
  i's positives are row i + query_offset of `positives` (a block of the training rows)."""
  n = len(queries)
  out = np.full((n, k), -1, np.int32) if out is None else out

  def search(r, n):
    ids = index.search(queries[r], n)
    return np.where(ids >= 0, ids + offset, -1)  # -1: a slot the index could not fill

  for s in range(0, n, batch):
    rows = np.arange(s, min(s + batch, n))
    extra = int(min(positives.row_lengths(rows + query_offset).max(initial=0), 4 * k))
    want = min(k + extra, num_labels)
    neg, short = remove_positives(search(rows, want), rows + query_offset, positives, k)
    while short.any() and want < num_labels:
      want = min(2 * want, num_labels)
      redo = rows[short]
      neg[short], short_redo = remove_positives(
        search(redo, want), redo + query_offset, positives, k
      )
      short[short] = short_redo
    out[rows] = neg
  return out


def overlap_at_k(found: np.ndarray, truth: np.ndarray) -> float:
  """Mean over rows of |found_i ∩ truth_i| / |truth_i|, -1 entries (slots left empty)
  ignored; a row with an empty truth counts as found in full."""
  shares = []
  for x, y in zip(found, truth):
    y = y[y >= 0]
    shares.append(len(np.intersect1d(x[x >= 0], y)) / len(y) if len(y) else 1.0)
  return float(np.mean(shares)) if shares else 1.0


def save_atomic(path: str, array: np.ndarray) -> None:
  """np.save to a temporary name, fsync, rename: a reader never sees a half-written file."""
  tmp = f"{path}.tmp-{tmpnames.unique_suffix()}.npy"
  with open(tmp, "wb") as f:
    np.save(f, array)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
