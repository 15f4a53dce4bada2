"""The neighbour vote's memory split over the processes' hosts (ann/process_memory.py)
against a dense numpy search, against the whole host memory's votes, and the merge of the
processes' candidates against one search over all rows."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from ml_collections import ConfigDict
from vote_memory_problem import ENCODE, dense_memory, mesh_of, problem, unit, written_keys

from astra_jax.ann import index as ann_index, mesh_memory, process_memory, vote_memory
from astra_jax.ann.sharded_topk import ShardedSearch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import ranking
from astra_jax.parallel import sharding
from astra_jax.serving import export
from astra_jax.xc import neighbour_vote


def _memory(shape, seed=0, num_labels=9):
  mesh = mesh_of(*shape)
  table, sources, labels, keys, rng = problem(seed=seed, num_labels=num_labels)
  memory = process_memory.embed_process_memory(mesh, ENCODE, table, sources, labels, 8)
  return mesh, table, memory, keys, rng


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (2, 4)])
def test_process_memory_finds_the_dense_nearest_rows(shape):
  """Two sources (one read in reverse), blocks that divide neither: every row on this one
  process, ascending, and the ids and cosines of a dense float64 search, over all rows and
  over the first source's."""
  _, _, memory, keys, rng = _memory(shape)
  assert memory.num_rows == 48 and np.array_equal(memory.rows, np.arange(48))
  np.testing.assert_allclose(memory.keys, unit(keys), atol=1e-6)
  queries = rng.normal(size=(16, 8)).astype(np.float32)
  for view, rows in ((memory, 48), (memory.head(37), 37)):
    ids, sims = view.nearest(queries, 9)
    cos = unit(queries) @ unit(keys[:rows]).T
    want = np.argsort(-cos, axis=1, kind="stable")[:, :9]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(sims, np.take_along_axis(cos, want, 1), atol=1e-5)
  np.testing.assert_allclose(written_keys(memory.head(37)), unit(keys[:37]), atol=1e-6)


def test_the_processes_candidates_merge_to_one_search_over_all_rows():
  """Rows dealt to 3 processes at random (one holding fewer than k), ties planted across
  them: merging each one's best k equals the best k of all rows, ties to the lower row."""
  rng = np.random.default_rng(3)
  cos = rng.normal(size=(20, 40)).astype(np.float32)
  cos[:, 30] = cos[:, 5]  # the same cosine for rows 5 and 30, and for rows 12, 13 and 31
  cos[:, 13] = cos[:, 31] = cos[:, 12]
  owner = rng.integers(0, 3, 40)
  owner[:3] = 2  # process 2 keeps exactly 3 rows, fewer than k
  owner[3:][owner[3:] == 2] = 0
  k = 7
  ids = np.full((3, 20, k), -1, np.int64)
  sims = np.full((3, 20, k), -np.inf, np.float32)
  for p in range(3):
    rows = np.flatnonzero(owner == p)
    best = np.argsort(-cos[:, rows], axis=1, kind="stable")[:, :k]
    ids[p, :, : best.shape[1]] = rows[best]
    sims[p, :, : best.shape[1]] = np.take_along_axis(cos[:, rows], best, 1)
  got_ids, got_sims = process_memory.merge_candidates(ids, sims, k)
  want = np.argsort(-cos, axis=1, kind="stable")[:, :k]
  np.testing.assert_array_equal(got_ids, want)
  np.testing.assert_array_equal(got_sims, np.take_along_axis(cos, want, 1))
  # Fewer rows than k in all (process 2 alone): its 3 rows, then -1 at -inf.
  few_ids, few_sims = process_memory.merge_candidates(ids[2:], sims[2:], k)
  np.testing.assert_array_equal(few_ids[:, :3], ids[2, :, :3])
  assert (few_ids[:, 3:] == -1).all() and np.isneginf(few_sims[:, 3:]).all()


@pytest.mark.parametrize("shape,lo", [((2, 2), 3), ((1, 4), 0), ((4, 1), 5)])
def test_a_search_votes_from_either_layout_as_from_the_host_memory(shape, lo):
  """The ranking of a voted search reading the processes' shares, and the one reading the
  mesh memory, equal the one reading the same rows whole on the host (vote_memory.Memory)."""
  mesh, table, memory, keys, rng = _memory(shape, seed=1, num_labels=30)
  _, sources, labels, _, _ = problem(seed=1, num_labels=30)
  on_mesh = mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, batch_size=8)
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

  for rows, view, mesh_view in ((48, memory, on_mesh), (37, memory.head(37), on_mesh.head(37))):
    want = ranked(dense_memory(keys, labels, rows))
    np.testing.assert_array_equal(ranked(view), want)
    np.testing.assert_array_equal(ranked(mesh_view), want)


@pytest.mark.parametrize("per_search,searches", [(16, 2), (1 << 16, 1), (0, 3)])
def test_the_process_memory_searches_many_blocks_at_once(monkeypatch, per_search, searches):
  """Rows 3 to 23 in blocks of 8: a memory that takes 16 query rows a search searches its
  rows twice (two blocks, then one), one of 2^16 once, one of 0 once a block; the same
  ranking as the host memory's every time."""
  mesh, table, memory, keys, rng = _memory((2, 2), seed=5, num_labels=30)
  num_labels, n = 30, 23
  w = np.zeros((sharding.padded_rows(num_labels, mesh), 8), np.float32)
  w[:num_labels] = rng.normal(size=(num_labels, 8))
  tokens = rng.integers(0, 64, size=(n, 3)).astype(np.int32)
  search = ShardedSearch(mesh, num_labels, 7, None, neighbour_vote.NeighbourVote(0.7, 5, 0.1, 8))
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), None)
  calls = []
  nearest = process_memory.ProcessMemory.nearest
  monkeypatch.setattr(process_memory.ProcessMemory, "query_rows_per_search", per_search)
  monkeypatch.setattr(
    process_memory.ProcessMemory,
    "nearest",
    lambda self, queries, k: calls.append(len(queries)) or nearest(self, queries, k),
  )

  def ranked(where):
    found = search.search_rows(ENCODE, table, tokens, 3, n, 5, parts, 8, memory=where)
    return np.concatenate([x for _, x in found])

  np.testing.assert_array_equal(ranked(memory), ranked(dense_memory(keys, memory.labels)))
  assert len(calls) == searches and sum(calls) == 24  # three blocks of 8 query rows


def test_an_empty_process_memory_votes_for_nothing():
  mesh = mesh_of(2, 2)
  table, _, _, _, _ = problem()
  empty = mesh_memory.MemorySource(np.zeros((0, 3), np.int32))
  memory = process_memory.embed_process_memory(
    mesh, ENCODE, table, [empty], SparseRows.from_lists([], 9), 8
  )
  emb = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P(sharding.ALL)))
  votes = memory.own_votes(emb, [2, 2, 2, 2], neighbour_vote.NeighbourVote(0.5, 3, 0.1, 4))
  assert votes.ids.shape == (8, 4) and (votes.ids == -1).all()


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_scann_vote_searches_the_process_memory_exactly():
  """The processes' shares are always searched exactly (a memory the vote searches with
  ScaNN is built whole on the host instead: ranking.vote_memory): `search=scann` with every
  row in the budget votes as the exact search does."""
  mesh, _, memory, _, rng = _memory((2, 2), seed=2)
  exact = neighbour_vote.NeighbourVote(0.5, 6, 0.1, 8, search="exact")
  scann = dataclasses.replace(exact, search="scann", search_rows=48)
  assert vote_memory.searches_with_scann(memory.num_rows, scann)
  emb = jax.device_put(rng.normal(size=(16, 8)), NamedSharding(mesh, P(sharding.ALL)))
  a, b = memory.own_votes(emb, [4] * 4, scann), memory.own_votes(emb, [4] * 4, exact)
  np.testing.assert_allclose(a.values, b.values, atol=1e-5)


@pytest.mark.parametrize(
  "layout,room", [("auto", None), ("auto", 1 << 40), ("auto", 864), ("auto", 863), ("hosts", None)]
)
def test_a_memory_without_room_on_the_devices_is_split_over_the_hosts(monkeypatch, layout, room):
  """Where a device's share would take more than half its free memory, or where
  scoring.neighbour_memory says hosts, each process keeps its rows on its host instead:
  the same keys either way."""
  mesh = mesh_of(2, 2)
  table, sources, labels, keys, _ = problem()
  monkeypatch.setattr(mesh_memory, "device_room", lambda mesh: room)
  params = {"encoder": table, "classifier": np.zeros((9, 8), np.float32)}
  config = ConfigDict({"eval": {"batch_size": 8}, "scoring": {"neighbour_memory": layout}})
  memory = ranking.vote_memory(mesh, ENCODE, params, sources, labels, config)
  # A device's share: 12 rows of 8 float32 and a row id, 432 bytes; half the room must
  # hold it, so 864 bytes is the least room that keeps the memory on the devices.
  on_devices = layout == "auto" and (room is None or room >= 864)
  want = mesh_memory.MeshMemory if on_devices else process_memory.ProcessMemory
  assert isinstance(memory, want)
  np.testing.assert_allclose(written_keys(memory), unit(keys), atol=1e-6)
  np.testing.assert_array_equal(memory.labels.to_dense(), labels.to_dense())


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_memory_searched_with_scann_is_whole_on_every_host():
  """A ScaNN index is built over every row: such a memory is gathered whole onto every
  process (vote_memory.Memory), not also split over the devices or the hosts."""
  mesh = mesh_of(2, 2)
  table, sources, labels, keys, _ = problem()
  params = {"encoder": table, "classifier": np.zeros((9, 8), np.float32)}
  scoring = {"neighbour_search": "scann", "neighbour_search_rows": 48}
  config = ConfigDict({"eval": {"batch_size": 8}, "scoring": scoring})
  memory = ranking.vote_memory(mesh, ENCODE, params, sources, labels, config)
  assert isinstance(memory, vote_memory.Memory)
  np.testing.assert_allclose(memory.keys, unit(keys), atol=1e-6)


def test_the_export_writes_the_process_memory_in_row_order(tmp_path):
  _, _, memory, keys, _ = _memory((2, 4))
  for which, rows in ((memory, 48), (memory.head(37), 37)):
    path = str(tmp_path / f"keys{rows}.npy")
    export.write_memory_keys(which, path)
    np.testing.assert_allclose(np.load(path), unit(keys[:rows]), atol=1e-6)
