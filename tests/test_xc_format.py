import gzip
import json

import numpy as np
import pytest

from astra_jax.data import xc_format
from astra_jax.data.sparse_rows import SparseRows, XCFormatError


def write(path, text):
  path.write_text(text)
  return str(path)


def test_sparse_round_trip(tmp_path):
  m = SparseRows.from_lists([[0, 4], [], [2]], 5, [[1.0, 0.5], [], [2.0]])
  xc_format.write_sparse(tmp_path / "m.txt", m)
  assert (tmp_path / "m.txt").read_text() == "3 5\n0:1 4:0.5\n\n2:2\n"
  r = xc_format.read_sparse(tmp_path / "m.txt")
  np.testing.assert_array_equal(r.to_dense(), m.to_dense())
  assert r.num_rows == 3 and r.num_cols == 5


def test_unsorted_rows_are_sorted(tmp_path):
  r = xc_format.read_sparse(write(tmp_path / "m.txt", "1 6\n5:1 2:1 4:0.5\n"))
  assert list(r.row(0)) == [2, 4, 5] and list(r.row_values(0)) == [1.0, 0.5, 1.0]


def test_a_label_listed_twice_is_one_positive(tmp_path):
  r = xc_format.read_sparse(write(tmp_path / "m.txt", "2 6\n5:1 2:0.5 5:0.7\n1:1\n"))
  assert list(r.row(0)) == [2, 5] and list(r.row_values(0)) == [0.5, 1.0]
  assert list(r.row(1)) == [1]
  with gzip.open(tmp_path / "trn.json.gz", "wt") as f:
    f.write(
      json.dumps(
        {"uid": "a", "title": "t", "target_ind": [3, 1, 3], "target_rel": [0.25, 0.5, 0.75]}
      )
      + "\n"
    )
  j = xc_format.read_json_labels(tmp_path / "trn.json.gz", 4)
  assert list(j.row(0)) == [1, 3] and list(j.row_values(0)) == [0.5, 0.25]


@pytest.mark.parametrize(
  "text, line, message",
  [
    ("2 5\n0:1\n", None, "header says 2 rows, file has 1"),
    ("1 5\n0:1\n1:1\n", 3, "more rows than the header's 1"),
    ("2 5\n0:1\n3:1 5:1\n", 3, "label id 5 out of range"),
    ("2 5\n0:1\n3;1\n", 3, "malformed pair '3;1'"),
    ("2 5\n0:1 x:1\n\n", 2, "malformed pair 'x:1'"),
    ("two 5\n", 1, "bad header"),
    ("2 \u00b2\n0:1\n\n", 1, "bad header"),  # '²' passes str.isdigit, not int()
    ("2 5\n0:1\n18446744073709551616:1\n", 3, "label id 18446744073709551616 out of range"),
    ("99999999999999 5\n0:1\n", None, "header says 99999999999999 rows, file has 1"),  # no alloc
    ("", 1, "empty file"),
  ],
)
def test_bad_sparse_files_name_file_and_line(tmp_path, text, line, message):
  path = write(tmp_path / "trn_X_Y.txt", text)
  with pytest.raises(XCFormatError, match=message) as e:
    xc_format.read_sparse(path)
  where = f"{path}:{line}:" if line else f"{path}:"
  assert str(e.value).startswith(where)


def test_expected_columns(tmp_path):
  path = write(tmp_path / "tst_X_Y.txt", "1 4\n0:1\n")
  with pytest.raises(XCFormatError, match="header says 4 columns, expected 5"):
    xc_format.read_sparse(path, num_cols=5)


def test_unreadable_files(tmp_path):
  with pytest.raises(XCFormatError, match="cannot open"):
    xc_format.read_sparse(tmp_path / "missing.txt")
  (tmp_path / "bad.txt.gz").write_bytes(b"\x1f\x8b\x08garbage")
  with pytest.raises(XCFormatError, match=r"bad.txt.gz:1: unreadable"):
    xc_format.read_sparse(tmp_path / "bad.txt.gz")
  (tmp_path / "latin.txt").write_bytes(b"hello\n\xff\xfe\n")
  with pytest.raises(XCFormatError, match=r"latin.txt:2: unreadable"):
    xc_format.read_texts(tmp_path / "latin.txt")


def test_text_layouts(tmp_path):
  texts = ["a red apple", "blue sky", ""]
  xc_format.write_texts(tmp_path / "trn_X.txt", texts)
  xc_format.write_texts(tmp_path / "train.raw.txt", texts, layout="uid")
  assert (tmp_path / "train.raw.txt").read_text().splitlines()[1] == "1->blue sky"
  assert xc_format.read_texts(tmp_path / "trn_X.txt") == texts
  assert xc_format.read_texts(tmp_path / "train.raw.txt") == texts
  with gzip.open(tmp_path / "trn.json.gz", "wt") as f:
    for i, t in enumerate(texts):
      f.write(
        json.dumps(
          {
            "uid": str(i),
            "title": t,
            "content": "body",
            "target_ind": [i, 0],
            "target_rel": [1.0, 0.5],
          }
        )
        + "\n"
      )
  assert xc_format.read_texts(tmp_path / "trn.json.gz") == texts
  assert xc_format.read_texts(tmp_path / "trn.json.gz", use_content=True)[1] == "blue sky body"
  write(tmp_path / "nulls.json", '{"title": "t", "content": null}\n{"title": null}\n')
  assert xc_format.read_texts(tmp_path / "nulls.json", "json", use_content=True) == ["t", ""]
  labels = xc_format.read_json_labels(tmp_path / "trn.json.gz", 3)
  # row 0 lists label 0 twice (target_ind [0, 0]): one positive
  assert [list(labels.row(i)) for i in range(3)] == [[0], [0, 1], [0, 2]]


def test_bad_text_lines(tmp_path):
  path = write(tmp_path / "test.raw.txt", "0->ok\nno arrow here\n")
  with pytest.raises(XCFormatError, match=r"test.raw.txt:2: expected 'uid->text'"):
    xc_format.read_texts(path)
  path = write(tmp_path / "tst.json", '{"title": "x"}\n{"title": \n')
  with pytest.raises(XCFormatError, match=r"tst.json:2: invalid JSON"):
    xc_format.read_texts(path)
  path = write(tmp_path / "lbl.json", '{"title": "x", "target_ind": [7]}\n')
  with pytest.raises(XCFormatError, match=r"lbl.json:1: label id 7 out of range"):
    xc_format.read_json_labels(path, 5)


def test_filter_file(tmp_path):
  f = xc_format.read_filter(write(tmp_path / "f.txt", "0 3\n2 1\n"), 3, 5)
  np.testing.assert_array_equal(f, [[0, 3], [2, 1]])
  with pytest.raises(XCFormatError, match=r"f2.txt:2: label id 9 out of range"):
    xc_format.read_filter(write(tmp_path / "f2.txt", "0 3\n1 9\n"), 3, 5)
  with pytest.raises(XCFormatError, match=r"f3.txt:1: expected 'row label'"):
    xc_format.read_filter(write(tmp_path / "f3.txt", "0,3\n"), 3, 5)
  for bad in ("--1 2", "\u00b9 2"):
    with pytest.raises(XCFormatError, match=r"f4.txt:2: expected 'row label'"):
      xc_format.read_filter(write(tmp_path / "f4.txt", f"0 3\n{bad}\n"), 3, 5)


def test_atomic_writer_leaves_nothing_on_error(tmp_path):
  target = tmp_path / "out.txt"
  target.write_text("old")
  with pytest.raises(RuntimeError):
    with xc_format.atomic_text_writer(target) as f:
      f.write("partial")
      raise RuntimeError
  assert target.read_text() == "old" and len(list(tmp_path.iterdir())) == 1
