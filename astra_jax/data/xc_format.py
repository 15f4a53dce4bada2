"""Readers and writers for the Extreme Classification Repository file formats.

Sparse label matrices (`trn_X_Y.txt`): a header `rows cols`, then one line per row of
`label:value` pairs (0-based); an empty line is a row without labels. Text files come in
three layouts (see `read_texts`). Every parse error names the file and the 1-based line.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterable, Iterator

import numpy as np

from astra_jax.data import cache_files, sparse_reader
from astra_jax.data.sparse_rows import SparseRows, XCFormatError
from astra_jax.data.xc_lines import SIGNED_INT, SortedUnique, numbered_lines, open_binary
from astra_jax.runtime.errors import InputError


def read_sparse(path: str | os.PathLike, num_cols: int | None = None) -> SparseRows:
  """Reads a sparse matrix in the repository's text format (into RAM; `label_cache` keeps
  a large one on disk instead).

  Args:
    path: the file (`.gz` allowed).
    num_cols: when given, the header's column count must equal it.
  Returns:
    The rows, each sorted with every label once; `values` None when they are all one.
  """
  return sparse_reader.read_sparse(path, num_cols)


def write_sparse(path: str | os.PathLike, matrix: SparseRows, value_format: str = "{:g}") -> None:
  """Writes the repository format atomically (temporary name, then rename)."""
  with atomic_text_writer(path) as f:
    f.write(f"{matrix.num_rows} {matrix.num_cols}\n")
    for i in range(matrix.num_rows):
      idx, val = matrix.row(i), matrix.row_values(i)
      f.write(" ".join(f"{j}:{value_format.format(v)}" for j, v in zip(idx, val)))
      f.write("\n")


class atomic_text_writer:
  """Context manager: write to a temporary name unique across hosts (host, pid, random),
  rename onto `path` only on success."""

  def __init__(self, path: str | os.PathLike, mode: str = "w"):
    self.path = os.fspath(path)
    self.tmp = cache_files.temporary_name(self.path)
    self.mode = mode

  def __enter__(self):
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    if self.path.endswith(".gz"):
      self.f = gzip.open(self.tmp, self.mode + "t", encoding="utf-8")
    else:
      self.f = open(self.tmp, self.mode, encoding="utf-8")
    return self.f

  def __exit__(self, exc_type, exc, tb):
    self.f.close()
    if exc_type is None:
      os.replace(self.tmp, self.path)
    else:
      try:
        os.remove(self.tmp)
      except OSError:
        pass
    return False


# ---------------------------------------------------------------------------------------
# Texts. Layouts: "lines" (one text per line: trn_X.txt, tst_X.txt, Y.txt — Renée),
# "uid" (`uid->text` per line: raw_data/*.raw.txt — NGAME), "json" (the repository's
# {trn,tst,lbl}.json.gz: one object per line with uid, title, content).


def read_texts(
  path: str | os.PathLike, layout: str = "auto", use_content: bool = False
) -> list[str]:
  """Reads one text per row (all in RAM; `iter_texts` streams them).

  Args:
    path: the file.
    layout: "lines", "uid", "json" or "auto" (json for *.json[.gz], uid for *.raw.txt,
      else lines).
    use_content: json layout only: title + " " + content (full-text datasets) instead of
      the title alone (titles datasets).
  """
  return list(iter_texts(path, layout, use_content))


def iter_texts(
  path: str | os.PathLike, layout: str = "auto", use_content: bool = False
) -> Iterator[str]:
  """One text per row, one line at a time (arguments as `read_texts`'s)."""
  p = os.fspath(path)
  if layout == "auto":
    if p.endswith((".json", ".json.gz")):
      layout = "json"
    elif p.endswith(".raw.txt"):
      layout = "uid"
    else:
      layout = "lines"
  if layout not in ("lines", "uid", "json"):
    raise InputError(f"unknown text layout {layout!r}; use lines, uid, json or auto")
  for lineno, line in numbered_lines(p):
    if layout == "lines":
      yield line
    elif layout == "uid":
      uid, sep, text = line.partition("->")
      if not sep:
        raise XCFormatError(p, lineno, "expected 'uid->text'")
      yield text
    else:
      yield _json_text(p, lineno, line, use_content)


def _json_text(path: str, lineno: int, line: str, use_content: bool) -> str:
  if not line.strip():
    raise XCFormatError(path, lineno, "empty line in a JSON-lines file")
  try:
    obj = json.loads(line)
  except json.JSONDecodeError as e:
    raise XCFormatError(path, lineno, f"invalid JSON: {e.msg}") from None
  if not isinstance(obj, dict) or "title" not in obj:
    raise XCFormatError(path, lineno, "missing field 'title'")
  text = str(obj["title"] or "")  # JSON null: no text, not the word "None"
  if use_content:
    text = f"{text} {obj.get('content') or ''}".strip()
  return text


def count_lines(path: str | os.PathLike, block_bytes: int = 16 << 20) -> int:
  """Lines in a file (a last line without a newline counts), read in blocks."""
  count, last = 0, b"\n"
  with open_binary(path) as f:
    while True:
      try:
        block = f.read(block_bytes)
      except (EOFError, OSError, gzip.BadGzipFile) as e:
        raise XCFormatError(path, count + 1, f"unreadable: {e}") from e
      if not block:
        return count + (last != b"\n")
      count += block.count(b"\n")
      last = block[-1:]


def read_json_labels(path: str | os.PathLike, num_labels: int) -> SparseRows:
  """Label rows from the json.gz layout's `target_ind` (and `target_rel`) fields."""
  rows, vals = [], []
  sorted_unique = SortedUnique(path)
  for lineno, line in numbered_lines(path):
    try:
      obj = json.loads(line)
      ind = [int(i) for i in obj["target_ind"]]
      rel = [float(v) for v in obj.get("target_rel", [1.0] * len(ind))]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
      raise XCFormatError(path, lineno, f"bad record ({type(e).__name__}: {e})") from None
    for i in ind:
      if not 0 <= i < num_labels:
        raise XCFormatError(path, lineno, f"label id {i} out of range [0, {num_labels})")
    if len(rel) != len(ind):
      rel = [1.0] * len(ind)
    idx, val = sorted_unique(lineno, np.asarray(ind, np.int64), np.asarray(rel, np.float32))
    rows.append(idx.tolist())
    vals.append(val.tolist())
  sorted_unique.report()
  return SparseRows.from_lists(rows, num_labels, vals)


def write_texts(path: str | os.PathLike, texts: Iterable[str], layout: str = "lines") -> None:
  with atomic_text_writer(path) as f:
    for i, t in enumerate(texts):
      t = t.replace("\n", " ")
      if layout == "uid":
        f.write(f"{i}->{t}\n")
      elif layout == "json":
        f.write(json.dumps({"uid": str(i), "title": t, "content": ""}) + "\n")
      else:
        f.write(t + "\n")


def read_filter(
  path: str | os.PathLike, num_rows: int | None = None, num_labels: int | None = None
) -> np.ndarray:
  """Reads `row label` pairs (0-based) into an (n, 2) int64 array."""
  pairs = []
  for lineno, line in numbered_lines(path):
    if not line.strip():
      continue
    parts = line.split()
    if len(parts) != 2 or not all(SIGNED_INT.fullmatch(p) for p in parts):
      raise XCFormatError(path, lineno, f"expected 'row label', got {line!r}")
    r, l = int(parts[0]), int(parts[1])
    if r < 0 or (num_rows is not None and r >= num_rows):
      raise XCFormatError(path, lineno, f"row {r} out of range [0, {num_rows})")
    if l < 0 or (num_labels is not None and l >= num_labels):
      raise XCFormatError(path, lineno, f"label id {l} out of range [0, {num_labels})")
    pairs.append((r, l))
  return np.asarray(pairs, np.int64).reshape(-1, 2)


def check_same_rows(texts_path: str, num_texts: int, labels_path: str, num_label_rows: int) -> None:
  if num_texts != num_label_rows:
    raise XCFormatError(
      texts_path, None, f"{num_texts} texts but {labels_path} has {num_label_rows} label rows"
    )


def write_raw_dataset(
  outdir: str | os.PathLike,
  points: list[tuple[str, list[str]]],
  label_texts: dict[str, str],
  test_fraction: float = 0.3,
  seed: int = 0,
) -> tuple[int, int, int]:
  """Writes (text, label names) points as a dataset in the raw-text layout
  (`raw_data/{train,test,label}.raw.txt`, `trn_X_Y.txt`, `tst_X_Y.txt`), the points shuffled
  by `seed` and the first `test_fraction` of them the test split. Labels are the names the
  points use, sorted, each written with its text.

  Args:
    outdir: the dataset's folder (made if missing).
    points: each point's text and its label names; shuffled in place.
    label_texts: each label name's text.
    test_fraction: the share of points in the test split.
    seed: the shuffle's seed.
  Returns:
    (training points, test points, labels).
  """
  random.Random(seed).shuffle(points)
  n_test = int(len(points) * test_fraction)
  labels = sorted({label for _, names in points for label in names})
  ids = {label: i for i, label in enumerate(labels)}
  os.makedirs(os.path.join(outdir, "raw_data"), exist_ok=True)
  for split, short, rows in (("train", "trn", points[n_test:]), ("test", "tst", points[:n_test])):
    raw = os.path.join(outdir, "raw_data", f"{split}.raw.txt")
    write_texts(raw, (text for text, _ in rows), layout="uid")
    y = SparseRows.from_lists([[ids[n] for n in names] for _, names in rows], len(labels))
    write_sparse(os.path.join(outdir, f"{short}_X_Y.txt"), y)
  label_raw = os.path.join(outdir, "raw_data", "label.raw.txt")
  write_texts(label_raw, (label_texts[label] for label in labels), layout="uid")
  return len(points) - n_test, n_test, len(labels)
