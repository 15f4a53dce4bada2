"""The XC repository's line format: headers, 'label:value' rows and (gzipped) line streams,
parsed with errors that name the file and line."""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator

import numpy as np
from absl import logging

from astra_jax.data.sparse_rows import XCFormatError

# ASCII digits only: str.isdigit also takes '²', which int() then rejects.
_INT = re.compile(r"[0-9]+")


SIGNED_INT = re.compile(r"-?[0-9]+")


def open_binary(path: str | os.PathLike):
  path = os.fspath(path)
  try:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
  except OSError as e:
    raise XCFormatError(path, None, f"cannot open: {e.strerror or e}") from e


def numbered_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without newline). Lines are decoded one by one so a
  decoding error names its own line."""
  f = open_binary(path)
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
  path: str | os.PathLike, lineno: int, line: str, cols: int, sorted_unique: SortedUnique
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


class SortedUnique:
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
