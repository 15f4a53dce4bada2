"""The neighbour vote's memory problem the memory tests share (test_mesh_memory.py,
test_process_memory.py, vote_memory_process.py): a stand-in encoder, two token sources and
their rows' labels, and the dense keys to check against."""

import jax
import numpy as np

from astra_jax.ann import mesh_memory, vote_memory
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.parallel import sharding

ENCODE = jax.jit(lambda table, ids: table[ids].sum(axis=1))  # a stand-in encoder


def mesh_of(data: int, model: int) -> jax.sharding.Mesh:
  return sharding.make_mesh(data, model, jax.devices()[: data * model])


def unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def problem(seed: int = 0, a: int = 37, b: int = 11, num_labels: int = 9):
  """An embedding table, two token sources (the first read in reverse row order) and the
  labels of the memory's a + b rows."""
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(64, 8)).astype(np.float32)
  first, second = (rng.integers(0, 64, (n, 3)).astype(np.int32) for n in (a, b))
  labels = SparseRows.from_lists(
    [list(rng.choice(num_labels, rng.integers(1, 4), replace=False)) for _ in range(a + b)],
    num_labels,
  )
  sources = [
    mesh_memory.MemorySource(first, np.arange(a - 1, -1, -1)),
    mesh_memory.MemorySource(second),
  ]
  keys = np.concatenate([table[first[::-1]].sum(1), table[second].sum(1)])
  return table, sources, labels, keys, rng


def dense_memory(keys: np.ndarray, labels: SparseRows, rows: int | None = None):
  """The reference: the first `rows` of the dense keys, unit rows, whole on the host."""
  rows = len(keys) if rows is None else rows
  return vote_memory.Memory(unit(keys[:rows]).astype(np.float32), labels.head(rows))


def written_keys(memory) -> np.ndarray:
  """The keys a memory's `own_rows` give (what the export writes), in row order; one
  process holds them all."""
  out = np.full((memory.num_rows, memory.dim), np.nan, np.float32)
  for rows, keys in memory.own_rows():
    out[rows] = keys
  return out
