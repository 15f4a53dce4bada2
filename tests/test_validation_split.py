"""data.validation_fraction: the held-out rows, and what training and evaluation see."""

import numpy as np
import pytest

from astra_jax.data import validation
from astra_jax.data.dataset import RowConcat, XCData
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.runtime.errors import InputError


def _data(n=20, labels=6, augmented=True):
  tokens = np.arange(n * 3, dtype=np.int32).reshape(n, 3)
  rows = [[i % labels, (i + 1) % labels] for i in range(n)]
  train_labels = SparseRows.from_lists(rows, labels)
  label_tokens = 1000 + np.arange(labels * 3, dtype=np.int32).reshape(labels, 3)
  train_tokens = tokens
  if augmented:
    train_tokens = RowConcat(tokens, label_tokens)
    train_labels = train_labels.vstack(SparseRows.from_lists([[l] for l in range(labels)], labels))
  return (
    XCData(
      "d",
      labels,
      train_tokens,
      train_labels,
      tokens[:4],
      train_labels.head(4),
      label_tokens,
      np.array([[0, 1]]),
      0,
      2000,
      n,
    ),
    tokens,
    rows,
  )


def test_split_is_a_deterministic_partition():
  keep, val = validation.split_rows(100, 0.1, seed=3)
  assert len(val) == 10 and len(keep) == 90
  assert sorted(np.concatenate([keep, val]).tolist()) == list(range(100))
  again_keep, again_val = validation.split_rows(100, 0.1, seed=3)
  np.testing.assert_array_equal(val, again_val)
  assert not np.array_equal(val, validation.split_rows(100, 0.1, seed=4)[1])


def test_carve_holds_out_rows_with_their_labels_and_keeps_label_text_rows():
  data, tokens, rows = _data()
  split = validation.carve(data, 0.25, seed=0)
  keep, val = validation.split_rows(20, 0.25, seed=0)
  tr, va = split.train, split.validation
  assert tr.num_train_original == 15 and len(tr.train_tokens) == 15 + 6
  np.testing.assert_array_equal(tr.train_tokens[np.arange(15)], tokens[keep])
  # The label-text rows follow, with their one label each.
  np.testing.assert_array_equal(tr.train_tokens[np.arange(15, 21)], data.label_tokens)
  assert [tr.train_labels.row(15 + l).tolist() for l in range(6)] == [[l] for l in range(6)]
  assert [tr.train_labels.row(i).tolist() for i in range(15)] == [rows[r] for r in keep]
  # Validation: the held-out rows as queries, their labels as truth, no filter pairs.
  np.testing.assert_array_equal(va.test_tokens[:], tokens[val])
  assert [va.test_labels.row(i).tolist() for i in range(5)] == [rows[r] for r in val]
  assert va.test_filter.shape == (0, 2)
  # The test split is untouched in the training view.
  np.testing.assert_array_equal(tr.test_tokens, data.test_tokens)


def test_carve_without_augmentation_and_bad_fractions():
  data, tokens, _ = _data(augmented=False)
  split = validation.carve(data, 0.5, seed=1)
  assert len(split.train.train_tokens) == 10 and split.validation.test_labels.num_rows == 10
  with pytest.raises(InputError, match="validation_fraction"):
    validation.carve(data, 0.01, seed=0)  # rounds to no validation row
