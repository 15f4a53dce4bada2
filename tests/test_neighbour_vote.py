"""The neighbour vote (xc/neighbour_vote.py): votes computed by hand and by a dense numpy
reference, and the exact top-k of the mixed score against the dense formula."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from astra_jax.ann import exact_topk, index as ann_index, memory_search, vote_memory
from astra_jax.config import base as config_base
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.runtime.errors import InputError
from astra_jax.serving import serve_index
from astra_jax.xc import neighbour_vote


def _sigmoid(x):
  return 0.5 * (1.0 + np.tanh(0.5 * x))


def test_label_votes_normalised_by_hand():
  # Rows' labels: row 0 {1, 2}, row 1 {2}, row 2 {0, 3}.
  labels = SparseRows.from_lists([[1, 2], [2], [0, 3]], 5)
  neighbours = np.array([[0, 1, 2], [2, -1, -1]])
  weights = np.array([[0.5, 0.25, 0.25], [2.0, 7.0, 7.0]])
  votes = neighbour_vote.label_votes(neighbours, weights, labels, 3, normalise=True)
  # Query 0: label 2 = (0.5 + 0.25) / 1, label 1 = 0.5, labels 0 and 3 = 0.25 (0 first).
  # Query 1: labels 0 and 3 = 2 / 2 (the missing neighbours weigh nothing).
  np.testing.assert_array_equal(votes.ids, [[2, 1, 0], [0, 3, -1]])
  np.testing.assert_allclose(votes.values, [[0.75, 0.5, 0.25], [1.0, 1.0, 0.0]])


def test_label_votes_read_stacked_rows_by_hand():
  """The same rows as the hand case above, split into two blocks that are never copied
  (the training rows, then the validation rows): the same votes."""
  first = SparseRows.from_lists([[1, 2]], 5)
  second = SparseRows.from_lists([[2], [0, 3]], 5)
  labels = StackedRows(first, second)
  neighbours = np.array([[0, 1, 2], [2, -1, -1]])
  weights = np.array([[0.5, 0.25, 0.25], [2.0, 7.0, 7.0]])
  votes = neighbour_vote.label_votes(neighbours, weights, labels, 3, normalise=True)
  np.testing.assert_array_equal(votes.ids, [[2, 1, 0], [0, 3, -1]])
  np.testing.assert_allclose(votes.values, [[0.75, 0.5, 0.25], [1.0, 1.0, 0.0]])


def _dense_votes(queries, keys, labels: SparseRows, k: int, tau: float) -> np.ndarray:
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  cos = unit(queries.astype(np.float64)) @ unit(keys.astype(np.float64)).T
  y = labels.to_dense()
  out = np.zeros((len(queries), labels.num_cols))
  for i, row in enumerate(cos):
    nb = np.argsort(-row, kind="stable")[:k]
    w = np.exp((row[nb] - row[nb[0]]) / tau)
    out[i] = (w[:, None] * y[nb]).sum(0) / w.sum()
  return out


def _problem(seed=0, n=23, m=40, L=17, d=6):
  rng = np.random.default_rng(seed)
  rows = [list(rng.choice(L, rng.integers(1, 4), replace=False)) for _ in range(m)]
  labels = SparseRows.from_lists(rows, L)
  return rng.normal(size=(n, d)), rng.normal(size=(m, d)), labels, rng


def test_memory_votes_equal_the_dense_reference():
  queries, keys, labels, _ = _problem()
  vote = neighbour_vote.NeighbourVote(0.5, neighbours=7, temperature=0.2, max_votes=17)
  memory = vote_memory.Memory.from_embeddings(keys, labels)
  votes = memory.votes(queries, vote, block=8)
  spread = np.zeros((len(queries), labels.num_cols))
  for i in range(len(queries)):
    keep = votes.ids[i] >= 0
    spread[i, votes.ids[i][keep]] = votes.values[i][keep]
  np.testing.assert_allclose(spread, _dense_votes(queries, keys, labels, 7, 0.2), atol=1e-5)
  # Most voted first, and the votes of a query sum to its neighbours' mean label count.
  assert (np.diff(votes.values, axis=1) <= 1e-7).all()
  counts = labels.row_lengths()
  mean_labels = votes.values.sum(1)
  assert ((mean_labels >= counts.min() - 1e-5) & (mean_labels <= counts.max() + 1e-5)).all()


@pytest.mark.parametrize("block, tile_floats", [(1024, 1 << 26), (8, 8 * 9), (5, 1)])
def test_nearest_in_tiles_equals_a_brute_force_sort(block, tile_floats):
  """One tile, key blocks of 9 rows (the last shorter), and key blocks of k rows: the
  neighbours of sorting every cosine. Duplicated keys tie; in one tile the lower id comes
  first, across tiles their float32 cosines may differ in the last bit, so there the
  check is that the k best cosines are found, each at an id that has it."""
  rng = np.random.default_rng(3)
  keys = rng.normal(size=(103, 5)).astype(np.float32)
  keys[[40, 77, 101]] = keys[12]  # one key four times: a tie for any query
  queries = rng.normal(size=(23, 5)).astype(np.float32)
  queries[4] = keys[12]
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  cos = unit(queries.astype(np.float64)) @ unit(keys.astype(np.float64)).T
  expect = np.lexsort((np.broadcast_to(np.arange(103), cos.shape), -np.round(cos, 5)), axis=1)
  expect = expect[:, :6]
  for where in (keys, jnp.asarray(keys)):  # on the host, streamed; on the device
    ids, sims = vote_memory.nearest(queries, where, 6, block, tile_floats)
    np.testing.assert_allclose(sims, np.take_along_axis(cos, expect, 1), atol=1e-5)
    np.testing.assert_allclose(sims, np.take_along_axis(cos, ids, 1), atol=1e-5)
    assert all(len(set(row)) == 6 for row in ids)
    if tile_floats >= len(keys) * block:
      np.testing.assert_array_equal(ids, expect)
    assert sorted(ids[4, :4]) == [12, 40, 77, 101]


def test_a_memory_too_large_for_the_device_is_streamed_to_the_same_votes(monkeypatch):
  queries, keys, labels, _ = _problem()
  vote = neighbour_vote.NeighbourVote(0.5, neighbours=7, temperature=0.2, max_votes=17)
  resident = vote_memory.Memory.from_embeddings(keys, labels)
  assert not isinstance(resident.search_keys, np.ndarray)  # placed on the device
  monkeypatch.setattr(vote_memory, "RESIDENT_KEY_BYTES", 0)
  streamed = vote_memory.Memory.from_embeddings(keys, labels)
  assert isinstance(streamed.search_keys, np.ndarray)
  a, b = resident.votes(queries, vote, block=8), streamed.votes(queries, vote, block=8)
  np.testing.assert_array_equal(a.ids, b.ids)
  np.testing.assert_allclose(a.values, b.values, rtol=1e-6)


def test_max_votes_keeps_the_most_voted():
  queries, keys, labels, _ = _problem(seed=1)
  memory = vote_memory.Memory.from_embeddings(keys, labels)
  every = memory.votes(queries, neighbour_vote.NeighbourVote(0.5, 9, 0.1, max_votes=17))
  top3 = memory.votes(queries, neighbour_vote.NeighbourVote(0.5, 9, 0.1, max_votes=3))
  np.testing.assert_array_equal(top3.ids, every.ids[:, :3])
  np.testing.assert_allclose(top3.values, every.values[:, :3])


def test_exact_topk_with_votes_equals_the_dense_mixed_score():
  queries, keys, labels, rng = _problem(seed=2, n=37, L=53)
  w = rng.normal(size=(53, 6)).astype(np.float32)
  vote = neighbour_vote.NeighbourVote(0.7, neighbours=5, temperature=0.1, max_votes=53)
  votes = vote_memory.Memory.from_embeddings(keys, labels).votes(queries, vote)
  scores, ids = exact_topk.topk(
    queries,
    w,
    6,
    query_block=16,
    label_block=8,
    score=exact_topk.tile_score(None, vote),
    vote=vote,
    votes=votes,
  )
  dense = 0.3 * _sigmoid(queries @ w.T) + 0.7 * _dense_votes(queries, keys, labels, 5, 0.1)
  want = np.argsort(-dense, axis=1, kind="stable")[:, :6]
  np.testing.assert_array_equal(ids, want)
  np.testing.assert_allclose(scores, np.take_along_axis(dense, want, 1), rtol=1e-5, atol=1e-6)


def test_a_memory_head_votes_as_a_memory_of_those_rows():
  queries, keys, labels, _ = _problem()
  head = vote_memory.Memory.from_embeddings(keys, labels).head(10)
  alone = vote_memory.Memory.from_embeddings(keys[:10], labels.row_range(0, 10))
  assert head.num_rows == 10
  vote = neighbour_vote.NeighbourVote(0.5, 4, 0.1)
  a, b = head.votes(queries, vote), alone.votes(queries, vote)
  np.testing.assert_array_equal(a.ids, b.ids)
  np.testing.assert_allclose(a.values, b.values)


def test_which_memories_scann_searches():
  searches = memory_search.SEARCHES
  # auto: on CPUs ScaNN past four times the budget; on accelerators exact, whatever the rows.
  assert not searches["auto"].uses_scann(200_000, 50_000, accelerator=False)
  assert searches["auto"].uses_scann(200_001, 50_000, accelerator=False)
  assert not searches["auto"].uses_scann(10**9, 50_000, accelerator=True)
  for accelerator in (False, True):
    assert searches["scann"].uses_scann(1, 50_000, accelerator)
    assert not searches["exact"].uses_scann(10**9, 1, accelerator)
  # The vote's default (xc may not import ann) is the search's.
  assert neighbour_vote.SEARCH_ROWS == memory_search.SCANN_ROWS_PER_QUERY


def _clustered_memory(rows=6000, d=16, centres=60, seed=0):
  """Unit rows around `centres` directions, each row one label (its cluster's, or a rarer
  one), as real embeddings cluster by topic."""
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(centres, d))
  which = rng.integers(0, centres, rows)
  keys = means[which] + 0.35 * rng.normal(size=(rows, d))
  label = np.where(rng.random(rows) < 0.8, which, centres + rng.integers(0, 200, rows))
  labels = SparseRows.from_lists([[int(x)] for x in label], centres + 200)
  queries = means[rng.integers(0, centres, 300)] + 0.35 * rng.normal(size=(300, d))
  return vote_memory.Memory.from_embeddings(keys, labels), queries


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_scann_search_of_every_row_finds_the_exact_neighbours():
  """With every row in a query's budget, every leaf is opened and every row re-ranked
  exactly: ScaNN's neighbours and votes are the exact search's."""
  memory, queries = _clustered_memory()
  exact = neighbour_vote.NeighbourVote(0.5, 20, 0.1, search="exact")
  every_row = dataclasses.replace(exact, search="scann", search_rows=len(memory.keys))
  (ids, sims), (want_ids, want_sims) = (
    memory.nearest(queries, every_row),
    memory.nearest(queries, exact),
  )
  np.testing.assert_allclose(sims, want_sims, atol=1e-5)
  assert np.mean(ids == want_ids) > 0.999  # equal up to the order of exact ties
  a, b = memory.votes(queries, every_row), memory.votes(queries, exact)
  np.testing.assert_allclose(a.values, b.values, atol=1e-5)
  none, _ = memory.nearest(queries[:0], every_row)
  assert none.shape == (0, 20)


def test_without_scann_a_scann_search_is_exact(monkeypatch):
  monkeypatch.setattr(ann_index, "scann_available", lambda: False)
  memory, queries = _clustered_memory(rows=500)
  exact = neighbour_vote.NeighbourVote(0.5, 20, 0.1, search="exact")
  scann = dataclasses.replace(exact, search="scann", search_rows=10)
  np.testing.assert_array_equal(
    memory.nearest(queries, scann)[0], memory.nearest(queries, exact)[0]
  )


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_scann_search_of_a_tenth_of_the_rows_keeps_the_vote():
  """A budget of a tenth of the rows finds most of the exact neighbours, and the most
  voted label is the exact vote's for nearly every query."""
  memory, queries = _clustered_memory()
  exact = neighbour_vote.NeighbourVote(0.5, 20, 0.1, search="exact")
  tenth = dataclasses.replace(exact, search="scann", search_rows=len(memory.keys) // 10)
  ids, _ = memory.nearest(queries, tenth)
  want, _ = memory.nearest(queries, exact)
  recall = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, want)])
  assert recall > 0.9, recall
  top = memory.votes(queries, tenth).ids[:, 0]
  assert np.mean(top == memory.votes(queries, exact).ids[:, 0]) > 0.95


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"neighbour_weight_choices": (0.2, 1.5)}, r"neighbour_weight_choices: every candidate"),
    ({"label_text_weight_choices": (-0.1,)}, r"label_text_weight_choices: every candidate"),
    ({"neighbour_weight": 2.0}, r"scoring\.neighbour_weight: must be in \[0, 1\], got 2\.0"),
    ({"neighbours": 0}, r"scoring\.neighbours: must be >= 1, got 0"),
    ({"neighbour_temperature": 0.0}, r"neighbour_temperature: must be > 0, got 0\.0"),
    ({"neighbour_search": "faiss"}, r"neighbour_search: use one of auto, exact, scann"),
    ({"neighbour_search_rows": 0}, r"neighbour_search_rows: must be >= 1, got 0"),
  ],
)
def test_a_bad_vote_setting_is_one_error(load_config, changes, message):
  c = load_config("experiments/xc_text.py", "ngram")
  c.data.dir = "unused"
  for key, value in changes.items():
    c.scoring[key] = value
  with pytest.raises(InputError, match=message):
    config_base.validate(c)


def test_choosing_the_vote_needs_a_validation_split(load_config):
  c = load_config("experiments/xc_text.py", "ngram")
  c.data.dir, c.data.validation_fraction = "unused", 0.0
  c.scoring.label_text_weight_choices = c.scoring.label_text_shape_choices = ()
  with pytest.raises(InputError, match="neighbour_weight_choices: chooses on the validation"):
    config_base.validate(c)


@pytest.mark.skipif(not ann_index.scann_available(), reason="ScaNN is not installed")
def test_a_memory_index_is_kept_in_the_model_directory(tmp_path, monkeypatch):
  """With a MemoryIndexStore, the first search builds the memory's ScaNN index and saves it;
  a new process's memory (a new Memory) loads it instead of building, with the same
  neighbours; another model id builds anew."""
  memory, queries = _clustered_memory(rows=3000)
  vote = neighbour_vote.NeighbourVote(0.5, 10, 0.1, search="scann", search_rows=600)
  built = []
  real = vote_memory.memory_search.scann_index
  monkeypatch.setattr(
    vote_memory.memory_search, "scann_index", lambda *a, **k: built.append(1) or real(*a, **k)
  )

  def search(model_id):
    store = serve_index.MemoryIndexStore(str(tmp_path), model_id)
    return memory.with_index_store(store).nearest(queries, vote)

  first = search("m1")
  assert len(built) == 1 and (tmp_path / serve_index.MEMORY_INDEX_DIR).is_dir()
  again = search("m1")
  assert len(built) == 1  # loaded
  np.testing.assert_array_equal(again[0], first[0])
  np.testing.assert_allclose(again[1], first[1])
  search("m2")
  assert len(built) == 2
