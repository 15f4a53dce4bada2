"""The neighbour vote's memory split over the mesh (ann/mesh_memory.py) against a dense numpy
search, against the host memory's votes, and its compiled programs against the promise that
the keys never leave their devices."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from vote_memory_problem import ENCODE, dense_memory, mesh_of, problem, unit, written_keys

from astra_jax.ann import index as ann_index, mesh_memory, vote_memory
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.parallel import sharding
from astra_jax.serving import export
from astra_jax.xc import neighbour_vote


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (2, 4), (4, 2)])
def test_mesh_memory_finds_the_dense_nearest_rows(shape):
  """Two sources, a block size that divides neither, k above the rows a device holds: the
  ids and cosines of a dense float64 search, over all rows and over the first source's."""
  mesh = mesh_of(*shape)
  table, sources, labels, keys, rng = problem()
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
  assert memory.num_rows == 48 and memory.keys.shape[0] == shape[0] * shape[1]
  np.testing.assert_allclose(written_keys(memory), unit(keys), atol=1e-6)
  queries = rng.normal(size=(16, 8)).astype(np.float32)
  placed = jax.device_put(queries, NamedSharding(mesh, P(sharding.ALL)))
  k = 9  # more than the 7 slots a device of the 2 x 4 mesh holds
  for view, rows in ((memory, 48), (memory.head(37), 37)):
    sims, ids = view.nearest(placed, k)
    cos = unit(queries) @ unit(keys[:rows]).T
    want = np.argsort(-cos, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(np.asarray(ids), want)
    np.testing.assert_allclose(np.asarray(sims), np.take_along_axis(cos, want, 1), atol=1e-5)
  np.testing.assert_allclose(written_keys(memory.head(37)), unit(keys[:37]), atol=1e-6)


def test_an_empty_memory_votes_for_nothing():
  mesh = mesh_of(2, 2)
  table, _, _, _, _ = problem()
  empty = mesh_memory.MemorySource(np.zeros((0, 3), np.int32))
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, [empty], SparseRows.from_lists([], 9), 8)
  emb = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P(sharding.ALL)))
  votes = memory.own_votes(emb, [2, 2, 2, 2], neighbour_vote.NeighbourVote(0.5, 3, 0.1, 4))
  assert votes.ids.shape == (8, 4) and (votes.ids == -1).all()


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_scann_vote_searches_the_mesh_memory_exactly():
  """The mesh memory is always searched exactly (a memory the vote searches with ScaNN is
  built whole on the host instead: ranking.vote_memory): `search=scann` with every row in
  the budget votes as the exact search does."""
  mesh = mesh_of(2, 2)
  table, sources, labels, _, rng = problem(seed=2)
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
  exact = neighbour_vote.NeighbourVote(0.5, 6, 0.1, 8, search="exact")
  scann = dataclasses.replace(exact, search="scann", search_rows=48)
  searches = vote_memory.searches_with_scann
  assert searches(memory.num_rows, scann) and not searches(memory.num_rows, exact)
  emb = jax.device_put(rng.normal(size=(16, 8)), NamedSharding(mesh, P(sharding.ALL)))
  a, b = memory.own_votes(emb, [4] * 4, scann), memory.own_votes(emb, [4] * 4, exact)
  np.testing.assert_allclose(a.values, b.values, atol=1e-5)


def _collectives(hlo: str) -> list[tuple[str, int]]:
  """(kind, elements of the result) of every cross-device operation of a compiled module."""
  found = []
  for line in hlo.splitlines():
    kind = re.search(r"\b(all-gather|all-to-all|collective-permute|all-reduce)(-start)?\(", line)
    if kind and "=" in line:
      dims = re.findall(r"[fsu]\d+\[([\d,]*)\]", line.split("=", 1)[1].split(kind.group(1))[0])
      for d in dims:
        found.append((kind.group(1), int(np.prod([int(x) for x in d.split(",") if x] or [1]))))
  return found


def test_the_keys_stay_where_they_were_encoded():
  """Placing a block moves nothing between devices; a search gathers the block's queries
  (Q x d) and the candidates (Q x D k), never keys."""
  mesh = mesh_of(2, 4)
  table, sources, labels, _, _ = problem(a=2000, b=0)
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources[:1], labels.head(2000), 16)
  emb = jax.device_put(jnp.zeros((16, 8)), NamedSharding(mesh, P(sharding.ALL)))
  place = mesh_memory._place(mesh).lower(memory.keys, memory.rows, emb, 0, 16, 0)
  assert _collectives(place.compile().as_text()) == []
  k, slots = 5, memory.keys.shape[1]
  search = mesh_memory._search_kernel(mesh, k, slots)
  hlo = search.lower(emb, memory.keys, memory.rows, jnp.int32(2000)).compile().as_text()
  sizes = [n for kind, n in _collectives(hlo)]
  assert sizes and max(sizes) <= 16 * max(8, 8 * k) < slots * 8, sizes


def test_the_export_writes_the_keys_in_row_order(tmp_path):
  """write_memory_keys: each device's rows at their row ids (the memory's first `num_rows`),
  or a host memory whole: the unit keys in row order either way."""
  mesh = mesh_of(2, 4)
  table, sources, labels, keys, _ = problem()
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
  host = dense_memory(keys, labels).head(30)
  for which, rows in ((memory, 48), (memory.head(37), 37), (host, 30)):
    path = str(tmp_path / f"keys{rows}.npy")
    export.write_memory_keys(which, path)
    np.testing.assert_allclose(np.load(path), unit(keys[:rows]), atol=1e-6)
