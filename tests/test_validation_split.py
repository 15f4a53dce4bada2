"""data.validation_fraction: the held-out rows, and what training and evaluation see."""

import dataclasses

import ml_collections
import numpy as np
import pytest

from astra_jax.data import validation
from astra_jax.data.dataset import RowConcat, XCData
from astra_jax.data.sparse_rows import SelectedRows, SparseRows, WithLabelRows
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
  keep, val = validation.split_rows(100, validation.SplitSpec(0.1, 3))
  assert len(val) == 10 and len(keep) == 90
  assert sorted(np.concatenate([keep, val]).tolist()) == list(range(100))
  again_keep, again_val = validation.split_rows(100, validation.SplitSpec(0.1, 3))
  np.testing.assert_array_equal(val, again_val)
  assert not np.array_equal(val, validation.split_rows(100, validation.SplitSpec(0.1, 4))[1])


def test_a_cap_holds_out_the_first_rows_of_the_same_draw():
  # Uncapped, 0.5 of 40 rows is 20; a cap of 6 holds out 6 of those 20, and every other
  # row trains.
  _, uncapped = validation.split_rows(40, validation.SplitSpec(0.5, 5))
  keep, val = validation.split_rows(40, validation.SplitSpec(0.5, 5, max_rows=6))
  assert len(uncapped) == 20 and len(val) == 6 and set(val) <= set(uncapped)
  assert sorted(np.concatenate([keep, val]).tolist()) == list(range(40))
  # Smaller caps hold out nested sets, so a choice read on fewer rows reads a subset.
  _, fewer = validation.split_rows(40, validation.SplitSpec(0.5, 5, max_rows=3))
  assert set(fewer) <= set(val)
  # At or above the fraction's count (or 0) the cap changes nothing.
  for cap in (0, 20, 1000):
    _, same = validation.split_rows(40, validation.SplitSpec(0.5, 5, max_rows=cap))
    np.testing.assert_array_equal(same, uncapped)


def test_the_split_read_from_a_config():
  c = ml_collections.ConfigDict(
    {"validation_fraction": 0.2, "validation_seed": 7, "validation_max_rows": 3}
  )
  assert validation.SplitSpec.from_config(c) == validation.SplitSpec(0.2, 7, 3)
  # A config written before the cap existed (a run's config.json) holds out as before.
  assert validation.SplitSpec.from_config({"validation_fraction": 0.2}).held_out(100) == 20
  data, tokens, _ = _data()
  split = validation.carve(data, validation.SplitSpec.from_config(c))
  assert split.validation.test_labels.num_rows == 3 and split.train.num_train_original == 17


def test_carve_holds_out_rows_with_their_labels_and_keeps_label_text_rows():
  data, tokens, rows = _data()
  split = validation.carve(data, validation.SplitSpec(0.25, 0))
  keep, val = validation.split_rows(20, validation.SplitSpec(0.25, 0))
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
  split = validation.carve(data, validation.SplitSpec(0.5, 1))
  assert len(split.train.train_tokens) == 10 and split.validation.test_labels.num_rows == 10
  with pytest.raises(InputError, match="validation_fraction"):
    validation.carve(data, validation.SplitSpec(0.01, 0))  # rounds to no validation row


def _unweighted(rows: SparseRows) -> SparseRows:
  """The same rows as a label cache holds them: no values array (every value one)."""
  return SparseRows(rows.indptr, rows.indices, None, rows.num_cols)


@pytest.mark.parametrize("with_texts", [False, True])
def test_kept_rows_read_the_label_rows_in_place(with_texts):
  """Without values (a label cache), the kept rows are row ids into the data's rows, not a
  copy: every read equals the copy a dense reference picks, and the label-text rows stay."""
  data, _, rows = _data(augmented=False)
  original = _unweighted(data.train_labels)
  labels = WithLabelRows(original) if with_texts else original
  data = dataclasses.replace(data, train_labels=labels)
  split = validation.carve(data, validation.SplitSpec(0.25, 0))
  keep, val = validation.split_rows(20, validation.SplitSpec(0.25, 0))
  got = split.train.train_labels
  inner = got.base if with_texts else got
  assert isinstance(inner, SelectedRows) and inner.base is original
  dense = np.zeros((20, 6), np.float32)
  for i, r in enumerate(rows):
    dense[i, r] = 1.0
  want = dense[keep]
  if with_texts:
    want = np.concatenate([want, np.eye(6, dtype=np.float32)])
  np.testing.assert_array_equal(got.to_dense(), want)
  assert got.num_rows == len(want) and got.nnz == int(want.sum())
  np.testing.assert_array_equal(got.column_counts(), want.sum(0))
  np.testing.assert_array_equal(split.validation.test_labels.to_dense(), dense[val])


def test_selected_rows_against_a_dense_reference():
  """Every read of SelectedRows, with and without the complement's shortcut, equals the
  same reads of the rows picked from a dense matrix by hand."""
  base = _unweighted(SparseRows.from_lists([[0, 2], [], [1, 2, 3], [3], [0, 1], [2]], 4))
  dense = base.to_dense()
  pick = np.array([5, 2, 0, 3])
  complement = _unweighted(SparseRows.from_lists([[], [0, 1]], 4))  # rows 1 and 4
  for rows in (SelectedRows(base, pick), SelectedRows(base, pick, complement=complement)):
    want = dense[pick]
    np.testing.assert_array_equal(rows.to_dense(), want)
    assert rows.num_rows == 4 and rows.nnz == 7 and rows.max_row_length() == 3
    np.testing.assert_array_equal(rows.column_counts(), want.sum(0))
    np.testing.assert_array_equal(rows.row_lengths(), [1, 3, 2, 1])
    np.testing.assert_array_equal(rows.row_lengths(np.array([3, 1])), [1, 3])
    which, ids = rows.entries(np.array([1, 3, 1]))
    np.testing.assert_array_equal(which, [0, 0, 0, 1, 2, 2, 2])
    np.testing.assert_array_equal(ids, [1, 2, 3, 3, 1, 2, 3])
    assert rows.row(2).tolist() == [0, 2]
    np.testing.assert_array_equal(rows.head(2).to_dense(), want[:2])
    blocks = list(rows.blocks(3))
    assert [b.num_rows for b in blocks] == [3, 1]
    np.testing.assert_array_equal(np.concatenate([b.to_dense() for b in blocks]), want)
  with pytest.raises(ValueError, match="complement"):
    SelectedRows(base, pick, complement=complement.head(1))
  with pytest.raises(ValueError, match="unweighted"):
    SelectedRows(SparseRows.from_lists([[0]], 1), np.array([0]))


@pytest.mark.parametrize("block", [1, 2, 1 << 16])
def test_take_rows_in_blocks_copies_the_rows_asked(monkeypatch, block):
  """take_rows reads `block` rows at a time into one copy: the rows a dense reference picks,
  in the order asked, repeats and label-text rows included."""
  monkeypatch.setattr(validation, "TAKE_BLOCK_ROWS", block)
  base = _unweighted(SparseRows.from_lists([[0, 2], [], [1, 2, 3], [3], [0, 1]], 4))
  labels = WithLabelRows(base)
  pick = np.array([6, 4, 1, 2, 2, 0, 8])
  got = validation.take_rows(labels, pick)
  np.testing.assert_array_equal(got.to_dense(), labels.to_dense()[pick])
  assert got.indices.dtype == np.int32 and got.values is None
