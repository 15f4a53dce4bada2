"""The neighbour vote's memory split over every device of the mesh, searched where it lives.

The vote (xc/neighbour_vote.py) searches the memory, the unit E(x_j) of the N training rows,
for each ranked query's k nearest rows. Held whole on every process, that memory is SS-20M's
146M x 64 float32 = 35 GiB per process, and an exact search of it runs on one device of each
process. Here it is laid out like the encoder's batches: each block of rows the mesh encodes
stays on the devices that encoded it, so device i holds chunk i of every block, (D, M, d) with
the leading axis split over all D devices (D x M >= N; 1/D of the keys each). Beside the
keys, `rows` (D, M) holds each key's memory row (-1: a padded slot).

A search (`MeshMemory.nearest`) is one `jax.shard_map` program, the pattern of the sharded
top-k over W (sharded_topk.py): every device all-gathers the block's queries (Q x d), keeps
a running top k over its own keys in tiles of bounded size, and the devices' candidates (Q x
D k) are all-gathered and merged, each device keeping its own queries' best k. Only queries
and candidates cross devices; the flops are split over every device of every process.

The labels of the memory rows (views of the data's label rows) stay on the host of every
process: the votes are summed there (neighbour_vote.label_votes) from the neighbours' row
ids. The search is always exact: a memory the vote searches through ScaNN is built whole on
every host instead (evaluation/ranking.vote_memory). The export writes each process's rows
where they are (`own_rows`, serving/export.write_memory_keys).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.ann.exact_topk import merge_topk
from astra_jax.ann.vote_memory import TILE_FLOATS, FirstRows, neighbour_votes
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.parallel import mesh_embedding
from astra_jax.parallel.sharding import ALL
from astra_jax.xc.neighbour_vote import NeighbourVote, Votes

EncodeFn = Callable[[object, jax.Array], jax.Array]  # (encoder params, (B, T) ids) -> (B, d)


@dataclasses.dataclass(frozen=True)
class MemorySource:
  """Token rows that join the memory, in this order.

  Attributes:
    tokens: (n, T) token ids (e.g. a memory-mapped token file).
    rows: the rows of `tokens` to embed, in their order; None: all of them.
  """

  tokens: object
  rows: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.tokens) if self.rows is None else len(self.rows)


@dataclasses.dataclass(frozen=True, eq=False)
class MeshMemory(FirstRows):
  """The memory's unit keys split over the mesh's devices, and its rows' labels (module
  docstring).

  Attributes:
    mesh: the devices the keys live on.
    keys: (D, M, d) float32 unit E(x_j), axis 0 split over every device of `mesh`.
    rows: (D, M) int32, the memory row of each key, -1 for a padded slot; split likewise.
    labels: the labels of the memory's rows, on every process.
    limit: only rows below it vote (`head`).
  """

  mesh: jax.sharding.Mesh
  keys: jax.Array
  rows: jax.Array
  labels: SparseRows | StackedRows
  limit: int

  def nearest(self, queries: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Each query's k nearest memory rows by cosine, exactly; a collective of every process.

    Args:
      queries: (Q, d) E(x), split over every device of the mesh like an encoded block
        (normalised here); Q a multiple of the devices.
      k: neighbours per query (at most the memory's rows).
    Returns:
      ((Q, k) float32 cosine similarities, (Q, k) int32 memory rows), split like `queries`,
      most similar first (ties between devices: the lower device first); -inf and -1 where
      the memory holds fewer than k rows.
    """
    tile = max(k, TILE_FLOATS // max(queries.shape[0], 1))
    kernel = _search_kernel(self.mesh, k, min(tile, self.keys.shape[1]))
    return kernel(queries, self.keys, self.rows, jnp.int32(self.limit))

  def own_votes(self, queries: jax.Array, held: Sequence[int], vote: NeighbourVote) -> Votes:
    """The votes of the rows of an encoded block this process's devices hold; a collective.

    Args:
      queries: (Q, d) E(x) of the block, split over every device of the mesh.
      held: for each of this process's shards of `queries` (in their row order), how many
        of its rows are real (the rest pad the block's end).
      vote: the vote's settings.
    Returns:
      Votes of the held rows, in their order.
    """
    if not self.num_rows:
      return Votes.none(sum(held), vote.max_votes)
    sims, ids = self.nearest(queries, min(vote.neighbours, self.num_rows))
    ids = mesh_embedding.held_rows(ids, held).astype(np.int64)
    return neighbour_votes(ids, mesh_embedding.held_rows(sims, held), self.labels, vote)

  def own_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
    """(memory rows, their keys) of each of this process's devices, rows below `limit`
    only: what the export writes of this process's share (no collective)."""
    keys = sorted(self.keys.addressable_shards, key=lambda x: x.index[0].start or 0)
    rows = sorted(self.rows.addressable_shards, key=lambda x: x.index[0].start or 0)
    out = []
    for k, r in zip(keys, rows):
      ids = np.asarray(r.data).reshape(-1)
      kept = (ids >= 0) & (ids < self.limit)
      out.append((ids[kept], np.asarray(k.data).reshape(len(ids), -1)[kept]))
    return out


def device_room(mesh: jax.sharding.Mesh) -> int | None:
  """The fewest free bytes among this process's devices of `mesh` (bytes_limit - in use),
  or None where the backend does not say (CPUs)."""
  room = None
  for device in mesh.devices.flat:
    if device.process_index != jax.process_index():
      continue
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
      return None
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    room = free if room is None else min(room, free)
  return room


def embed_memory(
  mesh: jax.sharding.Mesh,
  encode: EncodeFn,
  enc_params,
  sources: Sequence[MemorySource],
  labels: SparseRows | StackedRows,
  batch_size: int,
) -> MeshMemory:
  """The memory of `sources`' rows (one after another) and their `labels`, each block of
  rows encoded over every device of `mesh` and left where it was encoded.

  Args:
    mesh: the devices to encode on and to hold the memory.
    encode: the inference-mode encoder (embedding.make_embed_fn).
    enc_params: its parameters, replicated on `mesh` (or a host copy in one process).
    sources: the rows, in the memory's order.
    labels: their labels, one row each, in the same order.
    batch_size: rows per call, rounded up to the devices.
  Returns:
    The memory.
  """
  n = check_rows(sources, labels)
  q = mesh_embedding.block_rows(mesh, batch_size)
  devices = mesh.devices.size
  slots = sum(-(-len(s) // q) for s in sources) * (q // devices)
  keys = rows = None
  at = 0
  for first, real, emb in encoded_blocks(mesh, encode, enc_params, sources, batch_size):
    if keys is None:
      keys, rows = _empty(mesh, devices, slots, emb.shape[1])
    keys, rows = _place(mesh)(keys, rows, emb, first, real, at)
    at += q // devices
  if keys is None:  # no rows: an empty memory of width 1
    keys, rows = _empty(mesh, devices, 0, 1)
  logging.info("neighbour vote: %d memory rows over %d devices", n, devices)
  return MeshMemory(mesh, keys, rows, labels, n)


def encoded_blocks(
  mesh: jax.sharding.Mesh,
  encode: EncodeFn,
  enc_params,
  sources: Sequence[MemorySource],
  batch_size: int,
) -> Iterator[tuple[int, int, jax.Array]]:
  """Each block of `sources`' rows (one source after another) encoded over every device of
  `mesh`, each process reading only its devices' token rows.

  Args:
    mesh, encode, enc_params, sources, batch_size: as embed_memory's.
  Yields:
    (the block's first memory row, its real rows, its (q, d) embeddings split over every
    device; rows past the real ones pad the last block of a source).
  """
  q = mesh_embedding.block_rows(mesh, batch_size)
  sharding = NamedSharding(mesh, P(ALL))
  run = mesh_embedding.encoder(mesh, encode)
  first = 0
  for source in sources:
    for start in range(0, len(source), q):
      stop = min(start + q, len(source))
      ids = mesh_embedding.block_array(
        sharding, source.tokens, start, stop, q, dtype=np.int32, rows=source.rows
      )
      yield first + start, stop - start, run(enc_params, ids)
    first += len(source)


def check_rows(sources: Sequence[MemorySource], labels: SparseRows | StackedRows) -> int:
  """The memory's rows, which must be its labels' rows."""
  n = sum(len(s) for s in sources)
  if n != labels.num_rows:
    raise ValueError(f"{n} memory rows but {labels.num_rows} label rows")
  return n


def _empty(mesh: jax.sharding.Mesh, devices: int, slots: int, d: int):
  sharding = NamedSharding(mesh, P(ALL))

  @functools.partial(jax.jit, out_shardings=(sharding, sharding))
  def empty():
    return jnp.zeros((devices, slots, d), jnp.float32), jnp.full((devices, slots), -1, jnp.int32)

  return empty()


@functools.lru_cache(maxsize=8)
def _place(mesh: jax.sharding.Mesh):
  """jit((keys, rows, block (Q, d), its first memory row, its real rows, slot) -> (keys,
  rows) with the block's unit rows written at `slot` of every device, each device's chunk of
  the block on that device)."""
  sharding = NamedSharding(mesh, P(ALL))

  def place(keys, rows, emb, first, valid, at):
    devices, _, d = keys.shape
    q = emb.shape[0]
    x = emb.astype(jnp.float32)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    x = jax.lax.with_sharding_constraint(x.reshape(devices, q // devices, d), sharding)
    local = jnp.arange(q, dtype=jnp.int32)
    ids = jnp.where(local < valid, first + local, -1).reshape(devices, q // devices)
    ids = jax.lax.with_sharding_constraint(ids, sharding)
    keys = jax.lax.dynamic_update_slice(keys, x, (0, at, 0))
    rows = jax.lax.dynamic_update_slice(rows, ids, (0, at))
    return keys, rows

  return jax.jit(place, donate_argnums=(0, 1), out_shardings=(sharding, sharding))


@functools.lru_cache(maxsize=32)
def _search_kernel(mesh: jax.sharding.Mesh, k: int, tile: int):
  """MeshMemory.nearest's compiled program, one per (mesh, k, tile)."""

  def body(queries, keys, rows, limit):
    group = jax.lax.all_gather(queries, ALL, tiled=True).astype(jnp.float32)
    group = group / jnp.maximum(jnp.linalg.norm(group, axis=1, keepdims=True), 1e-12)
    keys, rows = keys[0], rows[0]
    slots = keys.shape[0]
    tiles = -(-slots // tile)
    local = jnp.arange(tile, dtype=jnp.int32)

    def scan(t, carry):
      nominal = t * tile
      start = jnp.minimum(nominal, slots - tile)  # the last tile moved back inside the shard
      s = group @ jax.lax.dynamic_slice_in_dim(keys, start, tile).T
      ids = jax.lax.dynamic_slice_in_dim(rows, start, tile)
      # Slots the moved-back tile shares with its predecessor, padding, rows past the limit.
      keep = (start + local >= nominal) & (ids >= 0) & (ids < limit)
      return merge_topk(*carry, jnp.where(keep[None, :], s, -jnp.inf), ids, k)

    q = group.shape[0]
    init = (jnp.full((q, k), -jnp.inf, jnp.float32), jnp.full((q, k), -1, jnp.int32))
    s, i = jax.lax.fori_loop(0, tiles, scan, init)
    # Every device's (Q, k) candidates -> the best k, then this device's own queries.
    cand_s = jax.lax.all_gather(s, ALL, axis=1, tiled=True)
    cand_i = jax.lax.all_gather(i, ALL, axis=1, tiled=True)
    top_s, pos = jax.lax.top_k(cand_s, k)
    top_i = jnp.take_along_axis(cand_i, pos, axis=1)
    mine = queries.shape[0]
    first = jax.lax.axis_index(ALL) * mine
    return (
      jax.lax.dynamic_slice_in_dim(top_s, first, mine),
      jax.lax.dynamic_slice_in_dim(top_i, first, mine),
    )

  sharded = jax.shard_map(
    body,
    mesh=mesh,
    in_specs=(P(ALL), P(ALL), P(ALL), P()),
    out_specs=(P(ALL), P(ALL)),
    check_vma=False,
  )
  return jax.jit(sharded)
