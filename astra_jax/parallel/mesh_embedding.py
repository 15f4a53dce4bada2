"""E(x) of many token rows with every device of every process, the result on every process.

After training, the score beyond W embeds whole splits: the neighbour vote's memory (every
training row), the label texts of the fused score, the kNN diagnostic's rows. Each process
needs all of those embeddings (it votes or scores against all of them), but encoding them
on one device of each process repeats the same work on every process and leaves the other
devices idle: at SS-20M's 146M training rows that is one GPU's hours on every node. Here a
block of rows is split over all the mesh's devices like a training batch, each process
reading only its devices' token rows, and the block's (rows x d) embeddings, not its tokens,
are gathered onto every process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.parallel.sharding import ALL
from astra_jax.runtime import distributed

EncodeFn = Callable[[object, jax.Array], jax.Array]  # (encoder params, (B, T) ids) -> (B, d)


@functools.lru_cache(maxsize=32)
def encoder(mesh: jax.sharding.Mesh, encode: EncodeFn):
  """jit((encoder params, ids (Q, T) split over all of `mesh`'s devices) -> embeddings
  (Q, d) split likewise): each device encodes its own rows. One per (mesh, encoder)."""
  rows = NamedSharding(mesh, P(ALL))

  def run(enc_params, ids):
    return jax.lax.with_sharding_constraint(encode(enc_params, ids), rows)

  return jax.jit(run, out_shardings=rows)


def block_rows(mesh: jax.sharding.Mesh, batch_size: int) -> int:
  """Rows per call: `batch_size` rounded up to a multiple of the devices."""
  devices = mesh.devices.size
  return -(-batch_size // devices) * devices


def block_array(
  sharding: NamedSharding,
  array,
  start: int,
  stop: int,
  q: int,
  fill=0,
  dtype=None,
  rows: np.ndarray | None = None,
  offset: int = 0,
) -> jax.Array:
  """Global rows [start, start + q) of `array`, or of its `rows`, as a (q, width) array
  split by `sharding`, each process reading only its devices' rows (a memmap is never read
  whole); rows at or past `stop` are `fill`.

  Args:
    sharding: how the block is split (rows over every device).
    array: (N, width), indexable by a slice, or by row ids when `rows` is given.
    start, stop, q: the block's first row, the first row past the data, the block's rows.
    fill: the value of rows at or past `stop`.
    dtype: the block's dtype (None: the array's).
    rows: global row i is `array[rows[i]]`; None: `array[i - offset]`.
    offset: the global row of `array`'s row 0 (without `rows`).
  Returns:
    The (q, width) block.
  """

  def read(index):
    a = start + (index[0].start or 0)
    b = start + (q if index[0].stop is None else index[0].stop)
    which = slice(min(a, stop) - offset, min(b, stop) - offset)
    x = np.asarray(array[which] if rows is None else array[rows[which]], dtype)
    return np.pad(x, ((0, (b - a) - len(x)), (0, 0)), constant_values=fill)

  return jax.make_array_from_callback((q, array.shape[1]), sharding, read)


def held_rows(x: jax.Array, held: Sequence[int]) -> np.ndarray:
  """This process's real rows of a block split over the devices: each of its shards of `x`,
  in row order, cut to its `held` rows (the rest pad the block's end).

  Args:
    x: (q, ...) split over its rows.
    held: for each of this process's shards, in row order, how many rows are real.
  Returns:
    (sum(held), ...) on the host.
  """
  shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
  return np.concatenate([np.asarray(s.data)[:n] for s, n in zip(shards, held)])


def held_positions(x: jax.Array, held: Sequence[int]) -> np.ndarray:
  """The rows of a block split over the devices that `held_rows` returns, as positions in
  the block (int64, in the same order)."""
  shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
  return np.concatenate(
    [(s.index[0].start or 0) + np.arange(n, dtype=np.int64) for s, n in zip(shards, held)]
    or [np.zeros(0, np.int64)]
  )


def embed_on_mesh(
  mesh: jax.sharding.Mesh,
  encode: EncodeFn,
  enc_params,
  tokens,
  batch_size: int,
  rows: np.ndarray | None = None,
) -> np.ndarray:
  """(n, d) float32 E(x) of `tokens` (n, T), or of its `rows` in their order, on every
  process.

  Args:
    mesh: the devices to encode on (all of them, over every process).
    encode: the inference-mode encoder (embedding.make_embed_fn).
    enc_params: its parameters, replicated on `mesh` (or a host copy in one process).
    tokens: (N, T) token ids, e.g. a memory-mapped token file; each process reads only the
      rows its devices encode.
    batch_size: rows per call, rounded up to the devices (the last call is padded, so one
      compilation serves all).
    rows: the rows of `tokens` to embed, in this order; None: all of them.
  Returns:
    (n, d) float32, the same on every process.
  """
  n = len(tokens) if rows is None else len(rows)
  q = block_rows(mesh, batch_size)
  sharding = NamedSharding(mesh, P(ALL))
  run = encoder(mesh, encode)
  out = []
  for start in range(0, n, q):
    stop = min(start + q, n)
    ids = block_array(sharding, tokens, start, stop, q, dtype=np.int32, rows=rows)
    out.append(distributed.gather_rows(run(enc_params, ids))[: stop - start])
  if not out:
    return np.zeros((0, 0), np.float32)
  return np.concatenate(out).astype(np.float32, copy=False)
