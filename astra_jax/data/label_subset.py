"""A dataset restricted to a random subset of its labels (`data.label_subset`): the paper's
Figure 1 setting, "1K labels sampled from LF-AmazonTitles-131K".

The subset keeps every query (training and test) that has at least one positive among the
sampled labels, with its labels restricted to them and renumbered 0 .. K-1 in the order of
the original ids; the other queries are dropped (they would be all-negative rows). Label
texts, the label-text training rows (augmentation) and the test filter pairs follow the
kept labels. The subset is a function of (L, K, `data.label_subset_seed`) only, so every
run of one setting trains on the same labels and queries.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from astra_jax.data.dataset import RowConcat, XCData
from astra_jax.data.sparse_rows import SparseRows, WithLabelRows
from astra_jax.data.validation import RowSubset
from astra_jax.runtime.errors import InputError


def sample_labels(num_labels: int, size: int, seed: int) -> np.ndarray:
  """`size` label ids of [0, num_labels) drawn without replacement by `seed`, sorted."""
  return np.sort(np.random.default_rng(seed).choice(num_labels, size, replace=False))


def _restrict_rows(
  labels: SparseRows | WithLabelRows, rows: np.ndarray, new_id: np.ndarray, size: int
) -> tuple[np.ndarray, SparseRows]:
  """(kept rows, their labels renumbered): the rows of `rows` with at least one label that
  new_id maps (>= 0), each with only those labels."""
  which, ids = labels.entries(rows)
  mapped = new_id[ids]
  inside = mapped >= 0
  kept_pos = np.unique(which[inside])
  # Positions in `rows` -> positions among the kept rows (entries stay grouped by row).
  slot = np.full(len(rows), -1, np.int64)
  slot[kept_pos] = np.arange(len(kept_pos))
  counts = np.bincount(slot[which[inside]], minlength=len(kept_pos))
  indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  return rows[kept_pos], SparseRows(indptr, mapped[inside].astype(np.int32), None, size)


def restrict(data: XCData, size: int, seed: int) -> XCData:
  """The dataset on `size` labels sampled by `seed` (see the module docstring).

  Args:
    data: the loaded dataset (label-text rows, if any, follow the original training rows).
    size: labels kept, in [1, L].
    seed: `data.label_subset_seed`.
  Returns:
    XCData over the kept labels; `data_dir` unchanged (label texts are read by label id
    from the subset's `label_tokens`, not from the directory).
  Raises:
    InputError: size out of range, or no training or test query left.
  """
  L = data.num_labels
  if not 1 <= size <= L:
    raise InputError(
      f"config.data.label_subset={size}: must be in [1, {L}] (the dataset's labels), or 0 for all"
    )
  train = data.train_labels
  base = train.base if isinstance(train, WithLabelRows) else train
  weighted = lambda m: m.values is not None and not np.all(np.asarray(m.values) == 1)
  if weighted(base) or weighted(data.test_labels):
    raise InputError(
      "config.data.label_subset: the dataset has weighted labels; only 0/1 "
      "label files can be restricted"
    )
  kept_labels = sample_labels(L, size, seed)
  new_id = np.full(L, -1, np.int64)
  new_id[kept_labels] = np.arange(size)
  n = data.num_train_original
  train_rows, train_labels = _restrict_rows(train, np.arange(n), new_id, size)
  test_rows, test_labels = _restrict_rows(
    data.test_labels, np.arange(data.test_labels.num_rows), new_id, size
  )
  if not len(train_rows) or not len(test_rows):
    raise InputError(
      f"config.data.label_subset={size} (seed {seed}) leaves "
      f"{len(train_rows)} training and {len(test_rows)} test queries"
    )
  tokens = data.train_tokens
  originals = tokens.parts[0] if isinstance(tokens, RowConcat) else tokens
  train_tokens = RowSubset(originals, train_rows)
  label_tokens = None if data.label_tokens is None else np.asarray(data.label_tokens)[kept_labels]
  if train.num_rows > n:  # label-text augmentation: the kept labels' rows follow
    if label_tokens is None:
      raise InputError("config.data.label_subset: label-text rows without label texts")
    train_tokens = RowConcat(train_tokens, label_tokens)
    train_labels = WithLabelRows(train_labels)
  test_row_new = np.full(data.test_labels.num_rows, -1, np.int64)
  test_row_new[test_rows] = np.arange(len(test_rows))
  f = np.asarray(data.test_filter, np.int64).reshape(-1, 2)
  f = np.stack([test_row_new[f[:, 0]], new_id[f[:, 1]]], 1) if len(f) else f
  train_row_new = np.full(n, -1, np.int64)
  train_row_new[train_rows] = np.arange(len(train_rows))
  own = np.asarray(data.train_self_pairs, np.int64).reshape(-1, 2)
  own = np.stack([train_row_new[own[:, 0]], new_id[own[:, 1]]], 1) if len(own) else own
  return dataclasses.replace(
    data,
    num_labels=size,
    train_tokens=train_tokens,
    train_labels=train_labels,
    test_tokens=RowSubset(data.test_tokens, test_rows),
    test_labels=test_labels,
    label_tokens=label_tokens,
    test_filter=f[(f >= 0).all(1)] if len(f) else f,
    num_train_original=len(train_rows),
    train_self_pairs=own[(own >= 0).all(1)] if len(own) else own,
  )
