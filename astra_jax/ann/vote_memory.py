"""The neighbour vote's memory (xc/neighbour_vote.py) whole on the host: the training rows
that vote, as their unit embeddings and labels, and the search for a query's nearest rows
among them. The Predictor reads the exported memory so; a training run keeps its memory
split over the devices that encoded it (mesh_memory.py), or over the processes' hosts where
the devices have no room for it (process_memory.py), both searched exactly, and builds it
whole here only where the vote searches it through ScaNN (evaluation/ranking.vote_memory).

The search is exact by default, in (query block x key block) tiles on the device with a
running top k (`nearest`), so its memory is bounded by the tile whatever the number of
rows N and its time grows as N per query; on CPUs a memory of more than four times the
ScaNN budget is searched with a ScaNN index built over it on the host (memory_search.py), a
fixed number of rows per query. A memory too large for a device stays on the host and
reaches the device a key block at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from astra_jax.ann import index as ann_index, memory_search
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.parallel import mesh_embedding
from astra_jax.runtime import cpu_budget, distributed
from astra_jax.xc.neighbour_vote import NeighbourVote, Votes, label_votes
from astra_jax.xc.score_fusion import unit_rows


class IndexStore(Protocol):
  """Keeps a ScaNN index over a memory's keys between processes."""

  def get(
    self,
    build: Callable[[], ann_index.ScannIndex],
    shape: tuple[int, int],
    params: ann_index.ScannParams,
    threads: int = 0,
  ) -> ann_index.ScannIndex:
    """The index kept for rows of `shape` built with `params`, else `build()`'s, kept."""


class VoteMemory(Protocol):
  """The memory rows the vote reads, wherever they live: whole on the host (`Memory`), split
  over the devices (mesh_memory.MeshMemory) or over the processes' hosts
  (process_memory.ProcessMemory)."""

  labels: SparseRows | StackedRows

  @property
  def num_rows(self) -> int:
    """The rows that vote."""

  @property
  def dim(self) -> int:
    """The keys' width d."""

  def head(self, n: int) -> VoteMemory:
    """The memory of its first n rows."""

  @property
  def query_rows_per_search(self) -> int:
    """Query rows a search takes at once, over several blocks (0: one block a search)."""

  def own_votes(self, queries: jax.Array, held: Sequence[int], vote: NeighbourVote) -> Votes:
    """The votes of the rows of an encoded block this process's devices hold; every process
    calls it for each block."""

  def own_votes_blocks(
    self, blocks: Sequence[tuple[jax.Array, Sequence[int]]], vote: NeighbourVote
  ) -> list[Votes]:
    """`own_votes` of each (block, held) of `blocks`, in one search where the memory can."""

  def own_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
    """(memory rows, their keys) this process writes on export."""


class BlockBySearch:
  """A memory searched one block of queries at a time (`VoteMemory`'s defaults)."""

  query_rows_per_search = 0

  def own_votes_blocks(
    self, blocks: Sequence[tuple[jax.Array, Sequence[int]]], vote: NeighbourVote
  ) -> list[Votes]:
    """`own_votes` of each (block, held) of `blocks`, one search each."""
    return [self.own_votes(queries, held, vote) for queries, held in blocks]


class FirstRows(BlockBySearch):
  """What a memory whose first `limit` rows vote shares, however its keys are laid out
  (mesh_memory.MeshMemory, process_memory.ProcessMemory): a frozen dataclass with `keys`
  (..., d), `labels` of all its rows and `limit`."""

  @property
  def num_rows(self) -> int:
    return self.limit

  @property
  def dim(self) -> int:
    return self.keys.shape[-1]

  def head(self, n: int):
    """The memory of its first n rows (the same keys, the rest left out of every search)."""
    if not 0 <= n <= self.labels.num_rows:
      raise ValueError(f"{n} rows of a memory of {self.labels.num_rows}")
    return dataclasses.replace(self, limit=n)


@dataclasses.dataclass(frozen=True)
class Memory(BlockBySearch):
  """The training rows that vote: their unit-norm embeddings and their labels.

  Attributes:
    keys: (N, d) float32, E(x_j) / |E(x_j)|.
    labels: the N rows' labels.
    index_store: where a ScaNN index over the keys is kept between processes (an exported
      model's directory: serving/serve_index.MemoryIndexStore); None: built in memory.
  """

  keys: np.ndarray
  labels: SparseRows | StackedRows
  index_store: IndexStore | None = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    if len(self.keys) != self.labels.num_rows:
      raise ValueError(f"{len(self.keys)} memory rows but {self.labels.num_rows} label rows")

  @classmethod
  def from_embeddings(cls, embeddings: np.ndarray, labels: SparseRows | StackedRows) -> Memory:
    return cls(unit_rows(embeddings), labels)

  @property
  def num_rows(self) -> int:
    return len(self.keys)

  @property
  def dim(self) -> int:
    return self.keys.shape[1]

  def head(self, n: int) -> Memory:
    """The memory of its first n rows (a view of the keys)."""
    return self if n == self.num_rows else Memory(self.keys[:n], self.labels.head(n))

  def with_index_store(self, store: IndexStore) -> Memory:
    """The same rows, their ScaNN index kept in `store`."""
    return dataclasses.replace(self, index_store=store)

  @functools.cached_property
  def search_keys(self) -> jax.Array | np.ndarray:
    """The keys a search reads: on the default device, placed once for every search, when
    they take at most RESIDENT_KEY_BYTES; else the host array, streamed a block at a time
    (a memory of 146M rows of d = 64 is 37 GB, more than a V100 holds)."""
    if self.keys.nbytes <= RESIDENT_KEY_BYTES:
      return jnp.asarray(self.keys, jnp.float32)
    return self.keys

  @functools.cached_property
  def _scann_indexes(self) -> dict:
    return {}  # the build's knobs -> the ScaNN index over the keys, built on first use

  def scann_index(self, params: ann_index.ScannParams) -> ann_index.ScannIndex:
    """The ScaNN index over the keys built with `params`, once for every search: the leaves
    a query opens and the candidates it re-ranks are the search's, not the build's."""
    key = dataclasses.replace(params, num_leaves_to_search=1, reorder=1)
    if key not in self._scann_indexes:
      # The task's share of the cores, not ScaNN's default of every core of the machine.
      threads = cpu_budget.task_cpus()
      build = functools.partial(memory_search.scann_index, self.keys, params, threads)
      if self.index_store is not None:  # loaded, or built and kept (the store logs which)
        index = self.index_store.get(build, self.keys.shape, key, threads)
      else:
        start = time.perf_counter()
        index = build()
        logging.info(
          "neighbour vote: ScaNN index over %d memory rows (%d leaves) built in %.1f s",
          len(self.keys),
          params.num_leaves,
          time.perf_counter() - start,
        )
      self._scann_indexes[key] = index
    return self._scann_indexes[key]

  def nearest(
    self, queries: np.ndarray, vote: NeighbourVote, block: int = 1024
  ) -> tuple[np.ndarray, np.ndarray]:
    """Each query's `vote.neighbours` nearest rows, found as `vote.search` says.

    Args:
      queries: (n, d) E(x) (normalised here).
      vote: the vote's settings.
      block: queries per exact search call.
    Returns:
      ((n, k) row ids, -1 for none, (n, k) cosine similarities, -inf for none), most
      similar first.
    """
    # No queries: the exact search's empty answer.
    if len(queries) and searches_with_scann(self.num_rows, vote):
      k = vote.neighbours
      params = memory_search.scann_params(self.num_rows, k, vote.search_rows)
      return self.scann_index(params).search_scored(
        unit_rows(queries), k, params.num_leaves_to_search, params.reorder
      )
    return nearest(queries, self.search_keys, vote.neighbours, block)

  def votes(self, queries: np.ndarray, vote: NeighbourVote, block: int = 1024) -> Votes:
    """The votes of each query's `vote.neighbours` nearest rows.

    Args:
      queries: (n, d) E(x) (normalised here).
      vote: the vote's settings.
      block: queries per exact search call.
    Returns:
      Votes (n, vote.max_votes), most voted first (ties: the lower label id).
    """
    return neighbour_votes(*self.nearest(queries, vote, block), self.labels, vote)

  def own_votes(self, queries: jax.Array, held: Sequence[int], vote: NeighbourVote) -> Votes:
    """The votes of the rows of an encoded block this process's devices hold (as
    mesh_memory.MeshMemory.own_votes; no collective here).

    Args:
      queries: (Q, d) E(x) of the block, split over the mesh's devices.
      held: for each of this process's shards of `queries`, in row order, its real rows.
      vote: the vote's settings.
    Returns:
      Votes of the held rows, in their order.
    """
    return self.votes(mesh_embedding.held_rows(queries, held), vote)

  def own_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
    """(memory rows, their keys) this process writes of the memory on export: all of them
    on process 0 (every process holds the same), none elsewhere."""
    return [(np.arange(self.num_rows), self.keys)] if distributed.is_leader() else []


def searches_with_scann(rows: int, vote: NeighbourVote) -> bool:
  """Whether `vote` searches a memory of `rows` rows through a ScaNN index: as
  memory_search.SEARCHES says on this backend, and ScaNN is installed (without it every
  search is exact, after one warning)."""
  accelerator = jax.default_backend() != "cpu"
  if not memory_search.SEARCHES[vote.search].uses_scann(rows, vote.search_rows, accelerator):
    return False
  if not ann_index.scann_available():
    ann_index.warn_scann_missing()
    return False
  return True


def neighbour_votes(
  neighbours: np.ndarray, sims: np.ndarray, labels: SparseRows | StackedRows, vote: NeighbourVote
) -> Votes:
  """The vote of each query's neighbours (xc/neighbour_vote.py): weights
  exp((cos - best cos) / tau), normalised by their sum.

  Args:
    neighbours: (n, k) memory rows, most similar first (-1: none).
    sims: (n, k) their cosines (-inf: none).
    labels: the memory rows' labels.
    vote: the vote's settings.
  Returns:
    Votes (n, vote.max_votes), most voted first (ties: the lower label id).
  """
  weights = np.exp((sims - sims[:, :1]) / vote.temperature) if len(sims) else sims
  return label_votes(neighbours, weights, labels, vote.max_votes, normalise=True)


def _normalise(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# A memory up to this size stays on the device between searches; a larger one is streamed.
RESIDENT_KEY_BYTES = 4 << 30
# Scores of one (query block x key block) tile: 256 MB of float32 whatever the memory's size.
TILE_FLOATS = 1 << 26


@functools.partial(jax.jit, static_argnames=("k",))
def _nearest_block(
  queries: jax.Array, keys: jax.Array, k: int, offset: int = 0
) -> tuple[jax.Array, jax.Array]:
  # One compiled search per (block shape, key block shape, k): a server's calls reuse it.
  sims, ids = jax.lax.top_k(_normalise(queries) @ _normalise(keys).T, k)
  return sims, ids + offset


@functools.partial(jax.jit, static_argnames=("k",))
def _merge(
  sims: jax.Array, ids: jax.Array, more_sims: jax.Array, more_ids: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
  # The running top k comes first and holds the lower ids, and top_k prefers the lower
  # position among equal values: ties go to the lower id, as one search over all keys would.
  top, where = jax.lax.top_k(jnp.concatenate([sims, more_sims], axis=1), k)
  return top, jnp.take_along_axis(jnp.concatenate([ids, more_ids], axis=1), where, axis=1)


def nearest(
  queries: np.ndarray, keys, k: int, block: int = 1024, tile_floats: int = TILE_FLOATS
) -> tuple[np.ndarray, np.ndarray]:
  """The k most cosine-similar keys of each query, exactly, in (query block x key block)
  tiles: each key block's top k is merged into a running top k, so memory is bounded by
  the tile, not by the number of keys. Each key block moves to the device once.

  Args:
    queries: (n, d) embeddings (normalised here).
    keys: (m, d) embeddings, on the host or the device (normalised here).
    k: neighbours per query (at most m).
    block: queries per matmul.
    tile_floats: scores per tile; key blocks hold max(k, tile_floats // block) keys.
  Returns:
    ((n, k) int64 key ids, (n, k) float32 cosine similarities), most similar first (ties:
    the lower id first).
  """
  num_keys, n = keys.shape[0], len(queries)
  k = min(k, num_keys)
  if not n:
    return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
  key_block = max(k, tile_floats // block)
  query_blocks = [
    jnp.asarray(queries[start : start + block], jnp.float32) for start in range(0, n, block)
  ]
  best: list[tuple[jax.Array, jax.Array] | None] = [None] * len(query_blocks)
  for r in range(0, num_keys, key_block):
    part = keys if key_block >= num_keys else keys[r : r + key_block]
    part = jnp.asarray(part, jnp.float32)
    kk = min(k, part.shape[0])
    for b, q in enumerate(query_blocks):
      found = _nearest_block(q, part, kk, r)
      best[b] = found if best[b] is None else _merge(*best[b], *found, k)
  sims = np.concatenate([np.asarray(s) for s, _ in best])
  ids = np.concatenate([np.asarray(i, np.int64) for _, i in best])
  return ids, sims
