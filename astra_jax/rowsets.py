"""Per-row set operations on ranked id arrays, vectorised with sorted (row, id) keys (numpy
only: the refresh worker uses them too)."""
from __future__ import annotations

import numpy as np

from astra_jax.data.xc_format import SparseRows


# `member` marks a (rows x id range) table directly (one byte per entry) when it is at most
# this large and at most _TABLE_PER_ID entries per id looked up: clearing it costs its size,
# the search log(set size) per id.
_TABLE_LIMIT = 1 << 27
_TABLE_PER_ID = 64


def member(ids: np.ndarray, set_rows: np.ndarray, set_ids: np.ndarray) -> np.ndarray:
  """mask[i, j] = ids[i, j] belongs to row i's set, the sets given as (row, id) pairs; ids is
  (rows, k), -1 = none.

  Per-query random draws ask this for B x k_r ids (3.3M at the paper's LF-AmazonTitles-131K
  batch), so it avoids a binary search per id where it can: a (row, id) table when that is
  small; else a table over ids alone, and the search only for the ids some row's set holds."""
  ids = np.asarray(ids, np.int64)
  if not len(set_rows) or not ids.size:
    return np.zeros(ids.shape, bool)
  set_rows, set_ids = np.asarray(set_rows, np.int64), np.asarray(set_ids, np.int64)
  valid = ids >= 0
  width = max(int(ids.max()), int(set_ids.max())) + 1
  cells = ids.shape[0] * width
  if cells <= min(_TABLE_LIMIT, _TABLE_PER_ID * ids.size):
    table = np.zeros(cells, bool)
    inside = set_rows < ids.shape[0]  # sets of rows beyond ids' never match
    table[set_rows[inside] * width + set_ids[inside]] = True
    rows = np.arange(ids.shape[0], dtype=np.int64)[:, None]
    return table[rows * width + np.where(valid, ids, 0)] & valid
  seen = np.zeros(width, bool)
  seen[set_ids] = True
  mask = seen[np.where(valid, ids, 0)] & valid
  cand = np.nonzero(mask)
  keys = np.sort(set_rows * width + set_ids)
  query = cand[0].astype(np.int64) * width + ids[cand]
  at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
  mask[cand] = keys[at] == query
  return mask


def shared_member(shared: np.ndarray, num_rows: int, set_rows: np.ndarray,
                  set_ids: np.ndarray) -> np.ndarray:
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
  """The (position in `rows`, label) pairs of the given rows of a sparse matrix."""
  starts, ends = labels.indptr[rows], labels.indptr[rows + 1]
  which = np.repeat(np.arange(len(rows), dtype=np.int64), ends - starts)
  if not len(which):
    return which, np.zeros(0, np.int64)
  flat = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
  return which, labels.indices[flat].astype(np.int64)


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
