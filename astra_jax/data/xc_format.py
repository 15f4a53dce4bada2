"""Readers and writers for the Extreme Classification Repository file formats.

Sparse label matrices (`trn_X_Y.txt`): a header `rows cols`, then one line per row of
`label:value` pairs (0-based); an empty line is a row without labels. Text files come in
three layouts (see `read_texts`). Every parse error names the file and the 1-based line.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from typing import Iterable, Iterator, Sequence

import numpy as np
from absl import logging

from astra_jax import tmpnames
from astra_jax.errors import InputError

# ASCII digits only: str.isdigit also takes '²', which int() then rejects.
_INT = re.compile(r"[0-9]+")
_SIGNED_INT = re.compile(r"-?[0-9]+")


class XCFormatError(InputError):
  """A data file does not follow the format; the message names file and line."""

  def __init__(self, path: str | os.PathLike, line: int | None, message: str):
    where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
    super().__init__(f"{where}: {message}")
    self.path, self.line = os.fspath(path), line


@dataclasses.dataclass(frozen=True)
class SparseRows:
  """A CSR matrix without scipy: row i holds indices[indptr[i]:indptr[i+1]]."""
  indptr: np.ndarray   # (rows + 1,) int64
  indices: np.ndarray  # (nnz,) int32
  values: np.ndarray   # (nnz,) float32
  num_cols: int

  @property
  def num_rows(self) -> int:
    return len(self.indptr) - 1

  def row(self, i: int) -> np.ndarray:
    return self.indices[self.indptr[i]:self.indptr[i + 1]]

  def row_values(self, i: int) -> np.ndarray:
    return self.values[self.indptr[i]:self.indptr[i + 1]]

  def row_lengths(self) -> np.ndarray:
    return np.diff(self.indptr)

  def column_counts(self) -> np.ndarray:
    return np.bincount(self.indices, minlength=self.num_cols)

  def head(self, n: int) -> "SparseRows":
    """The first n rows."""
    end = self.indptr[n]
    return SparseRows(self.indptr[:n + 1], self.indices[:end], self.values[:end], self.num_cols)

  def to_dense(self) -> np.ndarray:
    dense = np.zeros((self.num_rows, self.num_cols), np.float32)
    rows = np.repeat(np.arange(self.num_rows), self.row_lengths())
    dense[rows, self.indices] = self.values
    return dense

  @staticmethod
  def from_lists(rows: Sequence[Sequence[int]], num_cols: int,
                 values: Sequence[Sequence[float]] | None = None) -> "SparseRows":
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    flat = [i for r in rows for i in r]
    indices = np.asarray(flat, np.int32)
    if values is None:
      vals = np.ones(len(indices), np.float32)
    else:
      vals = np.asarray([v for r in values for v in r], np.float32)
    return SparseRows(indptr, indices, vals, int(num_cols))

  def vstack(self, other: "SparseRows") -> "SparseRows":
    if other.num_cols != self.num_cols:
      raise ValueError(f"column counts differ: {self.num_cols} vs {other.num_cols}")
    return SparseRows(
        np.concatenate([self.indptr, other.indptr[1:] + self.indptr[-1]]),
        np.concatenate([self.indices, other.indices]),
        np.concatenate([self.values, other.values]), self.num_cols)


def _open_binary(path: str | os.PathLike):
  path = os.fspath(path)
  try:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
  except OSError as e:
    raise XCFormatError(path, None, f"cannot open: {e.strerror or e}") from e


def _lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without newline). Lines are decoded one by one so a
  decoding error names its own line."""
  f = _open_binary(path)
  lineno = 0
  with f:
    while True:
      try:
        raw = f.readline()
      except (EOFError, OSError, gzip.BadGzipFile) as e:
        raise XCFormatError(path, lineno + 1, f"unreadable: {e}") from e
      if not raw:
        return
      lineno += 1
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise XCFormatError(path, lineno, f"unreadable: not UTF-8 ({e.reason} at byte "
                            f"{e.start})") from None
      yield lineno, line.rstrip("\n").rstrip("\r")


def read_sparse(path: str | os.PathLike, num_cols: int | None = None) -> SparseRows:
  """Reads a sparse matrix in the repository's text format.

  Args:
    path: the file (`.gz` allowed).
    num_cols: when given, the header's column count must equal it.
  """
  lines = _lines(path)
  try:
    lineno, header = next(lines)
  except StopIteration:
    raise XCFormatError(path, 1, "empty file: expected a header 'rows cols'") from None
  parts = header.split()
  if len(parts) != 2 or not all(_INT.fullmatch(p) for p in parts):
    raise XCFormatError(path, lineno, f"bad header {header!r}: expected 'rows cols'")
  rows, cols = int(parts[0]), int(parts[1])
  if num_cols is not None and cols != num_cols:
    raise XCFormatError(path, lineno, f"header says {cols} columns, expected {num_cols}")
  lengths: list[int] = []  # not indptr from the header: a bad header must not allocate
  sorted_unique = _SortedUnique(path)
  indices: list[np.ndarray] = []
  values: list[np.ndarray] = []
  count = 0
  for lineno, line in lines:
    if count == rows:
      if line.strip():
        raise XCFormatError(path, lineno, f"more rows than the header's {rows}")
      continue
    line = line.strip()
    if line:
      try:
        pairs = [p.split(":") for p in line.split()]
        ids = [int(p[0]) for p in pairs]
        val = np.array([float(p[1]) if len(p) > 1 else 1.0 for p in pairs], np.float32)
        if any(len(p) > 2 for p in pairs):
          raise ValueError
      except (ValueError, IndexError):
        bad = next((t for t in line.split() if not _is_pair(t)), line)
        raise XCFormatError(path, lineno, f"malformed pair {bad!r}: expected 'label:value'") from None
      if min(ids) < 0 or max(ids) >= cols:  # before int64: an id past 2^63 must not overflow
        bad = max(ids) if max(ids) >= cols else min(ids)
        raise XCFormatError(path, lineno, f"label id {bad} out of range [0, {cols})")
      idx, val = sorted_unique(lineno, np.array(ids, np.int64), val)
      indices.append(idx.astype(np.int32))
      values.append(val)
      lengths.append(idx.size)
    else:
      lengths.append(0)
    count += 1
  if count != rows:
    raise XCFormatError(path, None, f"header says {rows} rows, file has {count}")
  sorted_unique.report()
  indptr = np.zeros(count + 1, np.int64)
  np.cumsum(lengths, out=indptr[1:])
  ind = np.concatenate(indices) if indices else np.zeros(0, np.int32)
  val = np.concatenate(values) if values else np.zeros(0, np.float32)
  return SparseRows(indptr, ind, val, cols)


class _SortedUnique:
  """A row's labels sorted, each once (a label listed twice is one positive, with its first
  value); `report` warns once per file about the rows that listed one twice."""

  def __init__(self, path):
    self.path, self.rows, self.first = path, 0, None

  def __call__(self, lineno: int, idx: np.ndarray, val: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(idx, kind="stable")
    idx, val = idx[order], val[order]
    first = np.ones(idx.size, bool)
    first[1:] = idx[1:] != idx[:-1]
    if first.all():
      return idx, val
    self.rows += 1
    self.first = self.first or lineno
    return idx[first], val[first]

  def report(self) -> None:
    if self.rows:
      logging.warning("%s: %d rows list a label more than once (first: line %d); each label "
                      "counts once", self.path, self.rows, self.first)


def _is_pair(token: str) -> bool:
  parts = token.split(":")
  if len(parts) != 2:
    return False
  try:
    int(parts[0]), float(parts[1])
  except ValueError:
    return False
  return True


def write_sparse(path: str | os.PathLike, matrix: SparseRows, value_format: str = "{:g}") -> None:
  """Writes the repository format atomically (temporary name, then rename)."""
  with atomic_text_writer(path) as f:
    f.write(f"{matrix.num_rows} {matrix.num_cols}\n")
    for i in range(matrix.num_rows):
      idx, val = matrix.row(i), matrix.row_values(i)
      f.write(" ".join(f"{j}:{value_format.format(v)}" for j, v in zip(idx, val)))
      f.write("\n")


class atomic_text_writer:
  """Context manager: write to `path.tmp-HOST-PID-RANDOM`, rename onto `path` only on success."""

  def __init__(self, path: str | os.PathLike, mode: str = "w"):
    self.path = os.fspath(path)
    self.tmp = f"{self.path}.tmp-{tmpnames.unique_suffix()}"
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


def read_texts(path: str | os.PathLike, layout: str = "auto", use_content: bool = False) -> list[str]:
  """Reads one text per row.

  Args:
    path: the file.
    layout: "lines", "uid", "json" or "auto" (json for *.json[.gz], uid for *.raw.txt,
      else lines).
    use_content: json layout only: title + " " + content (full-text datasets) instead of
      the title alone (titles datasets).
  """
  p = os.fspath(path)
  if layout == "auto":
    if p.endswith((".json", ".json.gz")):
      layout = "json"
    elif p.endswith(".raw.txt"):
      layout = "uid"
    else:
      layout = "lines"
  if layout == "lines":
    return [line for _, line in _lines(p)]
  if layout == "uid":
    texts = []
    for lineno, line in _lines(p):
      uid, sep, text = line.partition("->")
      if not sep:
        raise XCFormatError(p, lineno, "expected 'uid->text'")
      texts.append(text)
    return texts
  if layout == "json":
    texts = []
    for lineno, line in _lines(p):
      if not line.strip():
        raise XCFormatError(p, lineno, "empty line in a JSON-lines file")
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise XCFormatError(p, lineno, f"invalid JSON: {e.msg}") from None
      if not isinstance(obj, dict) or "title" not in obj:
        raise XCFormatError(p, lineno, "missing field 'title'")
      text = str(obj["title"] or "")  # JSON null: no text, not the word "None"
      if use_content:
        text = f"{text} {obj.get('content') or ''}".strip()
      texts.append(text)
    return texts
  raise InputError(f"unknown text layout {layout!r}; use lines, uid, json or auto")


def read_json_labels(path: str | os.PathLike, num_labels: int) -> SparseRows:
  """Label rows from the json.gz layout's `target_ind` (and `target_rel`) fields."""
  rows, vals = [], []
  sorted_unique = _SortedUnique(path)
  for lineno, line in _lines(path):
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


def read_filter(path: str | os.PathLike, num_rows: int | None = None,
                num_labels: int | None = None) -> np.ndarray:
  """Reads `row label` pairs (0-based) into an (n, 2) int64 array."""
  pairs = []
  for lineno, line in _lines(path):
    if not line.strip():
      continue
    parts = line.split()
    if len(parts) != 2 or not all(_SIGNED_INT.fullmatch(p) for p in parts):
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
    raise XCFormatError(texts_path, None,
                        f"{num_texts} texts but {labels_path} has {num_label_rows} label rows")
