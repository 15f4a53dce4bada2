"""Sparse row matrices (CSR) as the XC label files hold them, and the error every reader of
those files raises (it names the file and the 1-based line)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence

import numpy as np

from astra_jax.runtime.errors import InputError


class XCFormatError(InputError):
  """A data file does not follow the format; the message names file and line."""

  def __init__(self, path: str | os.PathLike, line: int | None, message: str):
    where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
    super().__init__(f"{where}: {message}")
    self.path, self.line = os.fspath(path), line


_COUNT_BLOCK = 1 << 24  # entries per bincount: int64 temporaries bounded, not nnz-sized


@dataclasses.dataclass(frozen=True)
class SparseRows:
  """A CSR matrix without scipy: row i holds indices[indptr[i]:indptr[i+1]]. The arrays
  may be read-only memmaps of a label cache (`label_cache`); nothing here copies them."""

  indptr: np.ndarray  # (rows + 1,) int64
  indices: np.ndarray  # (nnz,) int32
  values: np.ndarray | None  # (nnz,) float32; None: every value is one (a label file's
  # usual case, so an nnz-sized array of ones is never held)
  num_cols: int
  counts: np.ndarray | None = None  # (num_cols,) positives per label, when precomputed
  max_length: int | None = None  # the longest row's length, when precomputed
  cache: str = ""  # the label cache these arrays map (label_cache), if any

  @property
  def num_rows(self) -> int:
    return len(self.indptr) - 1

  @property
  def nnz(self) -> int:
    return int(self.indptr[-1])

  def row_range(self, lo: int, hi: int) -> SparseRows:
    """Rows [lo, hi) as their own matrix (views of the arrays, row pointers rebased)."""
    start, end = self.indptr[lo], self.indptr[hi]
    return SparseRows(
      np.asarray(self.indptr[lo : hi + 1]) - start,
      self.indices[start:end],
      None if self.values is None else self.values[start:end],
      self.num_cols,
    )

  def row(self, i: int) -> np.ndarray:
    return self.indices[self.indptr[i] : self.indptr[i + 1]]

  def row_values(self, i: int) -> np.ndarray:
    if self.values is None:
      return np.ones(int(self.indptr[i + 1] - self.indptr[i]), np.float32)
    return self.values[self.indptr[i] : self.indptr[i + 1]]

  def row_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
    """Labels per row: of every row, or of the given row ids."""
    if rows is None:
      return np.diff(self.indptr)
    rows = np.asarray(rows, np.int64)
    return self.indptr[rows + 1] - self.indptr[rows]

  def max_row_length(self) -> int:
    if self.max_length is not None:
      return self.max_length
    longest = 0
    for s in range(0, self.num_rows, _COUNT_BLOCK):
      block = np.diff(self.indptr[s : s + _COUNT_BLOCK + 1])
      longest = max(longest, int(block.max(initial=0)))
    return longest

  def column_counts(self) -> np.ndarray:
    """(num_cols,) int64 positives per label, counted in blocks (np.bincount would cast
    all of `indices` to int64 at once)."""
    if self.counts is not None:
      return np.asarray(self.counts, np.int64)
    counts = np.zeros(self.num_cols, np.int64)
    for s in range(0, self.nnz, _COUNT_BLOCK):
      counts += np.bincount(self.indices[s : s + _COUNT_BLOCK], minlength=self.num_cols)
    return counts

  def entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (position in `rows`, label) pairs of the given rows, grouped by position."""
    rows = np.asarray(rows, np.int64)
    starts, ends = self.indptr[rows], self.indptr[rows + 1]
    lengths = ends - starts
    which = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    # entry j of row i sits at starts[i] + j: arange over all entries, shifted per row
    flat = np.arange(len(which)) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return which, np.asarray(self.indices[flat], np.int64)

  def head(self, n: int) -> SparseRows:
    """The first n rows."""
    if n == self.num_rows:
      return self
    end = self.indptr[n]
    vals = None if self.values is None else self.values[:end]
    return SparseRows(self.indptr[: n + 1], self.indices[:end], vals, self.num_cols)

  def blocks(self, max_rows: int) -> Iterator[SparseRows]:
    """The rows as consecutive matrices of at most `max_rows` rows each, in order (views of
    the arrays): what a writer streams without copying the matrix."""
    for lo in range(0, self.num_rows, max_rows):
      yield self.row_range(lo, min(lo + max_rows, self.num_rows))

  def to_dense(self) -> np.ndarray:
    dense = np.zeros((self.num_rows, self.num_cols), np.float32)
    rows = np.repeat(np.arange(self.num_rows), self.row_lengths())
    dense[rows, self.indices] = 1.0 if self.values is None else self.values
    return dense

  @staticmethod
  def from_lists(
    rows: Sequence[Sequence[int]], num_cols: int, values: Sequence[Sequence[float]] | None = None
  ) -> SparseRows:
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    flat = [i for r in rows for i in r]
    indices = np.asarray(flat, np.int32)
    if values is None:
      vals = np.ones(len(indices), np.float32)
    else:
      vals = np.asarray([v for r in values for v in r], np.float32)
    return SparseRows(indptr, indices, vals, int(num_cols))

  def vstack(self, other: SparseRows) -> SparseRows:
    if other.num_cols != self.num_cols:
      raise ValueError(f"column counts differ: {self.num_cols} vs {other.num_cols}")
    if self.values is None and other.values is None:
      vals = None
    else:
      ones = lambda m: np.ones(m.nnz, np.float32) if m.values is None else m.values
      vals = np.concatenate([ones(self), ones(other)])
    return SparseRows(
      np.concatenate([self.indptr, other.indptr[1:] + self.indptr[-1]]),
      np.concatenate([self.indices, other.indices]),
      vals,
      self.num_cols,
    )


class WithLabelRows:
  """Training rows followed by one row per label whose only positive is that label (the
  label-text augmentation), without copying: the identity block is computed, not stored.
  Offers the part of SparseRows' interface that training and mining read."""

  def __init__(self, base: SparseRows | SelectedRows):
    self.base, self.num_cols = base, base.num_cols

  @property
  def num_rows(self) -> int:
    return self.base.num_rows + self.num_cols

  @property
  def nnz(self) -> int:
    return self.base.nnz + self.num_cols

  def _split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows, np.int64)
    return rows, rows < self.base.num_rows

  def row(self, i: int) -> np.ndarray:
    if i < self.base.num_rows:
      return self.base.row(i)
    return np.array([i - self.base.num_rows], np.int32)

  def row_values(self, i: int) -> np.ndarray:
    return self.base.row_values(i) if i < self.base.num_rows else np.ones(1, np.float32)

  def row_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
    if rows is None:
      return np.concatenate([self.base.row_lengths(), np.ones(self.num_cols, np.int64)])
    rows, in_base = self._split(rows)
    out = np.ones(len(rows), np.int64)
    out[in_base] = self.base.row_lengths(rows[in_base])
    return out

  def max_row_length(self) -> int:
    return max(self.base.max_row_length(), 1 if self.num_cols else 0)

  def column_counts(self) -> np.ndarray:
    return self.base.column_counts() + 1

  def entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, in_base = self._split(rows)
    lengths = self.row_lengths(rows)
    which = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    labels = np.empty(len(which), np.int64)
    from_base = in_base[which]
    labels[from_base] = self.base.entries(rows[in_base])[1]
    labels[~from_base] = rows[~in_base] - self.base.num_rows
    return which, labels

  def head(self, n: int) -> SparseRows | WithLabelRows:
    if n <= self.base.num_rows:
      return self.base.head(n)
    if n == self.num_rows:
      return self
    raise ValueError(f"head({n}) would cut the label-text rows short")

  def to_dense(self) -> np.ndarray:
    return np.concatenate([self.base.to_dense(), np.eye(self.num_cols, dtype=np.float32)])

  def blocks(self, max_rows: int) -> Iterator[SparseRows]:
    """The rows as consecutive matrices of at most `max_rows` rows each: the training
    rows', then the identity's."""
    L = self.num_cols
    identity = SparseRows(np.arange(L + 1, dtype=np.int64), np.arange(L, dtype=np.int32), None, L)
    yield from self.base.blocks(max_rows)
    yield from identity.blocks(max_rows)


class StackedRows:
  """The rows of `first`, then those of `second`, without copying either: the neighbour
  vote's memory (the training rows, then the validation rows), whose labels the data
  already holds. Offers the part of SparseRows' interface the vote and the export read.

  Attributes:
    first, second: the two blocks of rows (the same columns).
  """

  def __init__(self, first: SparseRows | SelectedRows, second: SparseRows):
    if first.num_cols != second.num_cols:
      raise ValueError(f"column counts differ: {first.num_cols} vs {second.num_cols}")
    self.first, self.second, self.num_cols = first, second, first.num_cols

  @property
  def num_rows(self) -> int:
    return self.first.num_rows + self.second.num_rows

  @property
  def nnz(self) -> int:
    return self.first.nnz + self.second.nnz

  def row_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
    if rows is None:
      return np.concatenate([self.first.row_lengths(), self.second.row_lengths()])
    rows = np.asarray(rows, np.int64)
    low = rows < self.first.num_rows
    out = np.empty(len(rows), np.int64)
    out[low] = self.first.row_lengths(rows[low])
    out[~low] = self.second.row_lengths(rows[~low] - self.first.num_rows)
    return out

  def entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (position in `rows`, label) pairs of the given rows, grouped by position."""
    rows = np.asarray(rows, np.int64)
    low = rows < self.first.num_rows
    which = np.repeat(np.arange(len(rows), dtype=np.int64), self.row_lengths(rows))
    labels = np.empty(len(which), np.int64)
    from_first = low[which]
    labels[from_first] = self.first.entries(rows[low])[1]
    labels[~from_first] = self.second.entries(rows[~low] - self.first.num_rows)[1]
    return which, labels

  def head(self, n: int) -> SparseRows | SelectedRows | StackedRows:
    """The first n rows (views)."""
    if n <= self.first.num_rows:
      return self.first.head(n)
    if n == self.num_rows:
      return self
    return StackedRows(self.first, self.second.head(n - self.first.num_rows))

  def to_dense(self) -> np.ndarray:
    return np.concatenate([self.first.to_dense(), self.second.to_dense()])

  def blocks(self, max_rows: int) -> Iterator[SparseRows]:
    """The rows as consecutive matrices of at most `max_rows` rows each: the first block's,
    then the second's."""
    yield from self.first.blocks(max_rows)
    yield from self.second.blocks(max_rows)


def row_subset(labels, rows: np.ndarray) -> SparseRows:
  """The given rows of a sparse matrix (SparseRows, WithLabelRows, SelectedRows or
  StackedRows), in that order, as a SparseRows in RAM of len(rows) rows (a copy of those
  rows only).

  Args:
    labels: the matrix.
    rows: (n,) row ids of it.
  Returns:
    The rows.
  """
  which, ids = labels.entries(rows)
  indptr = np.zeros(len(rows) + 1, np.int64)
  np.cumsum(np.bincount(which, minlength=len(rows)), out=indptr[1:])
  return SparseRows(indptr, ids.astype(np.int32), None, labels.num_cols)


# Rows a SelectedRows materialises at a time where it must (counts, to_dense, blocks).
_SELECTED_BLOCK = 1 << 20


class SelectedRows:
  """Rows `rows` of `base`, in that order, without copying `base`: the training rows a
  validation split keeps, read from the label cache's memmaps through their row ids (8 bytes
  a row) instead of a copy of their labels (8 bytes a row and 4 a positive).
  Offers the part of SparseRows' interface that training, mining, the vote and the writers
  read. Unweighted rows only (`base.values` None): a label file with values is copied
  (validation.take_rows).

  Attributes:
    base: the matrix the rows are read from.
    rows: (n,) int64 row ids of `base`.
    complement: when given, a copy of every row of `base` that `rows` leaves out (each row
      of `base` in exactly one of the two): nnz and column counts are then the base's less
      the complement's, not a pass over the selected rows.
  """

  values = None  # every value is one
  cache = ""  # not a label cache's own arrays

  def __init__(self, base: SparseRows, rows: np.ndarray, complement: SparseRows | None = None):
    if base.values is not None:
      raise ValueError("SelectedRows reads unweighted rows only; copy weighted ones")
    self.base, self.rows, self.num_cols = base, np.asarray(rows, np.int64), base.num_cols
    self.complement = complement
    if complement is not None and complement.num_rows + len(self.rows) != base.num_rows:
      raise ValueError(
        f"the complement's {complement.num_rows} rows and the {len(self.rows)} selected "
        f"are not the base's {base.num_rows}"
      )
    self._nnz: int | None = None

  @property
  def num_rows(self) -> int:
    return len(self.rows)

  @property
  def nnz(self) -> int:
    if self._nnz is None:
      if self.complement is not None:
        self._nnz = self.base.nnz - self.complement.nnz
      else:
        self._nnz = sum(int(n.sum()) for n in self._length_blocks())
    return self._nnz

  def _length_blocks(self) -> Iterator[np.ndarray]:
    """The selected rows' lengths, _SELECTED_BLOCK rows at a time."""
    for s in range(0, self.num_rows, _SELECTED_BLOCK):
      yield self.base.row_lengths(self.rows[s : s + _SELECTED_BLOCK])

  def row(self, i: int) -> np.ndarray:
    return self.base.row(int(self.rows[i]))

  def row_values(self, i: int) -> np.ndarray:
    return self.base.row_values(int(self.rows[i]))

  def row_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
    """Labels per row: of every row, or of the given row ids (of this matrix)."""
    picked = self.rows if rows is None else self.rows[np.asarray(rows, np.int64)]
    return self.base.row_lengths(picked)

  def max_row_length(self) -> int:
    return max((int(n.max(initial=0)) for n in self._length_blocks()), default=0)

  def column_counts(self) -> np.ndarray:
    """(num_cols,) int64 positives per label of the selected rows."""
    if self.complement is not None:
      return self.base.column_counts() - self.complement.column_counts()
    counts = np.zeros(self.num_cols, np.int64)
    for block in self.blocks(_SELECTED_BLOCK):
      counts += block.column_counts()
    return counts

  def entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (position in `rows`, label) pairs of the given rows, grouped by position."""
    return self.base.entries(self.rows[np.asarray(rows, np.int64)])

  def head(self, n: int) -> SelectedRows:
    """The first n rows (a view)."""
    return self if n == self.num_rows else SelectedRows(self.base, self.rows[:n])

  def blocks(self, max_rows: int) -> Iterator[SparseRows]:
    """The rows as consecutive matrices in RAM of at most `max_rows` rows each (and never
    more than 2^20: each is a copy)."""
    step = min(max_rows, _SELECTED_BLOCK)
    for lo in range(0, self.num_rows, step):
      yield row_subset(self.base, self.rows[lo : lo + step])

  def to_dense(self) -> np.ndarray:
    return row_subset(self.base, self.rows).to_dense()
