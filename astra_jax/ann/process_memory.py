"""The neighbour vote's memory on the hosts, each process holding the rows its devices
encoded.

Where a device has no room for its share of the memory (memory_search.fits_devices), or
`scoring.neighbour_memory=hosts` says so, the keys go to host RAM instead of the devices
(mesh_memory.py keeps them there otherwise). Had
every process gathered the whole memory, SS-20M's 146M x 64 float32 keys would take 35 GiB
of every process's RAM; here each process keeps only the rows its own devices encoded, 1/P
of them, as the mesh layout keeps 1/D on each device.

A search (`ProcessMemory.own_votes_blocks`) gathers the queries (Q x d) of many encoded
blocks onto every process, each process searches its own rows for all of them exactly
(vote_memory.nearest, on its default device, its share streamed there a key block at a time:
once a search, so a search takes `query_rows_per_search` queries), and the processes'
candidates (Q x P k) are gathered and merged, each process keeping its own queries' best k.
Only queries and candidates cross processes; the flops are split over the processes, one
device each, as they were when each searched the whole memory for its own queries. Ties rank
the lower memory row first, as the whole memory's search does.

The labels of the memory rows stay on the host of every process (as in mesh_memory.py). The
search is always exact: a memory the vote searches through ScaNN is built whole on every
host instead (evaluation/ranking.vote_memory).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from astra_jax.ann import memory_search, mesh_memory
from astra_jax.ann.mesh_memory import EncodeFn, MemorySource
from astra_jax.ann.vote_memory import FirstRows, nearest, neighbour_votes
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.parallel import mesh_embedding
from astra_jax.runtime import distributed
from astra_jax.xc.neighbour_vote import NeighbourVote, Votes
from astra_jax.xc.score_fusion import unit_rows


@dataclasses.dataclass(frozen=True, eq=False)
class ProcessMemory(FirstRows):
  """This process's rows of the memory, on its host, and every row's labels (module
  docstring).

  Attributes:
    keys: (S, d) float32 unit E(x_j) of the rows this process's devices encoded.
    rows: (S,) int64, their memory rows, ascending.
    labels: the labels of all the memory's rows, on every process.
    limit: only rows below it vote (`head`).
  """

  keys: np.ndarray
  rows: np.ndarray
  labels: SparseRows | StackedRows
  limit: int

  @functools.cached_property
  def _held(self) -> int:
    """How many of this process's rows lie below `limit` (its rows ascend)."""
    return int(np.searchsorted(self.rows, self.limit))

  def nearest(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every process's queries' k nearest memory rows by cosine, exactly; a collective of
    every process, each passing the same queries.

    Args:
      queries: (Q, d) E(x) (normalised here), the same on every process.
      k: neighbours per query.
    Returns:
      ((Q, k) int64 memory rows, -1 for none; (Q, k) float32 cosines, -inf for none), most
      similar first (ties: the lower row first).
    """
    k, n = min(k, self.limit), len(queries)
    ids, sims = np.full((n, k), -1, np.int64), np.full((n, k), -np.inf, np.float32)
    if self._held and n:
      # Streamed from the host a key block at a time: the share is here because the
      # devices have no room for it.
      found, cos = nearest(queries, self.keys[: self._held], k)
      ids[:, : found.shape[1]] = self.rows[found]
      sims[:, : found.shape[1]] = cos
    if jax.process_count() == 1:
      return ids, sims
    ids = np.asarray(multihost_utils.process_allgather(ids.astype(np.int32)), np.int64)
    sims = np.asarray(multihost_utils.process_allgather(sims), np.float32)
    return merge_candidates(ids, sims, k)

  # Every search streams the process's share of the keys to its device once: a search
  # takes this many query rows (many blocks), so that the transfer is small beside the
  # search's flops (memory_search.PROCESS_QUERY_ROWS).
  query_rows_per_search = memory_search.PROCESS_QUERY_ROWS

  def own_votes(self, queries: jax.Array, held: Sequence[int], vote: NeighbourVote) -> Votes:
    """The votes of the rows of an encoded block this process's devices hold; a collective
    (as mesh_memory.MeshMemory.own_votes).

    Args:
      queries: (Q, d) E(x) of the block, split over every device of the mesh.
      held: for each of this process's shards of `queries`, in row order, its real rows.
      vote: the vote's settings.
    Returns:
      Votes of the held rows, in their order.
    """
    return self.own_votes_blocks([(queries, held)], vote)[0]

  def own_votes_blocks(
    self, blocks: Sequence[tuple[jax.Array, Sequence[int]]], vote: NeighbourVote
  ) -> list[Votes]:
    """`own_votes` of each (block, held) of `blocks`, in one search of this process's rows
    for every block's queries; a collective."""
    if not self.num_rows:
      return [Votes.none(sum(held), vote.max_votes) for _, held in blocks]
    every = np.concatenate([distributed.gather_rows(queries) for queries, _ in blocks])
    ids, sims = self.nearest(every, vote.neighbours)
    out, at = [], 0
    for queries, held in blocks:
      mine = at + mesh_embedding.held_positions(queries, held)
      out.append(neighbour_votes(ids[mine], sims[mine], self.labels, vote))
      at += queries.shape[0]
    return out

  def own_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
    """(memory rows, their keys) of this process, rows below `limit` only: what the export
    writes of its share (no collective)."""
    return [(self.rows[: self._held], self.keys[: self._held])]


def merge_candidates(ids: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The best k of every process's candidates for the same queries.

  Args:
    ids: (P, Q, k') memory rows, -1 for none.
    sims: (P, Q, k') their cosines, -inf for none.
    k: neighbours to keep per query (at most P k').
  Returns:
    ((Q, k) ids, (Q, k) cosines), most similar first, ties ranking the lower row first.
  """
  ids = np.concatenate(list(ids), axis=1)
  sims = np.concatenate(list(sims), axis=1)
  # A missing candidate (-1) sorts after every row at the same -inf, so after all real ones.
  rank = np.where(ids < 0, np.iinfo(np.int64).max, ids)
  order = np.lexsort((rank, -sims), axis=-1)[:, :k]
  return np.take_along_axis(ids, order, 1), np.take_along_axis(sims, order, 1)


def embed_process_memory(
  mesh: jax.sharding.Mesh,
  encode: EncodeFn,
  enc_params,
  sources: Sequence[MemorySource],
  labels: SparseRows | StackedRows,
  batch_size: int,
) -> ProcessMemory:
  """The memory of `sources`' rows (one after another) and their `labels`, each block of
  rows encoded over every device of `mesh`, each process keeping its devices' rows on its
  host.

  Args:
    mesh: the devices to encode on.
    encode: the inference-mode encoder (embedding.make_embed_fn).
    enc_params: its parameters, replicated on `mesh` (or a host copy in one process).
    sources: the rows, in the memory's order.
    labels: their labels, one row each, in the same order.
    batch_size: rows per call, rounded up to the devices.
  Returns:
    The memory.
  """
  n = mesh_memory.check_rows(sources, labels)
  keys, rows, d = [], [], 1
  for first, real, emb in mesh_memory.encoded_blocks(mesh, encode, enc_params, sources, batch_size):
    d = emb.shape[1]
    for shard in sorted(emb.addressable_shards, key=lambda x: x.index[0].start or 0):
      at = shard.index[0].start or 0
      held = max(0, min(real - at, shard.data.shape[0]))
      if held:
        keys.append(unit_rows(np.asarray(shard.data)[:held]))
        rows.append(first + at + np.arange(held, dtype=np.int64))
  keys = np.concatenate(keys) if keys else np.zeros((0, d), np.float32)
  rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
  logging.info(
    "neighbour vote: %d of the %d memory rows on this process's host (%.2f GiB)",
    len(rows),
    n,
    keys.nbytes / 2**30,
  )
  return ProcessMemory(keys, rows, labels, n)
