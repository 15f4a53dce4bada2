"""The chunked label reader against an independent parser, the binary label cache, the
virtual label-text rows, and resumable streaming tokenization."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from astra_jax.data import csr_files, label_cache, sparse_reader, synthetic, tokenize, xc_format
from astra_jax.data.sparse_rows import (
  SelectedRows,
  SparseRows,
  StackedRows,
  WithLabelRows,
  XCFormatError,
)
from astra_jax.negatives import refresh

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference(text: str) -> tuple[list[list[tuple[int, float]]], int]:
  """A plain-Python reading of the format: each row's (label, value) pairs sorted, a label
  listed twice keeping its first value, a pair without ':' meaning value one."""
  lines = text.replace("\r\n", "\n").split("\n")
  rows, cols = map(int, lines[0].split())
  out = []
  for line in lines[1 : 1 + rows]:
    first = {}
    for token in line.split():
      label, _, value = token.partition(":")
      first.setdefault(int(label), float(value) if value else 1.0)
    out.append(sorted(first.items()))
  return out, cols


def random_file(rng, rows: int, cols: int, values: tuple[str, ...], quirks: bool) -> str:
  lines = []
  for _ in range(rows):
    ids = rng.integers(0, cols, rng.integers(0, 7))
    if not quirks:
      ids = np.unique(ids)
    tokens = [
      f"{i}:{rng.choice(values)}" if not quirks or rng.random() > 0.1 else f"{i}" for i in ids
    ]
    sep = str(rng.choice([" ", "  ", "\t"])) if quirks else " "
    lines.append(sep.join(tokens) + ("\r" if quirks and rng.random() < 0.2 else ""))
  trailing = "\n\n" if quirks else "\n"
  return f"{rows} {cols}\n" + "\n".join(lines) + trailing


def as_pairs(m: SparseRows) -> list[list[tuple[int, float]]]:
  return [list(zip(m.row(i).tolist(), m.row_values(i).tolist())) for i in range(m.num_rows)]


@pytest.mark.parametrize("block_bytes", [16, 100, 1 << 20])
@pytest.mark.parametrize(
  "seed, values, quirks",
  [
    (0, ("1",), False),
    (1, ("1.0", "1.000000"), False),
    (2, ("0.5", "1", ".25", "3."), False),
    (3, ("1.0", "0.5"), True),
    (4, ("1",), True),
  ],
)
def test_reader_matches_a_plain_parser(tmp_path, monkeypatch, block_bytes, seed, values, quirks):
  monkeypatch.setattr(label_cache._LabelCounter, "BATCH", 64)  # counts over many batches
  text = random_file(np.random.default_rng(seed), 300, 50, values, quirks)
  path = tmp_path / "trn_X_Y.txt"
  path.write_text(text)
  want, cols = reference(text)
  got = sparse_reader.read_sparse(path, block_bytes=block_bytes)
  assert got.num_cols == cols and as_pairs(got) == want
  assert (got.values is None) == all(v == 1.0 for row in want for _, v in row)
  cached = label_cache.cached_labels(str(path), str(tmp_path / "cache"))
  assert as_pairs(cached) == want
  np.testing.assert_array_equal(
    cached.column_counts(), np.bincount([l for row in want for l, _ in row], minlength=cols)
  )
  assert cached.max_row_length() == max(len(r) for r in want)


def test_well_formed_blocks_take_the_vectorised_path(tmp_path, monkeypatch):
  path = tmp_path / "trn_X_Y.txt"
  path.write_text(random_file(np.random.default_rng(5), 500, 1000, ("1.0",), False))
  monkeypatch.setattr(
    sparse_reader.SparseFileReader,
    "_parse_lines",
    lambda *a: pytest.fail("the line parser ran on a well-formed block"),
  )
  reader = sparse_reader.SparseFileReader(path, block_bytes=256)
  assert sum(len(b.lengths) for b in reader.blocks()) == 500


def test_unsorted_and_repeated_labels_in_the_vectorised_path(tmp_path):
  path = tmp_path / "m.txt"
  path.write_text("3 10\n5:1 2:1 9:1\n\n7:1 7:1 1:1 7:1\n")
  m = sparse_reader.read_sparse(path)
  assert [m.row(i).tolist() for i in range(3)] == [[2, 5, 9], [], [1, 7]] and m.values is None


@pytest.mark.parametrize(
  "text, line, message",
  [
    ("2 5\n0:1\n", None, "header says 2 rows, file has 1"),
    ("1 5\n0:1\n1:1\n", 3, "more rows than the header's 1"),
    ("2 5\n0:1\n3:1 5:1\n", 3, "label id 5 out of range"),
    ("2 5\n0:1\n3;1\n", 3, "malformed pair '3;1'"),
    ("2 5\n0:1\n3:\n", 3, "malformed pair '3:'"),
    ("2 5\n0:1\n3:1:1\n", 3, "malformed pair '3:1:1'"),
    ("2 5\n0:1\n3:1..0\n", 3, "malformed pair '3:1..0'"),
    ("1 5\n0:1\n\n\n" + "\n" * 40 + "2:1\n", 45, "more rows than the header's 1"),
    ("two 5\n", 1, "bad header"),
  ],
)
def test_the_cache_gives_the_readers_errors(tmp_path, monkeypatch, text, line, message):
  monkeypatch.setattr(sparse_reader, "BLOCK_BYTES", 8)  # errors in a later block, too
  path = tmp_path / "trn_X_Y.txt"
  path.write_text(text)
  with pytest.raises(XCFormatError, match=message) as e:
    label_cache.cached_labels(str(path), str(tmp_path / "cache"))
  assert str(e.value).startswith(f"{path}:{line}:" if line else f"{path}:")
  assert not [f for f in os.listdir(tmp_path / "cache") if ".npy" in f]  # nothing half-built


def test_cache_is_built_once_and_rebuilt_when_the_source_changes(tmp_path):
  path, cache = tmp_path / "trn_X_Y.txt", tmp_path / "cache"
  path.write_text("2 4\n0:1 3:1\n1:0.5\n")
  m = label_cache.cached_labels(str(path), str(cache))
  assert isinstance(m.indices, np.memmap) and m.row_values(1).tolist() == [0.5]
  stem = label_cache.cache_stem(str(path), str(cache))
  mtime = os.stat(stem + ".indices.npy").st_mtime_ns
  label_cache.cached_labels(str(path), str(cache))
  assert os.stat(stem + ".indices.npy").st_mtime_ns == mtime  # opened, not parsed again
  with pytest.raises(XCFormatError, match="header says 4 columns, expected 5"):
    label_cache.cached_labels(str(path), str(cache), num_cols=5)
  path.write_text("1 4\n2:1\n")
  m = label_cache.cached_labels(str(path), str(cache))
  assert m.num_rows == 1 and m.values is None and not os.path.exists(stem + ".values.npy")


def test_processes_racing_for_one_cache_build_it_once(tmp_path):
  path, cache = tmp_path / "trn_X_Y.txt", tmp_path / "cache"
  path.write_text(random_file(np.random.default_rng(6), 20000, 100, ("1",), False))
  code = (
    "import sys; from astra_jax.data import label_cache as c; build = c.build\n"
    "def counted(*a, **k): print('built', file=sys.stderr); return build(*a, **k)\n"
    "c.build = counted; print(c.cached_labels(sys.argv[1], sys.argv[2]).nnz)"
  )
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", code, str(path), str(cache)],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      cwd=REPO,
      env=dict(os.environ, PYTHONPATH=REPO),
    )
    for _ in range(3)
  ]
  outs = [p.communicate() for p in procs]
  assert all(p.returncode == 0 for p in procs), outs
  assert len({o for o, _ in outs}) == 1
  built = sum("built" in err for _, err in outs)
  assert built == 1, [err for _, err in outs]
  assert not [f for f in os.listdir(cache) if ".tmp-" in f]


def test_label_text_rows_are_an_identity_block():
  base = SparseRows.from_lists([[0, 2], [], [1, 2, 3]], 4)
  stacked = base.vstack(SparseRows(np.arange(5), np.arange(4, dtype=np.int32), None, 4))
  rows = WithLabelRows(base)
  assert rows.num_rows == 7 and rows.nnz == stacked.nnz
  np.testing.assert_array_equal(rows.to_dense(), stacked.to_dense())
  np.testing.assert_array_equal(rows.column_counts(), stacked.column_counts())
  np.testing.assert_array_equal(rows.row_lengths(), stacked.row_lengths())
  pick = np.array([6, 0, 3, 2, 1, 5])
  for got, want in zip(rows.entries(pick), stacked.entries(pick)):
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(rows.row_lengths(pick), stacked.row_lengths(pick))
  assert rows.head(3) is base and rows.max_row_length() == 3
  assert [rows.row(i).tolist() for i in range(7)] == [stacked.row(i).tolist() for i in range(7)]


def test_stacked_rows_read_as_their_rows_one_after_another():
  """StackedRows(first, second) against the same rows written out by hand."""
  first = SparseRows.from_lists([[0, 2], [], [1, 2, 3]], 4)
  second = SparseRows.from_lists([[3], [0, 1]], 4)
  rows = StackedRows(first, second)
  by_hand = SparseRows.from_lists([[0, 2], [], [1, 2, 3], [3], [0, 1]], 4)
  assert rows.num_rows == 5 and rows.nnz == 8
  np.testing.assert_array_equal(rows.to_dense(), by_hand.to_dense())
  np.testing.assert_array_equal(rows.row_lengths(), [2, 0, 3, 1, 2])
  pick = np.array([4, 0, 3, 1, 2, 4])
  which, labels = rows.entries(pick)
  np.testing.assert_array_equal(which, [0, 0, 1, 1, 2, 4, 4, 4, 5, 5])
  np.testing.assert_array_equal(labels, [0, 1, 0, 2, 3, 1, 2, 3, 0, 1])
  np.testing.assert_array_equal(rows.row_lengths(pick), [2, 2, 1, 0, 3, 2])
  assert rows.head(3) is first and rows.head(5) is rows
  np.testing.assert_array_equal(rows.head(4).to_dense(), by_hand.to_dense()[:4])
  blocks = list(rows.blocks(2))
  assert [b.num_rows for b in blocks] == [2, 1, 2]
  np.testing.assert_array_equal(np.concatenate([b.to_dense() for b in blocks]), by_hand.to_dense())


@pytest.mark.parametrize("block", [2, 3, 1 << 24])
def test_label_rows_are_written_as_numpy_writes_them(tmp_path, monkeypatch, block):
  """csr_files streams blocks of `block` elements of one or several parts (a head view and
  the label-text identity among them): np.load reads the arrays np.savez and np.save write
  of the same rows."""
  monkeypatch.setattr(csr_files, "WRITE_BLOCK", block)
  first = SparseRows.from_lists([[0, 2], [], [1, 2, 3]], 4)
  second = SparseRows.from_lists([[3], [0, 1], [2]], 4)
  by_hand = SparseRows.from_lists([[0, 2], [], [1, 2, 3], [3], [0, 1]], 4)
  with_texts = SparseRows.from_lists([[0, 2], [], [1, 2, 3], [0], [1], [2], [3]], 4)
  unweighted = SparseRows(by_hand.indptr, by_hand.indices, None, 4)
  picked = SparseRows.from_lists([[0, 1], [1, 2, 3], [0, 2]], 4)
  cases = [
    (StackedRows(first, second).head(5), by_hand),
    (first, first),
    (WithLabelRows(first), with_texts),
    (SelectedRows(unweighted, np.array([4, 2, 0])), picked),
  ]
  for i, (rows, want) in enumerate(cases):
    npz, stem = str(tmp_path / f"rows{i}.npz"), str(tmp_path / f"rows{i}")
    csr_files.save_npz(rows, npz)
    paths = csr_files.save_npy(rows, stem)
    with np.load(npz) as got:
      assert sorted(got.files) == ["indices", "indptr"]
      for name, array in (("indptr", want.indptr), ("indices", want.indices)):
        for read in (got[name], np.load(paths[name], mmap_mode="r")):
          assert read.dtype == array.dtype
          np.testing.assert_array_equal(read, array)


def test_refresh_worker_maps_the_label_cache(tmp_path):
  path = tmp_path / "trn_X_Y.txt"
  path.write_text("2 3\n0:1 2:1\n1:1\n")
  cached = label_cache.cached_labels(str(path), str(tmp_path / "cache"))
  for labels in (cached, WithLabelRows(cached)):
    src = refresh.positives_source(labels, str(tmp_path))
    assert src.endswith(".json") and os.path.getsize(src) < 1000  # a name, not a copy
    loaded = refresh.load_labels(src)
    assert isinstance(loaded, type(labels))
    np.testing.assert_array_equal(loaded.to_dense(), labels.to_dense())
  # Rows a validation split keeps: their row ids written beside the JSON, the cache mapped.
  kept = SelectedRows(cached, np.array([1]))
  for labels in (kept, WithLabelRows(kept)):
    src = refresh.positives_source(labels, str(tmp_path))
    with open(src) as f:
      assert os.path.getsize(json.load(f)["rows"]) < 1000  # the row ids only
    loaded = refresh.load_labels(src)
    inner = loaded.base if isinstance(labels, WithLabelRows) else loaded
    assert isinstance(inner, SelectedRows) and isinstance(inner.base.indices, np.memmap)
    assert not inner.rows.flags.owndata  # a view of the mapped file
    np.testing.assert_array_equal(loaded.to_dense(), labels.to_dense())
  # Rows in RAM: written beside the JSON and mapped, not loaded.
  in_ram = SparseRows.from_lists([[1], [0]], 2)
  for labels in (in_ram, WithLabelRows(in_ram)):
    loaded = refresh.load_labels(refresh.positives_source(labels, str(tmp_path)))
    assert isinstance(loaded.indices, np.memmap) and loaded.values is None
    np.testing.assert_array_equal(loaded.to_dense(), labels.to_dense())


class Killed(BaseException):
  """What a kill looks like to the build: no `except Exception` stops it."""


@pytest.fixture()
def word_tokenizer(tmp_path):
  d = tmp_path / "tok"
  synthetic.write_word_tokenizer(str(d), ["red", "apple", "green", "pear"])
  return str(d)


def test_tokenization_streams_and_resumes_after_a_kill(tmp_path, word_tokenizer, monkeypatch):
  src = tmp_path / "trn_X.txt"
  words = ["red", "apple", "green", "pear"]
  rng = np.random.default_rng(0)
  src.write_text("\n".join(" ".join(rng.choice(words, rng.integers(0, 6))) for _ in range(50)))
  whole = tokenize.tokenize_texts(
    xc_format.read_texts(src), tokenize.load_tokenizer(word_tokenizer), 4
  )
  monkeypatch.setattr(tokenize, "_BATCH", 4)
  monkeypatch.setattr(tokenize, "_CHECKPOINT_ROWS", 8)
  real, calls, killed = tokenize.tokenize_texts, [], []

  def dies_after_five_batches(texts, *a, **k):
    calls.append(len(texts))
    if len(calls) == 6 and not killed:
      killed.append(True)
      raise Killed
    return real(texts, *a, **k)

  monkeypatch.setattr(tokenize, "tokenize_texts", dies_after_five_batches)
  with pytest.raises(Killed):
    tokenize.cached_tokens(str(src), str(tmp_path / "c"), word_tokenizer, 4)
  calls.clear()
  tokens = tokenize.cached_tokens(str(src), str(tmp_path / "c"), word_tokenizer, 4)
  assert sum(calls) == 50 - 16  # resumed after the last checkpoint (16 rows)
  np.testing.assert_array_equal(tokens, whole)
  assert sorted(os.listdir(tmp_path / "c")) == [
    "trn_X.L4.lock",
    "trn_X.L4.meta.json",
    "trn_X.L4.tokens.npy",
  ]
