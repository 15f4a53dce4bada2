"""Hard negatives mined with an index over W's rows: the index a refresh builds
(build_index), each query's top k with its positives removed (mine, remove_positives), the
overlap with exact search that a refresh reports, and atomic saves of the mined arrays.
No jax here: this module runs inside the refresh worker process."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from astra_jax.ann import index as index_lib
from astra_jax.ann.grouped_index import GroupedScannIndex
from astra_jax.ann.index import ExactIndex, ScannIndex, scann_defaults
from astra_jax.data import rowsets
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.runtime import tmpnames


def build_index(
  rows: np.ndarray,
  k: int,
  backend: str,
  scann_knobs: dict | None = None,
  threads: int = 0,
  progress=None,
):
  """backend: "exact", "scann", or "auto" (exact up to 50k rows, where a matmul is cheap);
  "scann" where ScaNN is not installed searches exactly (`exact_without_scann` tells);
  "device": exact on this process's default jax device (the trainer's in-process refresh).
  threads > 0: ScaNN's thread count (the exact index's matmul follows the BLAS pool, which
  the refresh worker's environment sets). progress: a grouped build's callback
  (GroupedScannIndex)."""
  backend = resolve_backend(backend, len(rows))
  if backend == "scann" and not index_lib.scann_available():
    backend = "exact"
  if backend == "exact":
    return ExactIndex(rows)
  if backend == "device":
    from astra_jax.ann import exact_topk  # jax: only the trainer runs this backend

    return exact_topk.DeviceIndex(rows)
  if backend == "scann":
    params = scann_defaults(len(rows), k, **(scann_knobs or {}))
    if params.group_rows:
      return GroupedScannIndex(rows, k, params, threads, progress=progress)
    return ScannIndex(rows, k, params, threads)
  raise ValueError(f"unknown index backend {backend!r}; use auto, exact, scann or device")


def resolve_backend(backend: str, num_rows: int) -> str:
  """ "auto" -> "exact" up to 50k rows, else "scann"; other names unchanged."""
  if backend == "auto":
    return "exact" if num_rows <= 50_000 else "scann"
  return backend


def exact_without_scann(backend: str, num_rows: int) -> bool:
  """Whether `build_index(rows, k, backend)` over `num_rows` rows searches exactly only
  because ScaNN is not installed."""
  return resolve_backend(backend, num_rows) == "scann" and not index_lib.scann_available()


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


# Rows save_embedded embeds at a time.
EMBED_BLOCK_ROWS = 1 << 20


def save_embedded(
  path: str, num_rows: int, dim: int, embed_fn: Callable[[np.ndarray], np.ndarray]
) -> None:
  """The (num_rows, dim) float32 embeddings of rows 0 .. num_rows - 1 as an .npy, embedded
  EMBED_BLOCK_ROWS at a time into a memmap under a temporary name, synced to disk and then
  renamed like `save_atomic`'s files: all rows at once would be N x d x 4 bytes of one
  process's RAM.

  Args:
    path: the .npy to write.
    num_rows, dim: its shape.
    embed_fn: row ids -> (n, dim) embeddings.
  """
  tmp = _temporary_path(path)
  out = np.lib.format.open_memmap(tmp, "w+", np.float32, (num_rows, dim))
  for lo in range(0, num_rows, EMBED_BLOCK_ROWS):
    hi = min(lo + EMBED_BLOCK_ROWS, num_rows)
    out[lo:hi] = embed_fn(np.arange(lo, hi))
  out.flush()
  del out
  _publish(tmp, path)


def save_atomic(path: str, array: np.ndarray) -> None:
  """np.save to a temporary name, fsync, rename: a reader never sees a half-written file."""
  tmp = _temporary_path(path)
  with open(tmp, "wb") as f:
    np.save(f, array)
  _publish(tmp, path)


def _temporary_path(path: str) -> str:
  """A name beside `path` no other writer uses, still ending in .npy."""
  return f"{path}.tmp-{tmpnames.unique_suffix()}.npy"


def _publish(tmp: str, path: str) -> None:
  """Syncs `tmp` to disk, however it was written (a write or a memmap: fsync covers the
  file's every dirty page), then renames it to `path`, so that a reader, or a run resumed
  after a crash, sees the whole file or none."""
  with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(tmp, path)
