"""Per-row set operations on ranked id arrays, vectorised with sorted (row, id) keys (numpy
only: the refresh worker uses them too)."""

from __future__ import annotations

import threading

import numpy as np

from astra_jax.data.sparse_rows import SparseRows

# `member` marks a (rows x id range) table directly (one byte per entry), a chunk of rows at
# a time so that the table stays in the CPU's caches (_CHUNK_BYTES), when a row's id range
# is at most _TABLE_PER_ID entries per id looked up in the row; otherwise a table over ids
# alone filters, and a binary search (log set size per id) decides the ids that pass.
_CHUNK_BYTES = 1 << 21
_TABLE_PER_ID = 64


class _Scratch(threading.local):
  """An all-False id table per thread for `member(..., reuse_table=True)`: a fresh np.zeros
  of L bytes costs its page faults on every call; the entries a call sets, it clears."""

  table = np.zeros(0, bool)

  def get(self, cells: int) -> np.ndarray:
    if len(self.table) < cells:
      self.table = np.zeros(cells, bool)
    return self.table[:cells]


_scratch = _Scratch()


def member(
  ids: np.ndarray, set_rows: np.ndarray, set_ids: np.ndarray, reuse_table: bool = False
) -> np.ndarray:
  """mask[i, j] = ids[i, j] belongs to row i's set, the sets given as (row, id) pairs; ids is
  (rows, k), -1 = none.

  Per-query random draws ask this for B x k_r ids (3.3M at the paper's LF-AmazonTitles-131K
  batch), so it avoids a binary search per id where it can (see _CHUNK_BYTES).
  reuse_table: the id table (L bytes) lives on in this thread for the next call; for
  callers that ask again and again (the sampler)."""
  ids = np.asarray(ids)
  if not len(set_rows) or not ids.size:
    return np.zeros(ids.shape, bool)
  set_rows, set_ids = np.asarray(set_rows, np.int64), np.asarray(set_ids, np.int64)
  valid = ids >= 0
  width = max(int(ids.max()), int(set_ids.max())) + 1
  if width <= min(_CHUNK_BYTES, _TABLE_PER_ID * ids.shape[1]):
    return _member_by_table(np.where(valid, ids, 0), set_rows, set_ids, width) & valid
  ids = ids.astype(np.int64, copy=False)
  seen = _scratch.get(width) if reuse_table else np.zeros(width, bool)
  seen[set_ids] = True
  try:
    mask = seen[np.where(valid, ids, 0)] & valid
  finally:
    seen[set_ids] = False
  cand = np.nonzero(mask)
  keys = np.sort(set_rows * width + set_ids)
  query = cand[0].astype(np.int64) * width + ids[cand]
  at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
  mask[cand] = keys[at] == query
  return mask


def _member_by_table(
  ids: np.ndarray, set_rows: np.ndarray, set_ids: np.ndarray, width: int
) -> np.ndarray:
  """`member` for ids in [0, width), through a (rows x width) byte table built and read a
  chunk of rows at a time."""
  n = ids.shape[0]
  chunk = max(1, _CHUNK_BYTES // width)
  inside = set_rows < n  # sets of rows beyond ids' never match
  set_rows, set_ids = set_rows[inside], set_ids[inside]
  # the set entries grouped by chunk (a stable radix sort of small chunk numbers)
  chunks = -(-n // chunk)
  of_chunk = (set_rows // chunk).astype(np.uint16 if chunks < 2**16 else np.int64)
  order = np.argsort(of_chunk, kind="stable")
  bounds = np.searchsorted(of_chunk[order], np.arange(chunks + 1))
  table = np.zeros(chunk * width, bool)
  local = np.arange(chunk, dtype=np.int32)[:, None] * np.int32(width)  # < 2 _CHUNK_BYTES
  out = np.empty(ids.shape, bool)
  for c, lo in enumerate(range(0, n, chunk)):
    hi = min(lo + chunk, n)
    sel = order[bounds[c] : bounds[c + 1]]
    keys = (set_rows[sel] - lo) * width + set_ids[sel]
    table[keys] = True
    out[lo:hi] = table[local[: hi - lo] + ids[lo:hi]]
    table[keys] = False
  return out


def shared_member(
  shared: np.ndarray, num_rows: int, set_rows: np.ndarray, set_ids: np.ndarray
) -> np.ndarray:
  """mask[i, j] = shared[j] belongs to row i's set: `member` for one id list shared by all
  rows (a batch's random negatives). Looks the (few) set entries up among the sorted shared
  ids instead of every (row, shared id) pair among the set entries: O(n log K) for n set
  entries, not O(B K log n)."""
  shared = np.asarray(shared, np.int64)
  mask = np.zeros((num_rows, len(shared)), bool)
  if not len(set_rows) or not len(shared):
    return mask
  order = np.argsort(shared, kind="stable")
  ids = np.asarray(set_ids, np.int64)
  lo = np.searchsorted(shared[order], ids, "left")
  count = np.searchsorted(shared[order], ids, "right") - lo
  hit = count > 0
  rows, lo, count = np.asarray(set_rows, np.int64)[hit], lo[hit], count[hit]
  # Every position of a repeated shared id: the run lo .. lo + count - 1 of each hit.
  which = np.repeat(np.arange(len(rows)), count)
  offset = np.arange(len(which)) - np.repeat(np.cumsum(count) - count, count)
  mask[rows[which], order[lo[which] + offset]] = True
  return mask


def rows_of(labels: SparseRows, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The (position in `rows`, label) pairs of the given rows of a sparse matrix (SparseRows
  or WithLabelRows), grouped by position."""
  return labels.entries(rows)


def drop_and_compact(ranked: np.ndarray, drop: np.ndarray, k: int) -> np.ndarray:
  """Removes the dropped entries of each row (and -1s), keeps the order of the rest, returns
  the first k per row padded with -1."""
  ranked = np.asarray(ranked, np.int64)
  drop = drop | (ranked < 0)
  order = np.argsort(drop, axis=1, kind="stable")
  kept = np.where(np.take_along_axis(drop, order, 1), -1, np.take_along_axis(ranked, order, 1))
  if kept.shape[1] < k:
    kept = np.pad(kept, ((0, 0), (0, k - kept.shape[1])), constant_values=-1)
  return kept[:, :k]
