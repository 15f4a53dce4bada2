"""benchmarks/outer_split.py: the written dataset splits the source's training rows into two
disjoint parts, rows keep their labels, the held-out part is the trainer's validation carve,
and the source's test split is not read."""

import os

import pytest
from benchmark_import import benchmark_module

from astra_jax.data import dataset, xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.data.validation import SplitSpec, split_rows
from astra_jax.runtime.errors import InputError


def _outer_split():
  return benchmark_module("outer_split")


def _write_source(d, label_texts=True):
  # Ten training rows with distinct texts, so that a row is found again by its text.
  train = [f"package{i}: tool number {i}" for i in range(10)]
  train_y = [[i % 4, 4 + i % 3] for i in range(10)]
  os.makedirs(d / "raw_data")
  xc_format.write_texts(d / "raw_data" / "train.raw.txt", train, layout="uid")
  # The test split holds a row the outer split must not pick up.
  xc_format.write_texts(d / "raw_data" / "test.raw.txt", ["never read"], layout="uid")
  if label_texts:
    labels = [f"label{j}: what it is" for j in range(7)]
    xc_format.write_texts(d / "raw_data" / "label.raw.txt", labels, layout="uid")
  xc_format.write_sparse(d / "trn_X_Y.txt", SparseRows.from_lists(train_y, 7))
  xc_format.write_sparse(d / "tst_X_Y.txt", SparseRows.from_lists([[6]], 7))
  return train, train_y


def test_outer_split_partitions_the_training_rows(tmp_path):
  src, out = tmp_path / "src", tmp_path / "out"
  train, train_y = _write_source(src)
  n_train, n_test = _outer_split().write_outer_split(str(src), str(out), 0.3, 7)
  assert (n_train, n_test) == (7, 3)
  read = lambda name: xc_format.read_texts(str(out / "raw_data" / f"{name}.raw.txt"))
  out_train, out_test = read("train"), read("test")
  keep, held = split_rows(10, SplitSpec(0.3, 7))
  assert out_test == [train[i] for i in held] and out_train == [train[i] for i in keep]
  assert dataset.detect_layout(str(out)) == "ngame"
  for texts, labels_file in ((out_train, "trn_X_Y.txt"), (out_test, "tst_X_Y.txt")):
    labels = xc_format.read_sparse(str(out / labels_file))
    assert labels.num_cols == 7
    for r, text in enumerate(texts):
      assert labels.row(r).tolist() == train_y[train.index(text)]
  assert read("label") == [f"label{j}: what it is" for j in range(7)]


def test_outer_split_needs_label_texts(tmp_path):
  src = tmp_path / "src"
  _write_source(src, label_texts=False)
  with pytest.raises(InputError, match="no label texts"):
    _outer_split().write_outer_split(str(src), str(tmp_path / "out"), 0.3, 7)
