"""Maximum-inner-product search over label vectors (W's rows).

Backends with one interface, `search(queries, k) -> (N, k) ids` (best first):
  * `ExactIndex`: blocked numpy matmul + partial sort; exact, O(N L d), for small L and tests.
  * `ScannIndex`: ScaNN (pybind API, no TensorFlow): a k-means tree + anisotropic
    quantisation + exact re-ranking. Knob defaults are scaled to L by `scann_defaults`.
  * `grouped_index.GroupedScannIndex`: one ScaNN index whose leaves are trained in groups
    of rows, for shards of millions of rows.
The hard-negative refresh mines with them (negatives/mining.py), serving searches with them
(serving/serve_index.py). No jax here: this module also runs inside the refresh worker.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import shutil
import tempfile

import numpy as np
from absl import logging

# ScaNN ships wheels for Linux (x86_64, aarch64) only; elsewhere the project installs without
# it (setup.cfg) and every ScaNN search becomes an exact one.
SCANN_MISSING = (
  "ScaNN is not installed (its wheels are for Linux x86_64 and aarch64): hard negatives and "
  "serving search exactly, O(L) per query"
)


@functools.cache
def scann_available() -> bool:
  """Whether ScaNN imports in this process."""
  try:
    import scann  # noqa: F401
  except ImportError:
    return False
  return True


@functools.cache
def warn_scann_missing() -> None:
  """SCANN_MISSING as a warning, once per process (the trainer and its serving index)."""
  logging.warning(SCANN_MISSING)


class ExactIndex:
  """Brute-force top-k by inner product, in (query block x row block) tiles.

  The tiles bound memory by `tile_floats` whatever L is: a refresh's recall check searches
  1,000 queries against a shard of ~10^7 rows at SS-20M's size, which as one score array
  would take 38 GB. Each row block's top-k is merged into a running top-k."""

  exact = True  # recall 1.0 by construction: a refresh skips its recall check

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
  # > 0: the leaves are trained group by group, (rows // group_rows) groups of a coarse
  # k-means each with its share of num_leaves, and given to one ScaNN index whose queries
  # open their num_leaves_to_search best leaves of all groups (GroupedScannIndex).
  group_rows: int = 0


@dataclasses.dataclass(frozen=True)
class IndexKnobs:
  """The refresh index's settings (`config.negatives.index`): its kind, and overrides of
  `scann_defaults` (zeros: scaled to L, or off).

  The fields besides `kind` are `scann_defaults`' keywords of those names; these defaults
  are the config's (config/negatives.py reads them from here).
  """

  kind: str = "auto"  # auto (exact up to 50k rows, else scann) | exact | scann
  num_leaves: int = 0  # 0: scaled to L (2 sqrt(L))
  leaves_to_search: int = 0  # 0: max(64, leaves / 3), at most all leaves
  reorder: int = 0  # 0: max(20 k, 1000)
  rows_per_query: int = 0  # > 0: rows a query scores, whatever L
  leaf_rows: int = 0  # > 0: leaves of this many rows in every shard
  leaf_shrink: float = 0.0  # > 0: leaves shrink as (10^6 / shard rows)^this
  group_rows: int = 0  # > 0: built in groups of this many rows
  avq: float = 0.0  # > 0: anisotropic leaf centres at this eta
  soar_lambda: float = 0.0  # > 0: SOAR's second copy of each row at this lambda

  @classmethod
  def from_config(cls, index_config) -> IndexKnobs:
    """The record of `config.negatives.index` (a ConfigDict or a mapping)."""
    names = [f.name for f in dataclasses.fields(cls)]
    return cls(**{name: index_config[name] for name in names})

  def scann_knobs(self) -> dict:
    """`scann_defaults`' keywords (the partitioner options None where off)."""
    knobs = dataclasses.asdict(self)
    del knobs["kind"]
    knobs["avq"] = self.avq or None
    knobs["soar_lambda"] = self.soar_lambda or None
    return knobs


LEAF_ROWS = 1000  # rows per leaf under the fixed-cost rule, once L is large
# Rows the leaf centres are trained on, per leaf, under the fixed-cost rule, whatever L: with
# fewer the centres (and the leaves that follow them) are noisier, and a query must score
# more rows for the same recall (docs/results/refresh_index.md). The k-means then costs
# about 500 x iterations / leaf_rows times the assignment of the L rows to leaves, which any
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
    searched. Hard negatives are near-ties: breadth matters, and recall@k rises with the
    share of leaves searched (docs/results/refresh_index.md). But a query then scores L/3
    rows, and a refresh costs O(N L): ~10^15 row scores at SS-20M.
  * rows_per_query = R > 0, a fixed cost per query: ~2 sqrt(L) leaves while that leaves at
    most LEAF_ROWS rows in each, then L / LEAF_ROWS (their number grows with L, not their
    size; leaf_rows sets the size instead), as many leaves searched as hold R rows (SOAR's
    second copies counted), and the leaf centres trained on TRAINING_ROWS_PER_LEAF rows per
    leaf. Recall then holds as L grows only where a query's near-ties live in a
    neighbourhood whose size does not grow with L: benchmarks/refresh_knobs.py measures it.
  20 k candidates (at least 1,000) are re-ranked exactly either way: what a search loses is
  lost in the leaves it does not open, so a deeper re-ranking does not raise recall.
  Recall at a fixed R falls as L grows at one leaf size; leaves that shrink as L grows
  (leaf_shrink) hold it, and a build in groups (group_rows) keeps their build from growing
  as L^2 / leaf_rows. The measurements behind both: docs/results/refresh_index.md.

  Args:
    num_rows: rows in the index (one W shard).
    k: neighbours wanted per query.
    num_leaves, leaves_to_search, reorder: explicit knobs (config.negatives.index.*).
    rows_per_query: the fixed-cost rule's budget (config.negatives.index.rows_per_query).
    leaf_rows: > 0, exactly num_rows / leaf_rows leaves (unless num_leaves is given), under
      either rule: a leaf size that holds for every shard of W, whatever their number
      (config.negatives.index.leaf_rows).
    leaf_shrink: > 0, leaves of leaf_rows x (LEAF_SHRINK_ROWS / num_rows)^leaf_shrink rows
      instead (leaf_rows at 10^6 rows, smaller above; config.negatives.index.leaf_shrink).
    avq, soar_lambda: partitioner options for inner products (None: off), as the serving
      index uses them (serve_index.serving_params).
    group_rows: > 0, build the leaves group by group (GroupedScannIndex), groups of about
      this many rows (config.negatives.index.group_rows); 0, one index.
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
  def __init__(
    self,
    rows: np.ndarray,
    k: int,
    params: ScannParams,
    threads: int = 0,
    partition: tuple[np.ndarray, np.ndarray] | None = None,
  ):
    """threads > 0: the build's and search_batched_parallel's thread count (ScaNN's own
    default is every core of the machine, not the task's share: cpu_budget.py).
    partition: (leaf centres, each row's leaf ids) computed outside ScaNN
    (grouped_index.GroupedScannIndex) instead of ScaNN's own k-means."""
    import scann  # imported lazily: heavy, and only needed on the host that mines

    from astra_jax.ann import scann_files

    self.params = params
    # With a given partition the builder only makes the config (it reads the rows' width),
    # and scann_files copies the rows to its file block by block: no float32 copy here.
    if partition is None:
      rows = np.ascontiguousarray(rows, np.float32)
    builder = scann.scann_ops_pybind.builder(rows, k, "dot_product")
    if threads > 0:
      builder.set_n_training_threads(threads)
    builder = (
      builder.tree(
        num_leaves=len(partition[0]) if partition else params.num_leaves,
        num_leaves_to_search=params.num_leaves_to_search,
        training_sample_size=params.training_sample_size,
        random_init=False,  # deterministic: same inputs, same negatives
        avq=params.avq,
        soar_lambda=params.soar_lambda,
        overretrieve_factor=2.0 if params.soar_lambda else None,
      )
      .score_ah(2, anisotropic_quantization_threshold=0.2)
      .reorder(params.reorder)
    )
    if partition is None:
      self.searcher = builder.build()
    else:
      config = builder.create_config()
      self.searcher = scann_files.load_with_partition(rows, config, *partition)
    if threads > 0:
      self.searcher.set_num_threads(threads)

  @property
  def num_leaves(self) -> int:
    """Leaves in the index (a query's leaves are counted among these)."""
    return self.params.num_leaves

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
  def load(cls, path: str, params: ScannParams, threads: int = 0) -> ScannIndex:
    """An index `save` wrote; `params` are the knobs it was built with; threads > 0: its
    searches' thread count (as the constructor's)."""
    import scann

    index = cls.__new__(cls)
    index.params = params
    index.searcher = scann.scann_ops_pybind.load_searcher(path, assets_backcompat_shim=False)
    if threads > 0:
      index.searcher.set_num_threads(threads)
    return index
