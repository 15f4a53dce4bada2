"""A chunked, vectorised reader of the XC sparse label format (`trn_X_Y.txt`).

The file is read in blocks of `BLOCK_BYTES`, each cut after its last newline; a block's
pairs are found and converted with numpy over its bytes (a byte-class table, token
edges, ids from their digits), so memory is bounded by the block, not by the file, and
parsing runs at numpy's speed (docs/results/implementation_notes.md). A block the fast path
does not take as it is (any byte other than digits, ':', '.', blanks and newlines; a token
without exactly one ':'; an id out of range or over 10 digits; more rows than the header's)
goes through the line parser (`xc_lines.parse_row`), which accepts what the line format
accepts and words every error with the file and line. Rows come out sorted with each label
once.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from collections.abc import Iterator

import numpy as np
from absl import logging

from astra_jax.data import xc_lines
from astra_jax.data.sparse_rows import SparseRows, XCFormatError

BLOCK_BYTES = 16 << 20  # ~1M pairs: the per-byte temporaries stay near 100 MB
_MAX_ID_DIGITS = 10  # longer ids go to the line parser (which names an out-of-range one)

# Byte classes of the fast path; 0: a byte it leaves to the line parser.
_OTHER, _DIGIT, _COLON, _DOT, _BLANK, _NEWLINE = range(6)
_CLASS = np.zeros(256, np.uint8)
_CLASS[ord("0") : ord("9") + 1] = _DIGIT
_CLASS[ord(":")], _CLASS[ord(".")] = _COLON, _DOT
_CLASS[[ord(" "), ord("\t"), ord("\r")]] = _BLANK
_CLASS[ord("\n")] = _NEWLINE


@dataclasses.dataclass(frozen=True)
class RowBlock:
  """Consecutive rows of a sparse file, as parsed from one block."""

  first_line: int  # 1-based line of the first row
  lengths: np.ndarray  # (rows,) int64 labels per row
  indices: np.ndarray  # (nnz,) int32, sorted and unique within each row
  values: np.ndarray | None  # (nnz,) float32; None: all one


@dataclasses.dataclass
class _Duplicates:
  """Rows that listed a label twice: counted over the file, reported once."""

  rows: int = 0
  first_line: int | None = None

  def add(self, rows: int, first_line: int | None) -> None:
    if rows:
      self.rows += rows
      self.first_line = self.first_line or first_line


class SparseFileReader:
  """Streams a sparse file's rows block by block.

  Usage: `reader = SparseFileReader(path, num_cols)`; `reader.rows, reader.cols` (the
  header, checked on construction); `for block in reader.blocks(): ...`; then
  `reader.finish()` (checks the row count and warns about duplicated labels).
  """

  def __init__(
    self, path: str | os.PathLike, num_cols: int | None = None, block_bytes: int | None = None
  ):
    self.path, self.block_bytes = os.fspath(path), block_bytes or BLOCK_BYTES
    self.duplicates = _Duplicates()
    self.rows_read = self.lines_read = self.bytes_read = 0  # lines: rows + blank lines past them
    self._eof = self._header_read = False
    self.file = xc_lines.open_binary(self.path)
    try:
      self.rows, self.cols = self._read_header(num_cols)
    except BaseException:
      self.file.close()
      raise
    self._header_read = True

  def _read_header(self, num_cols: int | None) -> tuple[int, int]:
    """Reads up to the first newline; leaves the rest of what it read in `_pending`."""
    self._pending = self._read(self.block_bytes)
    while b"\n" not in self._pending and not self._eof:
      self._pending += self._read(self.block_bytes)
    raw, newline, self._pending = self._pending.partition(b"\n")
    if not raw and not newline:
      raise XCFormatError(self.path, 1, "empty file: expected a header 'rows cols'")
    header = _decode(self.path, 1, raw).rstrip("\r")
    return xc_lines.parse_header(self.path, 1, header, num_cols)

  def _read(self, n: int) -> bytes:
    try:
      data = self.file.read(n)
    except (EOFError, OSError, gzip.BadGzipFile) as e:
      line = self.rows_read + (2 if self._header_read else 1)
      raise XCFormatError(self.path, line, f"unreadable: {e}") from e
    self._eof = len(data) < n
    self.bytes_read += len(data)
    return data

  def blocks(self) -> Iterator[RowBlock]:
    """The rows, one block at a time, each block ending at a line's end."""
    with self.file:
      while self._pending or not self._eof:
        data = self._pending + (b"" if self._eof else self._read(self.block_bytes))
        cut = data.rfind(b"\n")
        if cut < 0 and not self._eof:
          self._pending = data  # a line longer than a block: read on
          continue
        if self._eof:
          data, self._pending = (data if data.endswith(b"\n") else data + b"\n"), b""
        else:
          data, self._pending = data[: cut + 1], data[cut + 1 :]
        block = self._parse(data)
        if block is not None:
          yield block

  def _parse(self, data: bytes) -> RowBlock | None:
    first_line = self.lines_read + 2
    lines = data.count(b"\n")
    self.lines_read += lines
    wanted = max(self.rows - self.rows_read, 0)
    fast = _parse_fast(np.frombuffer(data, np.uint8), self.cols, lines)
    if fast is not None and (lines <= wanted or not fast[0][wanted:].any()):
      lengths, indices, values, dup_rows, dup_row = fast
      if lines > wanted:  # blank lines past the header's rows: ignored, as before
        lengths = lengths[:wanted]
        end = int(lengths.sum())
        indices, values = indices[:end], None if values is None else values[:end]
      self.duplicates.add(dup_rows, None if dup_row is None else first_line + dup_row)
    else:
      lengths, indices, values = self._parse_lines(data, first_line, wanted)
    self.rows_read += len(lengths)
    if not len(lengths):
      return None
    return RowBlock(first_line, lengths, indices, values)

  def _parse_lines(
    self, data: bytes, first_line: int, wanted: int
  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The line parser over one block: slow, but it takes what the fast path leaves and
    words each error as the reader always has."""
    sorted_unique = xc_lines.SortedUnique(self.path)
    lengths, indices, values = [], [], []
    for offset, raw in enumerate(data.split(b"\n")[:-1]):
      lineno = first_line + offset
      line = _decode(self.path, lineno, raw).rstrip("\r").strip()
      if offset >= wanted:
        if line:
          raise XCFormatError(self.path, lineno, f"more rows than the header's {self.rows}")
        continue
      if line:
        idx, val = xc_lines.parse_row(self.path, lineno, line, self.cols, sorted_unique)
        indices.append(idx.astype(np.int32))
        values.append(val)
      lengths.append(len(indices[-1]) if line else 0)
    self.duplicates.add(sorted_unique.rows, sorted_unique.first)
    val = np.concatenate(values) if values else np.zeros(0, np.float32)
    return (
      np.asarray(lengths, np.int64),
      np.concatenate(indices) if indices else np.zeros(0, np.int32),
      None if (val == 1).all() else val,
    )

  def finish(self) -> None:
    """Checks the row count against the header; warns once about duplicated labels."""
    if self.rows_read != self.rows:
      raise XCFormatError(
        self.path, None, f"header says {self.rows} rows, file has {self.rows_read}"
      )
    if self.duplicates.rows:
      logging.warning(
        "%s: %d rows list a label more than once (first: line %d); each label counts once",
        self.path,
        self.duplicates.rows,
        self.duplicates.first_line,
      )


def _decode(path: str, lineno: int, raw: bytes) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise XCFormatError(
      path, lineno, f"unreadable: not UTF-8 ({e.reason} at byte {e.start})"
    ) from None


def _parse_fast(b: np.ndarray, cols: int, lines: int):
  """One block's rows with numpy, or None when the block needs the line parser.

  Args:
    b: the block's bytes, ending with a newline.
    cols: the header's column count.
    lines: newlines in the block.
  Returns:
    (lengths (lines,) int64, indices int32, values float32 or None when all one,
    rows that listed a label twice, the first such row or None), or None.
  """
  cls = _CLASS[b]
  if not cls.all():
    return None
  token = cls < _BLANK
  edges = np.flatnonzero(token[1:] != token[:-1]) + 1
  if token[0]:
    edges = np.concatenate([[0], edges])
  starts, ends = edges[0::2], edges[1::2]  # the last byte is a newline: every token ends
  colons = np.flatnonzero(cls == _COLON)
  if len(colons) != len(starts):
    return None
  if not len(starts):
    return np.zeros(lines, np.int64), np.zeros(0, np.int32), None, 0, None
  id_len = colons - starts
  # Colon i inside token i, after at least one id byte and before at least one value byte:
  # then every token holds exactly one colon.
  if (id_len < 1).any() or (id_len > _MAX_ID_DIGITS).any() or (colons + 1 >= ends).any():
    return None
  dots = np.flatnonzero(cls == _DOT)
  has_dot = np.zeros(len(starts), bool)
  if len(dots) == len(starts) and (dots > colons).all() and (dots < ends).all():
    has_dot[:] = True  # one dot in every value (the usual "1.0"): no search needed
  elif len(dots):
    owner = np.searchsorted(starts, dots, "right") - 1
    if (dots < colons[owner]).any() or (owner[1:] == owner[:-1]).any():
      return None  # a dot in an id, or two in a value
    has_dot[owner] = True
  value_len = ends - colons - 1
  if (value_len <= has_dot).any():
    return None  # a value that is only a dot
  ids = _ids(b, colons, id_len)
  if (ids >= cols).any():
    return None
  values = _values(b, colons + 1, value_len)
  # Tokens per line from the (few) newlines' places among the token starts.
  per_line = np.diff(np.searchsorted(starts, np.flatnonzero(cls == _NEWLINE)), prepend=0)
  row = np.repeat(np.arange(lines, dtype=np.int64), per_line)
  ids, values, dup_rows, dup_row = _sort_rows(row, ids, values)
  if dup_rows:
    keep = _kept(row, ids)
    row, ids, values = row[keep], ids[keep], None if values is None else values[keep]
    per_line = np.bincount(row, minlength=lines)
  return per_line.astype(np.int64), ids.astype(np.int32), values, dup_rows, dup_row


def _ids(b: np.ndarray, ends: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """The decimal numbers whose digits end before `ends`, read right to left: digit j from
  the end weighs 10^j, and counts where j < length (bytes before a short id are read, then
  zeroed: cheaper than gathering each id's own digits)."""
  pos = ends - 1
  ids = b[pos].astype(np.int64) - ord("0")
  scale = 1
  for j in range(1, int(lengths.max())):
    pos -= 1  # may reach -1 (the block's last byte) before a first short id: zeroed below
    scale *= 10
    digit = b[pos] - np.uint8(ord("0"))
    digit *= lengths > j
    ids += digit.astype(np.int64) * scale
  return ids


def _values(b: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
  """The values (digits with at most one dot): None when all are one. Files usually write
  one value text throughout ("1", "1.0", "1.000000"): comparing bytes settles it."""
  width = int(lengths[0])
  if (lengths == width).all():
    first = b[starts[0] : starts[0] + width]
    if all((b[starts + j] == first[j]).all() for j in range(width)):
      value = float(first.tobytes())
      return None if value == 1.0 else np.full(len(starts), value, np.float32)
  width = int(lengths.max())
  pos = starts[:, None] + np.arange(width)
  text = np.where(np.arange(width) < lengths[:, None], b[np.minimum(pos, len(b) - 1)], 0)
  values = np.ascontiguousarray(text.astype(np.uint8)).view(f"S{width}").ravel()
  # Through float64, as the line parser's float() then float32: the same rounding.
  values = values.astype(np.float64).astype(np.float32)
  return None if (values == 1).all() else values


def _sort_rows(row: np.ndarray, ids: np.ndarray, values: np.ndarray | None):
  """Sorts the rows whose ids are not increasing (a stable sort: of a label listed twice,
  the first value stays first). Returns (ids, values, rows with a repeated label, the
  first such row or None)."""
  same_row = row[1:] == row[:-1]
  disorder = same_row & (ids[1:] <= ids[:-1])
  if not disorder.any():
    return ids, values, 0, None
  bad_row = np.zeros(int(row[-1]) + 1, bool)
  bad_row[row[1:][disorder]] = True
  sel = np.flatnonzero(bad_row[row])
  order = sel[np.lexsort((ids[sel], row[sel]))]
  ids = ids.copy()
  ids[sel] = ids[order]
  if values is not None:
    values = values.copy()
    values[sel] = values[order]
  repeated = same_row & (ids[1:] == ids[:-1])
  dup = np.unique(row[1:][repeated])
  return ids, values, len(dup), (int(dup[0]) if len(dup) else None)


def _kept(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
  """The first entry of each (row, id) run of sorted rows."""
  keep = np.ones(len(ids), bool)
  keep[1:] = (row[1:] != row[:-1]) | (ids[1:] != ids[:-1])
  return keep


def read_sparse(
  path: str | os.PathLike, num_cols: int | None = None, block_bytes: int | None = None
) -> SparseRows:
  """The whole file in RAM (see `label_cache.cached_labels` for large files)."""
  reader = SparseFileReader(path, num_cols, block_bytes)
  lengths, indices, values, ones = [], [], [], True
  for block in reader.blocks():
    lengths.append(block.lengths)
    indices.append(block.indices)
    values.append(block.values)
    ones = ones and block.values is None
  reader.finish()
  indptr = np.zeros(reader.rows + 1, np.int64)
  if lengths:
    np.cumsum(np.concatenate(lengths), out=indptr[1:])
  ind = np.concatenate(indices) if indices else np.zeros(0, np.int32)
  if ones:
    vals = None
  else:
    vals = np.concatenate(
      [np.ones(len(i), np.float32) if v is None else v for i, v in zip(indices, values)]
    )
  return SparseRows(indptr, ind, vals, reader.cols)
