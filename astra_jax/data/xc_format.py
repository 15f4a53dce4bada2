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
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from absl import logging

from astra_jax.data import cache_files
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


_COUNT_BLOCK = 1 << 24  # entries per bincount: int64 temporaries bounded, not nnz-sized


@dataclasses.dataclass(frozen=True)
class SparseRows:
  """A CSR matrix without scipy: row i holds indices[indptr[i]:indptr[i+1]]. The arrays
  may be read-only memmaps of a label cache (`label_cache`); nothing here copies them."""

  indptr: np.ndarray  # (rows + 1,) int64
  indices: np.ndarray  # (nnz,) int32
  values: np.ndarray | None  # (nnz,) float32; None: every value is one (a label file's
  # usual case, so an nnz-sized array of ones is never held)
  num_cols: int
  counts: np.ndarray | None = None  # (num_cols,) positives per label, when precomputed
  max_length: int | None = None  # the longest row's length, when precomputed
  cache: str = ""  # the label cache these arrays map (label_cache), if any

  @property
  def num_rows(self) -> int:
    return len(self.indptr) - 1

  @property
  def nnz(self) -> int:
    return int(self.indptr[-1])

  def row_range(self, lo: int, hi: int) -> SparseRows:
    """Rows [lo, hi) as their own matrix (views of the arrays, row pointers rebased)."""
    start, end = self.indptr[lo], self.indptr[hi]
    return SparseRows(
      np.asarray(self.indptr[lo : hi + 1]) - start,
      self.indices[start:end],
      None if self.values is None else self.values[start:end],
      self.num_cols,
    )

  def row(self, i: int) -> np.ndarray:
    return self.indices[self.indptr[i] : self.indptr[i + 1]]

  def row_values(self, i: int) -> np.ndarray:
    if self.values is None:
      return np.ones(int(self.indptr[i + 1] - self.indptr[i]), np.float32)
    return self.values[self.indptr[i] : self.indptr[i + 1]]

  def row_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
    """Labels per row: of every row, or of the given row ids."""
    if rows is None:
      return np.diff(self.indptr)
    rows = np.asarray(rows, np.int64)
    return self.indptr[rows + 1] - self.indptr[rows]

  def max_row_length(self) -> int:
    if self.max_length is not None:
      return self.max_length
    longest = 0
    for s in range(0, self.num_rows, _COUNT_BLOCK):
      block = np.diff(self.indptr[s : s + _COUNT_BLOCK + 1])
      longest = max(longest, int(block.max(initial=0)))
    return longest

  def column_counts(self) -> np.ndarray:
    """(num_cols,) int64 positives per label, counted in blocks (np.bincount would cast
    all of `indices` to int64 at once)."""
    if self.counts is not None:
      return np.asarray(self.counts, np.int64)
    counts = np.zeros(self.num_cols, np.int64)
    for s in range(0, self.nnz, _COUNT_BLOCK):
      counts += np.bincount(self.indices[s : s + _COUNT_BLOCK], minlength=self.num_cols)
    return counts

  def entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (position in `rows`, label) pairs of the given rows, grouped by position."""
    rows = np.asarray(rows, np.int64)
    starts, ends = self.indptr[rows], self.indptr[rows + 1]
    lengths = ends - starts
    which = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    # entry j of row i sits at starts[i] + j: arange over all entries, shifted per row
    flat = np.arange(len(which)) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return which, np.asarray(self.indices[flat], np.int64)

  def head(self, n: int) -> SparseRows:
    """The first n rows."""
    if n == self.num_rows:
      return self
    end = self.indptr[n]
    vals = None if self.values is None else self.values[:end]
    return SparseRows(self.indptr[: n + 1], self.indices[:end], vals, self.num_cols)

  def to_dense(self) -> np.ndarray:
    dense = np.zeros((self.num_rows, self.num_cols), np.float32)
    rows = np.repeat(np.arange(self.num_rows), self.row_lengths())
    dense[rows, self.indices] = 1.0 if self.values is None else self.values
    return dense

  @staticmethod
  def from_lists(
    rows: Sequence[Sequence[int]], num_cols: int, values: Sequence[Sequence[float]] | None = None
  ) -> SparseRows:
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    flat = [i for r in rows for i in r]
    indices = np.asarray(flat, np.int32)
    if values is None:
      vals = np.ones(len(indices), np.float32)
    else:
      vals = np.asarray([v for r in values for v in r], np.float32)
    return SparseRows(indptr, indices, vals, int(num_cols))

  def vstack(self, other: SparseRows) -> SparseRows:
    if other.num_cols != self.num_cols:
      raise ValueError(f"column counts differ: {self.num_cols} vs {other.num_cols}")
    if self.values is None and other.values is None:
      vals = None
    else:
      ones = lambda m: np.ones(m.nnz, np.float32) if m.values is None else m.values
      vals = np.concatenate([ones(self), ones(other)])
    return SparseRows(
      np.concatenate([self.indptr, other.indptr[1:] + self.indptr[-1]]),
      np.concatenate([self.indices, other.indices]),
      vals,
      self.num_cols,
    )


class WithLabelRows:
  """Training rows followed by one row per label whose only positive is that label (the
  label-text augmentation), without copying: the identity block is computed, not stored.
  Offers the part of SparseRows' interface that training and mining read."""

  def __init__(self, base: SparseRows):
    self.base, self.num_cols = base, base.num_cols

  @property
  def num_rows(self) -> int:
    return self.base.num_rows + self.num_cols

  @property
  def nnz(self) -> int:
    return self.base.nnz + self.num_cols

  def _split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows, np.int64)
    return rows, rows < self.base.num_rows

  def row(self, i: int) -> np.ndarray:
    if i < self.base.num_rows:
      return self.base.row(i)
    return np.array([i - self.base.num_rows], self.base.indices.dtype)

  def row_values(self, i: int) -> np.ndarray:
    return self.base.row_values(i) if i < self.base.num_rows else np.ones(1, np.float32)

  def row_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
    if rows is None:
      return np.concatenate([self.base.row_lengths(), np.ones(self.num_cols, np.int64)])
    rows, in_base = self._split(rows)
    out = np.ones(len(rows), np.int64)
    out[in_base] = self.base.row_lengths(rows[in_base])
    return out

  def max_row_length(self) -> int:
    return max(self.base.max_row_length(), 1 if self.num_cols else 0)

  def column_counts(self) -> np.ndarray:
    return self.base.column_counts() + 1

  def entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, in_base = self._split(rows)
    lengths = self.row_lengths(rows)
    which = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    labels = np.empty(len(which), np.int64)
    from_base = in_base[which]
    labels[from_base] = self.base.entries(rows[in_base])[1]
    labels[~from_base] = rows[~in_base] - self.base.num_rows
    return which, labels

  def head(self, n: int) -> SparseRows | WithLabelRows:
    if n <= self.base.num_rows:
      return self.base.head(n)
    if n == self.num_rows:
      return self
    raise ValueError(f"head({n}) would cut the label-text rows short")

  def to_dense(self) -> np.ndarray:
    return np.concatenate([self.base.to_dense(), np.eye(self.num_cols, dtype=np.float32)])

  def stacked(self) -> SparseRows:
    """The rows as one SparseRows in RAM (a copy: for small matrices held in RAM anyway)."""
    L = self.num_cols
    return self.base.vstack(
      SparseRows(np.arange(L + 1, dtype=np.int64), np.arange(L, dtype=np.int32), None, L)
    )


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
        raise XCFormatError(
          path, lineno, f"unreadable: not UTF-8 ({e.reason} at byte {e.start})"
        ) from None
      yield lineno, line.rstrip("\n").rstrip("\r")


def read_sparse(path: str | os.PathLike, num_cols: int | None = None) -> SparseRows:
  """Reads a sparse matrix in the repository's text format (into RAM; `label_cache` keeps
  a large one on disk instead).

  Args:
    path: the file (`.gz` allowed).
    num_cols: when given, the header's column count must equal it.
  Returns:
    The rows, each sorted with every label once; `values` None when they are all one.
  """
  from astra_jax.data import sparse_reader  # it builds on this module's line parser

  return sparse_reader.read_sparse(path, num_cols)


def parse_header(
  path: str | os.PathLike, lineno: int, header: str, num_cols: int | None
) -> tuple[int, int]:
  """(rows, cols) of a sparse file's header line, or an XCFormatError naming it."""
  parts = header.split()
  if len(parts) != 2 or not all(_INT.fullmatch(p) for p in parts):
    raise XCFormatError(path, lineno, f"bad header {header!r}: expected 'rows cols'")
  rows, cols = int(parts[0]), int(parts[1])
  if num_cols is not None and cols != num_cols:
    raise XCFormatError(path, lineno, f"header says {cols} columns, expected {num_cols}")
  return rows, cols


def parse_row(
  path: str | os.PathLike, lineno: int, line: str, cols: int, sorted_unique: _SortedUnique
) -> tuple[np.ndarray, np.ndarray]:
  """One non-empty row's (sorted unique int64 ids, float32 values), or an XCFormatError
  naming the line: the reference parser, and the one that words every error."""
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
  return sorted_unique(lineno, np.array(ids, np.int64), val)


class _SortedUnique:
  """A row's labels sorted, each once (a label listed twice is one positive, with its first
  value); `report` warns once per file about the rows that listed one twice."""

  def __init__(self, path):
    self.path, self.rows, self.first = path, 0, None

  def __call__(
    self, lineno: int, idx: np.ndarray, val: np.ndarray
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
      logging.warning(
        "%s: %d rows list a label more than once (first: line %d); each label counts once",
        self.path,
        self.rows,
        self.first,
      )


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
  for lineno, line in _lines(p):
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
  with _open_binary(path) as f:
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


def read_filter(
  path: str | os.PathLike, num_rows: int | None = None, num_labels: int | None = None
) -> np.ndarray:
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
    raise XCFormatError(
      texts_path, None, f"{num_texts} texts but {labels_path} has {num_label_rows} label rows"
    )
