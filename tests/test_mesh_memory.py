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
from ml_collections import ConfigDict

from astra_jax.ann import index as ann_index, mesh_memory, vote_memory
from astra_jax.ann.sharded_topk import ShardedSearch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import ranking
from astra_jax.parallel import sharding
from astra_jax.serving import export
from astra_jax.xc import neighbour_vote

ENCODE = jax.jit(lambda table, ids: table[ids].sum(axis=1))  # a stand-in encoder


def _mesh(data: int, model: int) -> jax.sharding.Mesh:
  return sharding.make_mesh(data, model, jax.devices()[: data * model])


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _problem(seed: int = 0, a: int = 37, b: int = 11, num_labels: int = 9):
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


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (2, 4), (4, 2)])
def test_mesh_memory_finds_the_dense_nearest_rows(shape):
  """Two sources, a block size that divides neither, k above the rows a device holds: the
  ids and cosines of a dense float64 search, over all rows and over the first source's."""
  mesh = _mesh(*shape)
  table, sources, labels, keys, rng = _problem()
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
  assert memory.num_rows == 48 and memory.keys.shape[0] == shape[0] * shape[1]
  np.testing.assert_allclose(memory.host.keys, _unit(keys), atol=1e-6)
  queries = rng.normal(size=(16, 8)).astype(np.float32)
  placed = jax.device_put(queries, NamedSharding(mesh, P(sharding.ALL)))
  k = 9  # more than the 7 slots a device of the 2 x 4 mesh holds
  for view, rows in ((memory, 48), (memory.head(37), 37)):
    sims, ids = view.nearest(placed, k)
    cos = _unit(queries) @ _unit(keys[:rows]).T
    want = np.argsort(-cos, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(np.asarray(ids), want)
    np.testing.assert_allclose(np.asarray(sims), np.take_along_axis(cos, want, 1), atol=1e-5)
  np.testing.assert_allclose(memory.head(37).host.keys, _unit(keys[:37]), atol=1e-6)


@pytest.mark.parametrize("shape,lo", [((2, 2), 3), ((1, 4), 0), ((4, 1), 5)])
def test_a_search_votes_from_the_mesh_memory_as_from_the_host_memory(shape, lo):
  """The ranking of a voted search reading the mesh memory equals the one reading the same
  rows whole on the host (vote_memory.Memory)."""
  mesh = _mesh(*shape)
  table, sources, labels, _, rng = _problem(seed=1, num_labels=30)
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
  num_labels, n = 30, 23
  w = np.zeros((sharding.padded_rows(num_labels, mesh), 8), np.float32)
  w[:num_labels] = rng.normal(size=(num_labels, 8))
  tokens = rng.integers(0, 64, size=(n, 3)).astype(np.int32)
  vote = neighbour_vote.NeighbourVote(0.7, 5, 0.1, 8)
  search = ShardedSearch(mesh, num_labels, 7, None, vote)
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), None)

  def ranked(where):
    found = search.search_rows(ENCODE, table, tokens, lo, n, 5, parts, 8, memory=where)
    return np.concatenate([x for _, x in found])

  for view in (memory, memory.head(37)):
    np.testing.assert_array_equal(ranked(view), ranked(view.host))


def test_an_empty_memory_votes_for_nothing():
  mesh = _mesh(2, 2)
  table, _, _, _, _ = _problem()
  empty = mesh_memory.MemorySource(np.zeros((0, 3), np.int32))
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, [empty], SparseRows.from_lists([], 9), 8)
  emb = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P(sharding.ALL)))
  votes = memory.own_votes(emb, [2, 2, 2, 2], neighbour_vote.NeighbourVote(0.5, 3, 0.1, 4))
  assert votes.ids.shape == (8, 4) and (votes.ids == -1).all()


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_scann_search_reads_the_gathered_keys():
  """`search=scann` with every row in the budget: the votes of the exact mesh search."""
  mesh = _mesh(2, 2)
  table, sources, labels, _, rng = _problem(seed=2)
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
  mesh = _mesh(2, 4)
  table, sources, labels, _, _ = _problem(a=2000, b=0)
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources[:1], labels.head(2000), 16)
  emb = jax.device_put(jnp.zeros((16, 8)), NamedSharding(mesh, P(sharding.ALL)))
  place = mesh_memory._place(mesh).lower(memory.keys, memory.rows, emb, 0, 16, 0)
  assert _collectives(place.compile().as_text()) == []
  k, slots = 5, memory.keys.shape[1]
  search = mesh_memory._search_kernel(mesh, k, slots)
  hlo = search.lower(emb, memory.keys, memory.rows, jnp.int32(2000)).compile().as_text()
  sizes = [n for kind, n in _collectives(hlo)]
  assert sizes and max(sizes) <= 16 * max(8, 8 * k) < slots * 8, sizes


@pytest.mark.parametrize("room", [None, 1 << 40, 864, 863])
def test_a_memory_too_large_for_the_devices_stays_on_the_host(monkeypatch, room):
  """Where a device's share would take more than half its free memory, the memory is
  gathered onto the host (vote_memory.Memory) instead: the same keys either way."""
  mesh = _mesh(2, 2)
  table, sources, labels, keys, _ = _problem()
  monkeypatch.setattr(mesh_memory, "device_room", lambda mesh: room)
  params = {"encoder": table, "classifier": np.zeros((9, 8), np.float32)}
  config = ConfigDict({"eval": {"batch_size": 8}})
  memory = ranking.vote_memory(mesh, ENCODE, params, sources, labels, config)
  # A device's share: 12 rows of 8 float32 and a row id, 432 bytes; half the room must
  # hold it, so 864 bytes is the least room that keeps the memory on the devices.
  on_devices = room is None or room >= 864
  assert isinstance(memory, mesh_memory.MeshMemory if on_devices else vote_memory.Memory)
  host = memory.host if on_devices else memory
  np.testing.assert_allclose(host.keys, _unit(keys), atol=1e-6)
  np.testing.assert_array_equal(host.labels.to_dense(), labels.to_dense())


def test_the_export_writes_the_keys_in_row_order(tmp_path):
  """write_memory_keys: each device's rows at their row ids (the memory's first `num_rows`),
  or a host memory whole: the unit keys in row order either way."""
  mesh = _mesh(2, 4)
  table, sources, labels, keys, _ = _problem()
  memory = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
  for which, rows in ((memory, 48), (memory.head(37), 37), (memory.host.head(30), 30)):
    path = str(tmp_path / f"keys{rows}.npy")
    export.write_memory_keys(which, path)
    np.testing.assert_allclose(np.load(path), _unit(keys[:rows]), atol=1e-6)
