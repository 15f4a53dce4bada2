"""Label rows written to disk as CSR arrays a block at a time, never copied whole.

The rows a training run holds may be several blocks that are never concatenated (the vote
memory's training rows, then its validation rows: sparse_rows.StackedRows; the training
rows, then the label-text rows: sparse_rows.WithLabelRows), each possibly a memmap of a
label cache or rows picked from one (the rows a validation split keeps:
sparse_rows.SelectedRows); at SS-20M one matrix is 15 GiB. These writers read the rows a
block at a time and write `indptr` (int64, each block's shifted past the ones before it) and
`indices` (int32) as np.save and np.savez write them.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from astra_jax.data.sparse_rows import SelectedRows, SparseRows, StackedRows, WithLabelRows
from astra_jax.runtime import tmpnames

# Elements of an array written at a time.
WRITE_BLOCK = 1 << 24

Rows = SparseRows | SelectedRows | StackedRows | WithLabelRows


def _indptr_blocks(parts: Iterator[SparseRows]) -> Iterator[np.ndarray]:
  yield np.zeros(1, np.int64)
  offset = 0
  for part in parts:
    for start in range(1, len(part.indptr), WRITE_BLOCK):
      yield np.asarray(part.indptr[start : start + WRITE_BLOCK], np.int64) + offset
    offset += part.nnz


def _indices_blocks(parts: Iterator[SparseRows]) -> Iterator[np.ndarray]:
  for part in parts:
    for start in range(0, part.nnz, WRITE_BLOCK):
      yield np.asarray(part.indices[start : start + WRITE_BLOCK], np.int32)


def _arrays(labels: Rows) -> dict[str, tuple[type, int, Iterator[np.ndarray]]]:
  # Each array walks the rows anew: a SelectedRows block is a copy made for the walk.
  return {
    "indptr": (np.int64, labels.num_rows + 1, _indptr_blocks(labels.blocks(WRITE_BLOCK))),
    "indices": (np.int32, labels.nnz, _indices_blocks(labels.blocks(WRITE_BLOCK))),
  }


def _write_npy(f: BinaryIO, dtype: type, size: int, blocks: Iterator[np.ndarray]) -> None:
  header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (size,)}
  np.lib.format.write_array_header_2_0(f, header)
  for block in blocks:
    f.write(np.ascontiguousarray(block, dtype).tobytes())


def save_npz(labels: Rows, path: str) -> None:
  """`labels` as an .npz of `indptr` and `indices` (np.load reads it as np.savez's).

  Args:
    labels: the rows.
    path: the .npz to write (replaced).
  """
  with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
    for name, (dtype, size, blocks) in _arrays(labels).items():
      with z.open(f"{name}.npy", "w", force_zip64=True) as f:
        _write_npy(f, dtype, size, blocks)


def save_npy(labels: Rows, stem: str) -> dict[str, str]:
  """`labels` as STEM.indptr.npy and STEM.indices.npy, each written to a temporary name and
  renamed (a reader maps whole files only).

  Args:
    labels: the rows.
    stem: the files' path without the suffixes.
  Returns:
    {"indptr": path, "indices": path}.
  """
  paths = {}
  for name, (dtype, size, blocks) in _arrays(labels).items():
    path = f"{stem}.{name}.npy"
    tmp = f"{path}.tmp-{tmpnames.unique_suffix()}"
    with open(tmp, "wb") as f:
      _write_npy(f, dtype, size, blocks)
    os.replace(tmp, path)
    paths[name] = path
  return paths
