"""data.filter_self: a row's own item (the label with the row's text) filtered from its
ranking, decided by the training labels under `auto`; the baselines follow the same rule."""

from unittest import mock

import numpy as np
import pytest

from astra_jax.data import self_filter, validation, xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import baselines
from astra_jax.training import train

LABELS = ["alpha: first", "beta: second", "gamma: third", "delta: fourth", "alpha: first"]


def test_identical_text_pairs_by_hand():
  rows = ["beta: second", "zeta: sixth", " alpha: first ", "gamma: third"]
  pairs = self_filter.identical_text_pairs(rows, LABELS)
  # "alpha: first" is the text of labels 0 and 4; surrounding blanks do not matter.
  np.testing.assert_array_equal(pairs, [[0, 1], [2, 0], [2, 4], [3, 2]])
  assert self_filter.identical_text_pairs(["x"], LABELS).shape == (0, 2)


def test_auto_filters_only_when_the_training_rows_never_list_their_own_item():
  pairs = np.array([[0, 1], [1, 2], [2, 3]])
  never = SparseRows.from_lists([[0], [0, 3], [1]], 5)
  assert self_filter.own_item_is_never_a_label(pairs, never) == (True, 0.0)
  # Search-like data: two of three rows' own items are their labels.
  often = SparseRows.from_lists([[1], [2], [0]], 5)
  on, share = self_filter.own_item_is_never_a_label(pairs, often)
  assert not on and share == pytest.approx(2 / 3)
  assert self_filter.own_item_is_never_a_label(np.zeros((0, 2), np.int64), never) == (False, 0.0)


def _write(d, own_is_label: bool, test_labels=((1,), (2,), (3,))):
  """Training rows 0-3 are items with label texts (rows 0, 1: labels 1, 2), test rows 0, 2
  are labels 3 and 0 themselves; `own_is_label`: the training rows list their own item."""
  (d / "raw_data").mkdir(parents=True)
  train_texts = ["beta: second", "gamma: third", "eps: fifth", "eta: seventh"]
  train_labels = [[0, 3], [0], [1], [2]] if not own_is_label else [[1], [2], [1], [2]]
  test_texts = ["delta: fourth", "theta: eighth", "alpha: first"]
  xc_format.write_texts(d / "raw_data" / "train.raw.txt", train_texts, layout="uid")
  xc_format.write_texts(d / "raw_data" / "test.raw.txt", test_texts, layout="uid")
  xc_format.write_texts(d / "raw_data" / "label.raw.txt", LABELS[:4], layout="uid")
  xc_format.write_sparse(d / "trn_X_Y.txt", SparseRows.from_lists(train_labels, 4))
  xc_format.write_sparse(
    d / "tst_X_Y.txt", SparseRows.from_lists([list(r) for r in test_labels], 4)
  )


@pytest.mark.parametrize(
  "mode, own_is_label, want",
  [
    ("off", False, []),
    ("auto", False, [[0, 3], [2, 0]]),
    ("auto", True, []),  # the training rows list themselves: nothing is filtered
    ("on", True, [[0, 3], [2, 0]]),
  ],
)
def test_dataset_filters_each_test_rows_own_item(tmp_path, load_config, mode, own_is_label, want):
  _write(tmp_path / "ds", own_is_label)
  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir, c.data.filter_self = str(tmp_path / "ds"), mode
  data = train.prepare_data(c)
  np.testing.assert_array_equal(data.test_filter.reshape(-1, 2), np.array(want).reshape(-1, 2))
  texts = baselines.load_texts(str(tmp_path / "ds"), filter_self=mode)
  np.testing.assert_array_equal(texts.test_filter.reshape(-1, 2), np.array(want).reshape(-1, 2))
  if mode == "auto" and not own_is_label:
    # The validation split's rows are training rows: rows 0 and 1 are labels 1 and 2.
    split = validation.carve(data, validation.SplitSpec(0.5, 0))
    _, val = validation.split_rows(4, validation.SplitSpec(0.5, 0))
    own = {0: 1, 1: 2}
    expect = [[i, own[r]] for i, r in enumerate(val) if r in own]
    keep, _ = validation.split_rows(4, validation.SplitSpec(0.5, 0))
    kept = [[i, own[r]] for i, r in enumerate(keep) if r in own]
    np.testing.assert_array_equal(
      split.train.train_self_pairs.reshape(-1, 2), np.array(kept).reshape(-1, 2)
    )
    np.testing.assert_array_equal(
      split.validation.test_filter.reshape(-1, 2), np.array(expect).reshape(-1, 2)
    )


def test_dataset_warns_when_a_filtered_own_item_is_a_test_label(tmp_path, load_config):
  # Test row 0 is label 3 and lists it: one of the two own-item pairs is a true label.
  _write(tmp_path / "ds", False, test_labels=((3,), (2,), (1,)))
  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir, c.data.filter_self = str(tmp_path / "ds"), "auto"
  with mock.patch.object(self_filter.logging, "warning") as warn:
    train.prepare_data(c)
  assert warn.call_count == 1 and warn.call_args.args[1] == pytest.approx(50.0)
  # The baselines read the same data through the same rule, and warn the same.
  with mock.patch.object(self_filter.logging, "warning") as warn:
    baselines.load_texts(str(tmp_path / "ds"), filter_self="auto")
  assert warn.call_count == 1 and warn.call_args.args[1] == pytest.approx(50.0)
  with mock.patch.object(self_filter.logging, "warning") as warn:
    _write(tmp_path / "ok", False)
    c.data.dir = str(tmp_path / "ok")
    train.prepare_data(c)
  warn.assert_not_called()


def test_filter_self_must_be_a_mode(load_config):
  from astra_jax.config import base as config_base

  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir, c.data.filter_self = "x", "yes"
  with pytest.raises(Exception, match=r"data\.filter_self"):
    config_base.validate(c)
