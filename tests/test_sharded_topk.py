"""The sharded exact top-k (sharded_topk.py) against a dense numpy ranking, and its compiled
program against the promise that W is never gathered."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.ann import vote_memory
from astra_jax.ann.sharded_topk import ShardedSearch
from astra_jax.ann.vote_cache import VoteCache
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.parallel import sharding
from astra_jax.xc import neighbour_vote, score_fusion


def _mesh(data: int, model: int) -> jax.sharding.Mesh:
  return sharding.make_mesh(data, model, jax.devices()[: data * model])


def _encode(params, ids):
  """A stand-in encoder: row i of the 'embedding table' params, summed over the tokens."""
  return params[ids].sum(axis=1)


ENCODE = jax.jit(_encode)


def _problem(num_labels: int, rows: int, d: int = 8, n: int = 37, seed: int = 0):
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(64, d)).astype(np.float32)
  tokens = rng.integers(0, 64, size=(n, 3)).astype(np.int32)
  w = np.zeros((rows, d), np.float32)
  w[:num_labels] = rng.normal(size=(num_labels, d))
  return table, tokens, w


def _dense_topk(queries: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
  return np.argsort(
    -(queries.astype(np.float64) @ rows.T.astype(np.float64)), axis=1, kind="stable"
  )[:, :k]


@pytest.mark.parametrize(
  "shape,label_block", [((1, 1), 64), ((1, 2), 7), ((2, 4), 5), ((4, 2), 1000)]
)
def test_sharded_topk_equals_the_dense_ranking(shape, label_block):
  mesh = _mesh(*shape)
  num_labels = 101  # not a multiple of the model axis: W carries padded zero rows
  rows = sharding.padded_rows(num_labels, mesh)
  table, tokens, w = _problem(num_labels, rows)
  search = ShardedSearch(mesh, num_labels, label_block)
  w_mesh = jax.device_put(w, NamedSharding(mesh, P("model")))
  k = 6
  got = search.search_rows(
    ENCODE, table, tokens, 3, 37, k, search.label_parts(w_mesh, None), batch_size=16
  )
  first = [a for a, _ in got]
  assert first == sorted(first)
  ids = np.concatenate([x for _, x in got])
  assert len(ids) == 34 and first[0] == 3
  want = _dense_topk(table[tokens[3:]].sum(1), w[:num_labels], k)
  np.testing.assert_array_equal(ids, want)


def test_fused_sharded_topk_equals_the_dense_fused_ranking():
  mesh = _mesh(2, 2)
  num_labels = 30
  table, tokens, w = _problem(num_labels, 30, n=20)
  texts = np.random.default_rng(1).normal(size=(num_labels, 8)).astype(np.float32)
  fusion = score_fusion.LabelTextFusion(0.4, 5.0, 8)
  search = ShardedSearch(mesh, num_labels, 4, fusion)
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), texts)
  got = np.concatenate(
    [x for _, x in search.search_rows(ENCODE, table, tokens, 0, 20, 5, parts, batch_size=8)]
  )
  emb = table[tokens].sum(1)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sig = lambda x: 1 / (1 + np.exp(-x))
  scores = 0.6 * sig(emb @ w.T) + 0.4 * sig(5.0 * unit(emb) @ unit(texts).T)
  np.testing.assert_array_equal(got, np.argsort(-scores, axis=1, kind="stable")[:, :5])


@pytest.mark.parametrize("fused", [False, True])
def test_voted_sharded_topk_equals_the_dense_mixed_ranking(fused):
  """(1 - a) p + a v over the shards, p = sigmoid(<w, e>) or the fused score, v the votes
  spread densely: the same ranking and scores as numpy's."""
  mesh = _mesh(2, 2)
  num_labels, n, S = 30, 20, 4
  table, tokens, w = _problem(num_labels, 30, n=n)
  rng = np.random.default_rng(2)
  texts = rng.normal(size=(num_labels, 8)).astype(np.float32)
  vote_ids = np.stack([rng.choice(num_labels, S, replace=False) for _ in range(n)]).astype(np.int32)
  vote_ids[::3, -1] = -1  # fewer voted labels than S
  values = np.where(vote_ids >= 0, rng.uniform(0.1, 1.0, (n, S)), 0.0).astype(np.float32)
  vote = neighbour_vote.NeighbourVote(0.6, 10, 0.1, S)
  fusion = score_fusion.LabelTextFusion(0.4, 5.0, 8) if fused else None
  search = ShardedSearch(mesh, num_labels, 4, fusion, vote)
  parts = search.label_parts(
    jax.device_put(w, NamedSharding(mesh, P("model"))), texts if fused else None
  )
  lo = 3  # the votes are of rows [lo, n)
  votes = neighbour_vote.Votes(vote_ids[lo:], values[lo:])
  got = np.concatenate(
    [x for _, x in search.search_rows(ENCODE, table, tokens, lo, n, 5, parts, 8, votes)]
  )
  emb = table[tokens[lo:]].sum(1)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sig = lambda x: 1 / (1 + np.exp(-x))
  p = sig(emb @ w.T)
  if fused:
    p = 0.6 * p + 0.4 * sig(5.0 * unit(emb) @ unit(texts).T)
  dense_votes = np.zeros((n - lo, num_labels))
  for r in range(n - lo):
    for j in range(S):
      if vote_ids[lo + r, j] >= 0:
        dense_votes[r, vote_ids[lo + r, j]] += values[lo + r, j]
  scores = 0.4 * p + 0.6 * dense_votes
  np.testing.assert_array_equal(got, np.argsort(-scores, axis=1, kind="stable")[:, :5])


def _read_many_weights(shape, label_block, weights, text_shapes=False):
  """One search_rows pass of a fused, voted search at `weights`, and numpy's dense score
  at a row (beta, a, s, theta): (1 - a)((1 - beta) p + beta sigmoid(s (cos - theta))) +
  a v, W's own logits where beta = a = 0. Returns (the (n, G, 5) top-k, dense)."""
  mesh = _mesh(*shape)
  num_labels, n, S = 30, 20, 4
  table, tokens, w = _problem(num_labels, sharding.padded_rows(num_labels, mesh), n=n)
  rng = np.random.default_rng(5)
  texts = rng.normal(size=(num_labels, 8)).astype(np.float32)
  vote_ids = np.stack([rng.choice(num_labels, S, replace=False) for _ in range(n)]).astype(np.int32)
  values = rng.uniform(0.1, 1.0, (n, S)).astype(np.float32)
  # The search's own weights (and shape) are placeholders: the rows of `weights` replace them.
  search = ShardedSearch(
    mesh,
    num_labels,
    label_block,
    score_fusion.LabelTextFusion(0.5, 5.0, 8),
    neighbour_vote.NeighbourVote(0.5, 10, 0.1, S),
    text_shapes=text_shapes,
  )
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), texts)
  found = search.search_rows(
    ENCODE,
    table,
    tokens,
    0,
    n,
    5,
    parts,
    8,
    neighbour_vote.Votes(vote_ids, values),
    weights=weights,
  )
  got = np.concatenate([x for _, x in found])
  assert got.shape == (n, len(weights), 5)
  emb = table[tokens].sum(1).astype(np.float64)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  logits = emb @ w[:num_labels].T
  p = 1 / (1 + np.exp(-logits))
  cos = unit(emb) @ unit(texts.astype(np.float64)).T
  v = np.zeros((n, num_labels))
  np.add.at(v, (np.repeat(np.arange(n), S), vote_ids.ravel()), values.ravel())

  def dense(beta, a, scale=5.0, shift=0.0):
    t = 1 / (1 + np.exp(-scale * (cos - shift)))
    return logits if beta == a == 0 else (1 - a) * ((1 - beta) * p + beta * t) + a * v

  return got, dense


@pytest.mark.parametrize("shape,label_block", [((2, 2), 4), ((1, 4), 64), ((4, 1), 7)])
def test_one_pass_at_many_weights_equals_each_dense_ranking(shape, label_block):
  """search_rows with (G, 2) weights ranks every row by each (beta, a) from one pass over
  W: the dense (1 - a)((1 - beta) p + beta t) + a v of numpy for each, W's own logits where
  both are 0."""
  weights = np.array([[0, 0], [0.3, 0], [0, 0.7], [0.3, 0.5], [1, 0], [0.9, 0.9]], np.float32)
  got, dense = _read_many_weights(shape, label_block, weights)
  for g, (beta, a) in enumerate(weights):
    want = np.argsort(-dense(beta, a), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(got[:, g], want, err_msg=f"beta {beta}, a {a}")


@pytest.mark.parametrize("shape,label_block", [((2, 2), 4), ((1, 4), 64)])
def test_one_pass_at_many_text_shapes_equals_each_dense_ranking(shape, label_block):
  """With text_shapes each weight row ends in the label-text term's scale and shift: one
  pass ranks by numpy's dense score at each row's own shape, whatever the search's own
  fusion says."""
  weights = np.array(
    [[0.3, 0, 5, 0], [0.3, 0, 20, 0.5], [0.7, 0, 10, -0.5], [0.5, 0.4, 20, 0.5], [0, 0, 20, 0.5]],
    np.float32,
  )
  got, dense = _read_many_weights(shape, label_block, weights, text_shapes=True)
  for g, row in enumerate(weights):
    want = np.argsort(-dense(*row), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(got[:, g], want, err_msg=f"row {g}")
  # The shapes differ in what they rank, so the rows are not read at the fusion's shape.
  assert not np.array_equal(got[:, 0], got[:, 1])


def test_text_shapes_need_their_columns_and_the_fusion():
  mesh = _mesh(1, 2)
  fusion = score_fusion.LabelTextFusion(0.5, 5.0, 8)
  with pytest.raises(ValueError, match="takes 4"):
    ShardedSearch(mesh, 10, 4, fusion, text_shapes=True).kernel(5, np.array([[0.3, 0.0]]))
  with pytest.raises(ValueError, match="text_shapes needs"):
    ShardedSearch(mesh, 10, 4, text_shapes=True).kernel(5)


@pytest.mark.parametrize("first_part", [3, 0])
def test_vote_parts_are_scaled_by_their_own_weights(first_part):
  """With vote_parts, each weight row's columns after (beta, a) scale the votes' parts:
  (1 - a) p + a (c_0 V_0 + c_1 V_1 + c_2 V_2), V_j the votes of part j spread densely; the
  first part (the rest of the columns: a memory's votes) may be empty."""
  mesh = _mesh(2, 2)
  num_labels, n, sizes = 30, 20, (first_part, 2, 2)
  table, tokens, w = _problem(num_labels, 30, n=n)
  rng = np.random.default_rng(6)
  S = sum(sizes)
  ids = np.stack([rng.choice(num_labels, S, replace=True) for _ in range(n)]).astype(np.int32)
  ids[::4, -1] = -1
  values = np.where(ids >= 0, rng.uniform(0.1, 1.0, (n, S)), 0.0).astype(np.float32)
  search = ShardedSearch(
    mesh, num_labels, 7, None, neighbour_vote.NeighbourVote(0.5, 10, 0.1, S), vote_parts=(2, 2)
  )
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), None)
  weights = np.array(
    [[0, 0.6, 1, 1, 1], [0, 0.6, 0.5, 2.0, 0], [0, 0.3, 0, 0, 1.5], [0, 0, 1, 1, 1]], np.float32
  )
  found = search.search_rows(
    ENCODE, table, tokens, 0, n, 5, parts, 8, neighbour_vote.Votes(ids, values), weights=weights
  )
  got = np.concatenate([x for _, x in found])
  logits = table[tokens].sum(1).astype(np.float64) @ w.T
  p = 1 / (1 + np.exp(-logits))
  part = np.repeat(np.arange(3), sizes)
  for g, (_, a, *c) in enumerate(weights):
    v = np.zeros((n, num_labels))
    for r in range(n):
      for j in range(S):
        if ids[r, j] >= 0:
          v[r, ids[r, j]] += c[part[j]] * values[r, j]
    dense = logits if a == 0 else (1 - a) * p + a * v
    want = np.argsort(-dense, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(got[:, g], want, err_msg=f"row {g}")
  with pytest.raises(ValueError, match="columns"):
    search.kernel(5, np.zeros((1, 4), np.float32))


def test_both_weights_zero_rank_by_the_logits_where_the_sigmoid_saturates():
  """Logits 42 and 30 both have sigmoid 1.0 in float32: at weights (0, 0) the search ranks
  them apart, as a search without the terms does, not by label id."""
  mesh = _mesh(1, 2)
  table = np.zeros((4, 2), np.float32)
  table[0, 0] = 1.0
  tokens = np.zeros((2, 3), np.int32)  # E(x) = (3, 0) for both rows
  w = np.array([[10.0, 0], [14.0, 0], [-1.0, 0], [0.0, 0]], np.float32)
  search = ShardedSearch(
    mesh,
    4,
    2,
    score_fusion.LabelTextFusion(0.5, 5.0, 2),
    neighbour_vote.NeighbourVote(0.5, 5, 0.1, 1),
  )
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), np.eye(4, 2))
  votes = neighbour_vote.Votes(np.full((2, 1), -1, np.int32), np.zeros((2, 1), np.float32))
  weights = np.array([[0, 0], [0, 0.5]], np.float32)
  got = np.concatenate(
    [
      x
      for _, x in search.search_rows(
        ENCODE, table, tokens, 0, 2, 2, parts, 2, votes, weights=weights
      )
    ]
  )
  plain = np.concatenate(
    [
      x
      for _, x in ShardedSearch(mesh, 4, 2).search_rows(
        ENCODE, table, tokens, 0, 2, 2, parts[:1], 2
      )
    ]
  )
  np.testing.assert_array_equal(plain, [[1, 0], [1, 0]])
  np.testing.assert_array_equal(got[:, 0], plain)
  np.testing.assert_array_equal(got[:, 1], [[0, 1], [0, 1]])  # 0.5 x 1.0 each: the lower id


def test_a_weight_for_a_term_the_search_lacks_is_refused():
  mesh = _mesh(1, 2)
  search = ShardedSearch(mesh, 10, 4)
  with pytest.raises(ValueError, match="label-text fusion"):
    search.kernel(5, np.array([[0.3, 0.0]]))
  with pytest.raises(ValueError, match="neighbour vote"):
    search.kernel(5, np.array([[0.0, 0.3]]))


@pytest.mark.parametrize("shape,lo,batch_size", [((2, 2), 3, 8), ((1, 4), 0, 12), ((4, 1), 5, 4)])
def test_votes_from_a_memory_equal_the_votes_taken_beforehand(shape, lo, batch_size):
  """With a memory, the search votes for each row from the embedding it ranks: the same
  ranking as the votes taken by Memory.votes over the dense embeddings and handed in."""
  mesh = _mesh(*shape)
  num_labels, n = 30, 23
  table, tokens, w = _problem(num_labels, sharding.padded_rows(num_labels, mesh), n=n)
  rng = np.random.default_rng(3)
  memory = vote_memory.Memory.from_embeddings(
    rng.normal(size=(40, 8)),
    SparseRows.from_lists(
      [list(rng.choice(num_labels, 3, replace=False)) for _ in range(40)], num_labels
    ),
  )
  vote = neighbour_vote.NeighbourVote(0.7, 5, 0.1, 8)
  search = ShardedSearch(mesh, num_labels, 7, None, vote)
  parts = search.label_parts(jax.device_put(w, NamedSharding(mesh, P("model"))), None)
  taken = memory.votes(table[tokens[lo:]].sum(1), vote)

  def ranked(**kw):
    return np.concatenate(
      [x for _, x in search.search_rows(ENCODE, table, tokens, lo, n, 5, parts, batch_size, **kw)]
    )

  np.testing.assert_array_equal(ranked(memory=memory), ranked(votes=taken))
  with pytest.raises(ValueError, match="votes or a memory"):
    ranked()


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_vote_cache_searches_the_memory_once_for_every_weight(monkeypatch, tmp_path, on_disk):
  """Two searches of the same rows with weights 0.7 and 0.2 through one VoteCache, in RAM
  or in a directory: the memory is searched by the first only, and each ranking is the
  uncached one's; clearing it removes its files."""
  mesh = _mesh(2, 2)
  num_labels, n = 30, 23
  table, tokens, w = _problem(num_labels, num_labels, n=n)
  rng = np.random.default_rng(4)
  memory = vote_memory.Memory.from_embeddings(
    rng.normal(size=(40, 8)),
    SparseRows.from_lists(
      [list(rng.choice(num_labels, 3, replace=False)) for _ in range(40)], num_labels
    ),
  )
  w_mesh = jax.device_put(w, NamedSharding(mesh, P("model")))
  calls = []
  searched = vote_memory.Memory.votes
  monkeypatch.setattr(
    vote_memory.Memory, "votes", lambda self, *a, **k: calls.append(1) or searched(self, *a, **k)
  )

  def ranked(weight, cache):
    search = ShardedSearch(
      mesh, num_labels, 7, None, neighbour_vote.NeighbourVote(weight, 5, 0.1, 8)
    )
    parts = search.label_parts(w_mesh, None)
    found = search.search_rows(ENCODE, table, tokens, 2, n, 5, parts, 8, None, memory, cache)
    return np.concatenate([x for _, x in found])

  cache = VoteCache(str(tmp_path / "votes") if on_disk else None)
  for weight in (0.7, 0.2):
    uncached = ranked(weight, None)
    before = len(calls)
    np.testing.assert_array_equal(ranked(weight, cache), uncached)
    assert len(calls) == before + (3 if weight == 0.7 else 0)  # 3 blocks of 8 rows: 2 to 23
  kept = list(cache.blocks.values())
  assert len(kept) == 3 and all(isinstance(v.ids, np.memmap) == on_disk for v in kept)
  cache.clear()
  assert not cache.blocks and not (tmp_path / "votes").exists()


def _all_gather_sizes(hlo: str) -> list[int]:
  """Element counts of every all-gather's result in a compiled HLO module."""
  sizes = []
  for line in hlo.splitlines():
    if re.search(r"\ball-gather(-start)?\(", line):
      for dims in re.findall(r"[fsu]\d+\[([\d,]*)\]", line.split("=", 1)[1].split("all-gather")[0]):
        sizes.append(int(np.prod([int(x) for x in dims.split(",") if x] or [1])))
  return sizes


@pytest.mark.parametrize("shape", [(1, 2), (2, 4)])
def test_compiled_search_gathers_candidates_and_queries_never_w(shape):
  mesh = _mesh(*shape)
  num_labels, d, q, k = 4096, 16, 16, 5
  shard_rows = num_labels // shape[1]
  search = ShardedSearch(mesh, num_labels, 256)
  kernel = search.kernel(k)
  emb = jax.device_put(jnp.zeros((q, d)), NamedSharding(mesh, P(sharding.ALL)))
  w = jax.device_put(jnp.zeros((num_labels, d)), NamedSharding(mesh, P("model")))
  # kernel binds the score's weights (its first argument) to the compiled function.
  hlo = kernel.func.lower(*kernel.args, emb, None, w).compile().as_text()
  sizes = _all_gather_sizes(hlo)
  assert sizes, "the candidates must cross the model axis"
  # Only queries (q x d) and candidates (q x M k) are gathered; a gather of W or a shard
  # of it would hold at least shard_rows x d numbers.
  assert max(sizes) <= q * max(d, shape[1] * k) < shard_rows * d, sizes
