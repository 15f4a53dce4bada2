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

import numpy as np

from astra_jax import rowsets
from astra_jax.data.xc_format import SparseRows


class ExactIndex:

  def __init__(self, rows: np.ndarray, query_block: int = 4096):
    self.rows = np.ascontiguousarray(rows, np.float32)
    self.query_block = query_block

  def search(self, queries: np.ndarray, k: int) -> np.ndarray:
    L = len(self.rows)
    k = min(k, L)
    out = np.empty((len(queries), k), np.int32)
    for s in range(0, len(queries), self.query_block):
      scores = np.asarray(queries[s:s + self.query_block], np.float32) @ self.rows.T
      top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < L else np.tile(np.arange(L), (len(scores), 1))
      order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
      out[s:s + len(scores)] = np.take_along_axis(top, order, 1)
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


def scann_defaults(num_rows: int, k: int, num_leaves: int = 0, leaves_to_search: int = 0,
                   reorder: int = 0) -> ScannParams:
  """~2 sqrt(L) leaves, a third of them (at least 64) searched, 20 k candidates re-ranked
  exactly. Zeros mean "scaled to L". Measured recall@k: benchmarks/refresh.py (L=1e5, groups
  of 8 confusable rows, k=50) 0.68 searching 1/10 of the leaves and re-ranking 200, 0.83 with
  1/5 and 500, 0.92 with 1/3 and 1000; the demo's trained W (L=2000, k=16, 89 leaves) 0.73
  searching 32 leaves, 0.94 searching 64. Hard negatives are near-ties: breadth matters."""
  leaves = num_leaves or int(min(max(2 * math.sqrt(num_rows), 16), 20000))
  search = leaves_to_search or max(min(leaves, 64), leaves // 3)
  return ScannParams(leaves, min(search, leaves), reorder or max(20 * k, 1000),
                     min(num_rows, max(250_000, 50 * leaves)))


class ScannIndex:

  def __init__(self, rows: np.ndarray, k: int, params: ScannParams):
    import scann  # imported lazily: heavy, and only needed on the host that mines
    self.params = params
    rows = np.ascontiguousarray(rows, np.float32)
    self.searcher = (scann.scann_ops_pybind.builder(rows, k, "dot_product")
                     .tree(num_leaves=params.num_leaves,
                           num_leaves_to_search=params.num_leaves_to_search,
                           training_sample_size=params.training_sample_size,
                           random_init=False,  # deterministic: same inputs, same negatives
                           avq=params.avq, soar_lambda=params.soar_lambda,
                           overretrieve_factor=2.0 if params.soar_lambda else None)
                     .score_ah(2, anisotropic_quantization_threshold=0.2)
                     .reorder(params.reorder).build())

  def search(self, queries: np.ndarray, k: int) -> np.ndarray:
    """(n, k) ids, -1 where the searched leaves held fewer than k rows (ScaNN pads those
    slots with id 0 and a NaN score: not k copies of label 0)."""
    ids, scores = self.searcher.search_batched_parallel(
        np.ascontiguousarray(queries, np.float32), final_num_neighbors=k,
        pre_reorder_num_neighbors=max(self.params.reorder, k))
    return np.where(np.isnan(scores), -1, ids).astype(np.int32)

  def save(self, path: str) -> None:
    """ScaNN's own serialization into the directory `path`, with asset paths relative to
    it so that the directory can be renamed into place afterwards."""
    os.makedirs(path, exist_ok=True)
    self.searcher.serialize(path, relative_path=True)

  @classmethod
  def load(cls, path: str, params: ScannParams) -> "ScannIndex":
    """An index `save` wrote; `params` are the knobs it was built with."""
    import scann
    index = cls.__new__(cls)
    index.params = params
    index.searcher = scann.scann_ops_pybind.load_searcher(path, assets_backcompat_shim=False)
    return index


def build_index(rows: np.ndarray, k: int, backend: str, scann_knobs: dict | None = None):
  """backend: "exact", "scann", or "auto" (exact up to 50k rows, where a matmul is cheap)."""
  if backend == "auto":
    backend = "exact" if len(rows) <= 50_000 else "scann"
  if backend == "exact":
    return ExactIndex(rows)
  if backend == "scann":
    return ScannIndex(rows, k, scann_defaults(len(rows), k, **(scann_knobs or {})))
  raise ValueError(f"unknown index backend {backend!r}; use auto, exact or scann")


def remove_positives(candidates: np.ndarray, rows: np.ndarray, positives: SparseRows,
                     k: int) -> tuple[np.ndarray, np.ndarray]:
  """Drops each query's positives from its ranked candidates and keeps the first k.

  Returns (negatives (n, k) int32 with -1 where fewer than k remain, short (n,) bool)."""
  pos_rows, pos_ids = rowsets.rows_of(positives, rows)
  kept = rowsets.drop_and_compact(candidates, rowsets.member(candidates, pos_rows, pos_ids), k)
  return kept.astype(np.int32), (kept < 0).any(1)


def mine(index, queries: np.ndarray, positives: SparseRows, k: int, num_labels: int,
         batch: int = 65536, offset: int = 0, out: np.ndarray | None = None) -> np.ndarray:
  """Each query's k top-scoring labels that are not its positives, (N, k) int32.

  The index holds `num_labels` rows whose global label ids start at `offset` (one shard of
  W). Retrieves k + (the row's positives, capped) candidates; rows left short (many
  positives among the top) are searched again with a larger k. out: an (N, k) array to fill
  (e.g. a column block of a memmap, so N x k never has to fit in RAM)."""
  n = len(queries)
  out = np.full((n, k), -1, np.int32) if out is None else out

  def search(r, n):
    ids = index.search(queries[r], n)
    return np.where(ids >= 0, ids + offset, -1)  # -1: a slot the index could not fill

  for s in range(0, n, batch):
    rows = np.arange(s, min(s + batch, n))
    extra = int(min(positives.row_lengths(rows).max(initial=0), 4 * k))
    want = min(k + extra, num_labels)
    neg, short = remove_positives(search(rows, want), rows, positives, k)
    while short.any() and want < num_labels:
      want = min(2 * want, num_labels)
      redo = rows[short]
      neg[short], short_redo = remove_positives(search(redo, want), redo, positives, k)
      short[short] = short_redo
    out[rows] = neg
  return out


def recall_at_k(index, exact: ExactIndex, queries: np.ndarray, k: int) -> float:
  """Mean |ANN top-k ∩ exact top-k| / k."""
  a, b = index.search(queries, k), exact.search(queries, k)
  return float(np.mean([len(np.intersect1d(x, y)) / k for x, y in zip(a, b)]))


def save_atomic(path: str, array: np.ndarray) -> None:
  """np.save to a temporary name, fsync, rename: a reader never sees a half-written file."""
  tmp = f"{path}.tmp-{os.getpid()}.npy"
  with open(tmp, "wb") as f:
    np.save(f, array)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
