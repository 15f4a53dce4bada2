"""Binary CSR caches of label files: parsed once, then memory-mapped by every process.

Per label file `<name>` (e.g. trn_X_Y.txt), in the cache directory beside the token cache:
  <name>.labels.indptr.npy   (rows + 1,) int64
  <name>.labels.indices.npy  (nnz,) int32, each row sorted, every label once
  <name>.labels.values.npy   (nnz,) float32, only when some value is not one
  <name>.labels.counts.npy   (cols,) int32 positives per label (propensities, popularity)
  <name>.labels.meta.json    the source's stamp (path, size, mtime), rows, cols, nnz, the
                             longest row, build seconds; rebuilt when the stamp changes
Building streams the file through `sparse_reader` into `.npy` files (memory bounded by its
block, not by the file); opening is `np.load(mmap_mode="r")`, so the processes of a node
share one page-cache copy and none of them parses again.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import numpy as np
from absl import logging

from astra_jax.data import cache_files, sparse_reader, xc_format
from astra_jax.data.sparse_rows import SparseRows, XCFormatError
from astra_jax.runtime.errors import InputError

FORMAT_VERSION = 1
_PROGRESS_SECONDS = 10.0


def cache_stem(label_path: str, cache_dir: str) -> str:
  base = os.path.basename(label_path)
  base = base[:-3] if base.endswith(".gz") else base
  return os.path.join(cache_dir, os.path.splitext(base)[0] + ".labels")


def _files(stem: str) -> dict[str, str]:
  return {part: f"{stem}.{part}.npy" for part in ("indptr", "indices", "values", "counts")}


def cached_labels(
  label_path: str, cache_dir: str, num_cols: int | None = None, json_num_labels: int | None = None
) -> SparseRows:
  """The label rows of a file as read-only memmaps, building the cache when missing or stale.

  Args:
    label_path: a sparse label file (`trn_X_Y.txt`, `.gz` allowed) or, with
      json_num_labels, a json-lines file whose `target_ind` fields hold the labels.
    cache_dir: where the cache lives.
    num_cols: when given, the file's column count must equal it.
    json_num_labels: the label count of a json-lines file (it has no header).
  Returns:
    SparseRows over memmaps, with precomputed counts and longest row.
  Raises:
    XCFormatError: naming the file and line, as `xc_format.read_sparse` does.
  """
  os.makedirs(cache_dir, exist_ok=True)
  stem = cache_stem(label_path, cache_dir)
  want = {
    "source": cache_files.source_stamp(label_path),
    "format": FORMAT_VERSION,
    "json_num_labels": json_num_labels,
  }
  meta = current_meta(stem, want)
  if meta is None:
    with cache_files.build_lock(stem):
      meta = current_meta(stem, want)  # another process may have built it meanwhile
      if meta is None:
        meta = build(label_path, stem, want, num_cols, json_num_labels)
  if num_cols is not None and meta["cols"] != num_cols:
    raise XCFormatError(label_path, 1, f"header says {meta['cols']} columns, expected {num_cols}")
  return open_cache(stem)


def current_meta(stem: str, want: dict) -> dict | None:
  """The cache's metadata when it is complete and built from `want`'s source, else None."""
  try:
    with open(stem + ".meta.json") as f:
      meta = json.load(f)
  except (OSError, json.JSONDecodeError):
    return None
  if {k: meta.get(k) for k in want} != want:
    logging.info("label cache %s is stale; rebuilding", stem)
    return None
  files = _files(stem)
  needed = ["indptr", "indices", "counts"] + (["values"] if meta["has_values"] else [])
  return meta if all(os.path.exists(files[p]) for p in needed) else None


def open_cache(stem: str) -> SparseRows:
  """Opens a built cache memory-mapped (no parsing; well under a second at any size)."""
  with open(stem + ".meta.json") as f:
    meta = json.load(f)
  files = _files(stem)
  load = lambda part: np.load(files[part], mmap_mode="r")
  return SparseRows(
    load("indptr"),
    load("indices"),
    load("values") if meta["has_values"] else None,
    meta["cols"],
    counts=load("counts"),
    max_length=meta["max_row_length"],
    cache=stem,
  )


def verify(stem: str) -> dict:
  """Checks a built cache against its metadata and itself (shapes, row pointers rising from
  0 to nnz, ids in range, counts summing to nnz), in blocks. Returns the metadata."""
  with open(stem + ".meta.json") as f:
    meta = json.load(f)
  rows = open_cache(stem)
  problems = []
  if rows.num_rows != meta["rows"] or len(rows.indices) != meta["nnz"] != rows.nnz:
    problems.append(
      f"{rows.num_rows} rows, {len(rows.indices)} ids, the metadata says "
      f"{meta['rows']} and {meta['nnz']}"
    )
  block = 1 << 24
  for s in range(0, rows.num_rows, block):
    if (np.diff(rows.indptr[s : s + block + 1]) < 0).any():
      problems.append(f"row pointers fall near row {s}")
      break
  for s in range(0, rows.nnz, block):
    ids = rows.indices[s : s + block]
    if len(ids) and (ids.min() < 0 or ids.max() >= rows.num_cols):
      problems.append(f"an id out of [0, {rows.num_cols}) near entry {s}")
      break
  if int(rows.counts.sum(dtype=np.int64)) != rows.nnz:
    problems.append("the label counts do not sum to nnz")
  if problems or rows.indptr[0] != 0:
    raise InputError(
      f"label cache {stem} is corrupt ({'; '.join(problems) or 'indptr[0]'}): "
      f"delete its files to rebuild it"
    )
  return meta


def build(
  label_path: str,
  stem: str,
  want: dict,
  num_cols: int | None = None,
  json_num_labels: int | None = None,
) -> dict:
  """Parses the file into the cache's files (under temporary names, renamed when whole) and
  writes its metadata last. Returns the metadata."""
  files = _files(stem)
  with contextlib.suppress(FileNotFoundError):
    os.remove(stem + ".meta.json")  # no reader takes a half-replaced cache for a whole one
  for path in files.values():
    cache_files.remove_stale_temporaries(path)
  t0, cpu0 = time.time(), time.process_time()
  writer = _CsrWriter(files)
  try:
    if json_num_labels is not None:
      rows = xc_format.read_json_labels(label_path, json_num_labels)
      writer.start(json_num_labels)
      writer.add(rows.row_lengths(), rows.indices, rows.values)
      cols, source_bytes = json_num_labels, os.path.getsize(label_path)
    else:
      reader = sparse_reader.SparseFileReader(label_path, num_cols)
      progress = _Progress(label_path, os.path.getsize(label_path))
      writer.start(reader.cols)
      for block in reader.blocks():
        writer.add(block.lengths, block.indices, block.values)
        progress(reader.bytes_read, writer.rows)
      reader.finish()
      cols, source_bytes = reader.cols, reader.bytes_read
    meta = writer.finish(cols)
  except BaseException:
    writer.abort()
    raise
  seconds, cpu = time.time() - t0, time.process_time() - cpu0
  meta.update(want, seconds=round(seconds, 2), cpu_seconds=round(cpu, 2), source_bytes=source_bytes)
  with xc_format.atomic_text_writer(stem + ".meta.json") as f:
    json.dump(meta, f, indent=1)
  logging.info(
    "label cache %s: %d rows, %d positives, %d labels, %.1f MB parsed in %.1fs (%.0f MB/s of CPU)",
    stem,
    meta["rows"],
    meta["nnz"],
    cols,
    source_bytes / 1e6,
    seconds,
    source_bytes / 1e6 / max(cpu, 1e-9),
  )
  return meta


class _CsrWriter:
  """Appends blocks of rows to the cache's .npy files; the values file is started only at
  the first value that is not one (the earlier entries then written as ones)."""

  def __init__(self, files: dict[str, str]):
    self.files = files
    self.indptr = cache_files.NpyStreamWriter(files["indptr"], np.int64)
    self.indices = cache_files.NpyStreamWriter(files["indices"], np.int32)
    self.values: cache_files.NpyStreamWriter | None = None
    self.indptr.append(np.zeros(1, np.int64))
    self.rows = self.nnz = self.max_length = 0
    self.counter: _LabelCounter | None = None

  def add(self, lengths: np.ndarray, indices: np.ndarray, values: np.ndarray | None) -> None:
    if values is not None and self.values is None and (values == 1).all():
      values = None
    self.indptr.append(self.nnz + np.cumsum(lengths))
    self.indices.append(indices)
    self.counter.add(indices)
    if values is not None and self.values is None:
      self.values = cache_files.NpyStreamWriter(self.files["values"], np.float32)
      for s in range(0, self.nnz, 1 << 24):
        self.values.append(np.ones(min(1 << 24, self.nnz - s), np.float32))
    if self.values is not None:
      self.values.append(np.ones(len(indices), np.float32) if values is None else values)
    self.rows += len(lengths)
    self.nnz += len(indices)
    self.max_length = max(self.max_length, int(lengths.max(initial=0)))

  def start(self, cols: int) -> None:
    """Sets the column count (known once the header is read); call before `add`."""
    self.counter = _LabelCounter(cols)

  def finish(self, cols: int) -> dict:
    """Closes the arrays, writes the positives per label. Returns the metadata's figures."""
    writers = [w for w in (self.indptr, self.indices, self.values) if w is not None]
    for w in writers:
      w.finish()
    if self.values is None:
      with contextlib.suppress(FileNotFoundError):
        os.remove(self.files["values"])  # a values file of an older build of this source
    counts = self.counter.finish()
    counts_writer = cache_files.NpyStreamWriter(self.files["counts"], np.int32)
    counts_writer.append(counts)
    counts_writer.finish()
    return {
      "rows": self.rows,
      "cols": cols,
      "nnz": self.nnz,
      "max_row_length": self.max_length,
      "has_values": self.values is not None,
      "bytes": sum(os.path.getsize(p) for p in self.files.values() if os.path.exists(p)),
    }

  def abort(self) -> None:
    for w in (self.indptr, self.indices, self.values):
      if w is not None:
        w.abort()


class _LabelCounter:
  """Positives per label as int32, counted as the blocks go by: ids are gathered up to
  2^24 and counted with one bincount (its cost is O(cols) a call, so not one per block).
  RAM: the int32 counts, the gathered ids and one int64 bincount of cols."""

  BATCH = 1 << 24

  def __init__(self, cols: int):
    self.counts = np.zeros(cols, np.int32)
    self.pending: list[np.ndarray] = []
    self.pending_len = self.total = 0

  def add(self, ids: np.ndarray) -> None:
    self.pending.append(ids)
    self.pending_len += len(ids)
    if self.pending_len >= self.BATCH:
      self._flush()

  def _flush(self) -> None:
    if not self.pending:
      return
    ids = np.concatenate(self.pending)
    self.pending, self.pending_len = [], 0
    np.add(
      self.counts, np.bincount(ids, minlength=len(self.counts)), out=self.counts, casting="unsafe"
    )
    self.total += len(ids)
    # A flush adds under 2^31 to a count: an overflow shows as a negative count.
    if self.total >= 2**31 and (self.counts < 0).any():
      raise ValueError("a label has 2^31 positives or more: its count overflows int32")

  def finish(self) -> np.ndarray:
    self._flush()
    return self.counts


class _Progress:
  """Logs MB parsed, MB/s and the time left, every `_PROGRESS_SECONDS`."""

  def __init__(self, path: str, total_bytes: int):
    self.path, self.total = os.path.basename(path), max(total_bytes, 1)
    self.t0 = self.last = time.time()

  def __call__(self, done_bytes: int, rows: int) -> None:
    now = time.time()
    if now - self.last < _PROGRESS_SECONDS:
      return
    self.last = now
    rate = done_bytes / max(now - self.t0, 1e-9)
    eta = max(self.total - done_bytes, 0) / max(rate, 1e-9)
    logging.info(
      "parsing %s: %.0f/%.0f MB, %d rows, %.0f MB/s, %.0fs left",
      self.path,
      done_bytes / 1e6,
      self.total / 1e6,
      rows,
      rate / 1e6,
      eta,
    )
