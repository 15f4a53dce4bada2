"""A validation split carved from the training rows (`data.validation_fraction`).

Settings are chosen on it, never on the test split: the periodic evaluations report it and
the test split is read once, at the end. The split is a function of (number of original
training rows, fraction, `data.validation_seed`, `data.validation_max_rows`) only, so runs
with other training seeds or other model settings hold out the same rows. Label-text rows
(augmentation) always stay in training: they are not queries.

`data.validation_max_rows` caps the held-out rows. A fraction suits small datasets, where
every held-out row sharpens a choice; at SS-20M's 146M rows a tenth is 14.6M rows that W
never trains on and that every candidate of the score choice reads over all labels, while
a P@1 read on 10^5 rows already has a standard error of about 0.16 points. The cap takes
the first rows of the same permutation, so below it the split is the fraction's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from astra_jax.data.dataset import RowConcat, XCData
from astra_jax.data.sparse_rows import SelectedRows, SparseRows, WithLabelRows
from astra_jax.runtime.errors import InputError


class RowSubset:
  """Rows `index` of a (n, T) token array, indexable like one (no copy of a memmap)."""

  def __init__(self, base, index: np.ndarray):
    self.base, self.index = base, np.asarray(index, np.int64)
    self.shape, self.dtype = (len(self.index), base.shape[1]), base.dtype

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, rows) -> np.ndarray:
    """rows: an index array or a slice."""
    idx = self.index[rows]
    # Sorted reads from a memmap, then back in the asked order.
    order = np.argsort(idx, kind="stable")
    out = np.empty((len(idx),) + self.shape[1:], self.dtype)
    out[order] = np.asarray(self.base[idx[order]])
    return out

  def __array__(self, dtype=None, copy=None):
    out = self[np.arange(len(self))]
    return out if dtype is None else out.astype(dtype)


# Rows take_rows reads at a time: its int64 temporaries (four arrays of 8 bytes a positive)
# are a block's, not the whole copy's.
TAKE_BLOCK_ROWS = 1 << 16


def take_rows(labels: SparseRows | WithLabelRows, rows: np.ndarray) -> SparseRows:
  """The given rows, in that order, as a SparseRows in RAM (a copy of those rows only, read
  TAKE_BLOCK_ROWS at a time). `labels` may map a label cache (values None: all one) or
  carry the label-text rows."""
  rows = np.asarray(rows, np.int64)
  indptr = np.zeros(len(rows) + 1, np.int64)
  np.cumsum(labels.row_lengths(rows), out=indptr[1:])
  ids = np.empty(int(indptr[-1]), np.int32)
  for lo in range(0, len(rows), TAKE_BLOCK_ROWS):
    hi = min(lo + TAKE_BLOCK_ROWS, len(rows))
    ids[indptr[lo] : indptr[hi]] = labels.entries(rows[lo:hi])[1]
  base = labels.base if isinstance(labels, WithLabelRows) else labels
  values = None
  if base.values is not None:
    values = (
      np.concatenate([labels.row_values(int(r)) for r in rows])
      if len(rows)
      else np.zeros(0, np.float32)
    ).astype(np.float32)
  return SparseRows(indptr, ids, values, labels.num_cols)


@dataclasses.dataclass(frozen=True)
class SplitSpec:
  """Which original training rows the validation split holds out.

  Attributes:
    fraction: their share (`data.validation_fraction`), in [0, 1); 0: no split.
    seed: the permutation's seed (`data.validation_seed`).
    max_rows: at most this many (`data.validation_max_rows`); 0: no cap.
  """

  fraction: float
  seed: int = 0
  max_rows: int = 0

  @classmethod
  def from_config(cls, data_config) -> SplitSpec:
    """The split a config's `data` fields name (fields it lacks take their defaults)."""
    return cls(
      float(data_config.get("validation_fraction", 0.0)),
      int(data_config.get("validation_seed", 0)),
      int(data_config.get("validation_max_rows", 0)),
    )

  def held_out(self, num_rows: int) -> int:
    """How many of `num_rows` original training rows the split holds out."""
    wanted = round(self.fraction * num_rows)
    return min(wanted, self.max_rows) if self.max_rows > 0 else wanted


def split_rows(num_rows: int, spec: SplitSpec) -> tuple[np.ndarray, np.ndarray]:
  """(training rows, validation rows), each sorted: spec.held_out(num_rows) rows drawn
  without replacement by `spec.seed`."""
  num_val = spec.held_out(num_rows)
  perm = np.random.default_rng(spec.seed).permutation(num_rows)
  return np.sort(perm[num_val:]), np.sort(perm[:num_val])


def rows_pairs(pairs: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """The (row, label) pairs of the given sorted rows, renumbered by position in `rows`."""
  pos = np.searchsorted(rows, pairs[:, 0])
  held = (pos < len(rows)) & (rows[np.minimum(pos, len(rows) - 1)] == pairs[:, 0])
  return np.stack([pos[held], pairs[held, 1]], 1).astype(np.int64).reshape(-1, 2)


@dataclasses.dataclass(frozen=True)
class ValidationSplit:
  """The training data without the held-out rows, and the held-out rows as an evaluation
  set (in XCData's test_* fields; filter pairs: each row's own item, with data.filter_self)."""

  train: XCData
  validation: XCData


def carve(data: XCData, spec: SplitSpec) -> ValidationSplit:
  """Holds out the original training rows `spec` names.

  Args:
    data: the loaded dataset (label-text rows, if any, follow the original rows).
    spec: the split, its fraction in (0, 1).
  Returns:
    ValidationSplit.
  """
  if not 0 < spec.fraction < 1:
    raise InputError(f"config.data.validation_fraction: must be in [0, 1), got {spec.fraction}")
  n = data.num_train_original
  keep, val = split_rows(n, spec)
  if len(val) == 0 or len(keep) == 0:
    raise InputError(
      f"config.data.validation_fraction={spec.fraction} (validation_max_rows="
      f"{spec.max_rows}) of {n} training rows leaves no validation or no training row"
    )
  tokens = data.train_tokens
  originals = tokens.parts[0] if isinstance(tokens, RowConcat) else tokens
  kept_tokens = RowSubset(originals, keep)
  if isinstance(tokens, RowConcat):  # the label-text rows stay after the original ones
    kept_tokens = RowConcat(kept_tokens, *tokens.parts[1:])
  val_labels = take_rows(data.train_labels, val)
  train = dataclasses.replace(
    data,
    train_tokens=kept_tokens,
    train_labels=kept_rows(data.train_labels, keep, n, val_labels),
    num_train_original=len(keep),
    train_self_pairs=rows_pairs(data.train_self_pairs, keep),
  )
  validation = dataclasses.replace(
    data,
    test_tokens=RowSubset(originals, val),
    test_labels=val_labels,
    test_filter=rows_pairs(data.train_self_pairs, val),
  )
  return ValidationSplit(train, validation)


def kept_rows(
  labels: SparseRows | WithLabelRows, keep: np.ndarray, num_original: int, held_out: SparseRows
) -> SelectedRows | WithLabelRows | SparseRows:
  """The training rows `keep` of the original rows, then the label-text rows if `labels`
  has them: read in place through their row ids (SelectedRows), or copied (take_rows)
  where the labels carry values.

  Args:
    labels: the data's training label rows (the original rows first).
    keep: the kept original rows, sorted.
    num_original: the original rows' count; rows after them are label-text rows.
    held_out: a copy of the other original rows (the validation split's labels).
  Returns:
    The kept rows.
  """
  extra = np.arange(num_original, labels.num_rows)
  base = labels.base if isinstance(labels, WithLabelRows) else labels
  if base.values is not None:
    return take_rows(labels, np.concatenate([keep, extra]))
  if isinstance(labels, WithLabelRows):
    return WithLabelRows(SelectedRows(base, keep, complement=held_out))
  return SelectedRows(base, np.concatenate([keep, extra]), complement=held_out)
