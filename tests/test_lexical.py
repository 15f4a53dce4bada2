"""The lexical score terms (xc/lexical.py): the terms against a dense reference built with
scikit-learn directly, the folded score against the dense formula, the index's round trip
and the config's checks."""

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from astra_jax.ann import exact_topk, vote_memory
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.runtime.errors import InputError
from astra_jax.xc import lexical, neighbour_vote

WORDS = "red blue green python perl java lib dev tools data web kit".split()


def _texts(rng, n):
  return [" ".join(rng.choice(WORDS, rng.integers(1, 5))) for _ in range(n)]


def _problem(seed=0, n_train=60, n_query=23, L=17):
  rng = np.random.default_rng(seed)
  train, queries, label_texts = _texts(rng, n_train), _texts(rng, n_query), _texts(rng, L)
  rows = [sorted(set(rng.choice(L, rng.integers(1, 4)).tolist())) for _ in range(n_train)]
  return train, queries, label_texts, SparseRows.from_lists(rows, L), rng


def _reference_vectors(train, texts):
  """The peers' features by their definition, from scikit-learn directly."""
  blocks = []
  for analyzer, ngrams in (("word", (1, 2)), ("char_wb", (2, 4))):
    v = TfidfVectorizer(analyzer=analyzer, ngram_range=ngrams, sublinear_tf=True)
    v.fit(train)
    blocks.append(v.transform(texts).toarray())
  x = np.concatenate(blocks, axis=1)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _dense_terms(train, queries, label_texts, labels, k, tau):
  """t(x, l) and u(x, l) of the module docstring, one query at a time, in float64."""
  q, z, rows = (_reference_vectors(train, x) for x in (queries, label_texts, train))
  t = q @ z.T
  cos = q @ rows.T
  y = labels.to_dense()
  u = np.zeros_like(t)
  for i, row in enumerate(cos):
    nb = np.argsort(-row, kind="stable")[:k]
    w = np.exp((row[nb] - row[nb[0]]) / tau)
    u[i] = (w[:, None] * y[nb]).sum(0) / w.sum()
  return t, u


def _dense(votes: neighbour_vote.Votes, L: int) -> np.ndarray:
  out = np.zeros((len(votes.ids), L))
  for i, (ids, values) in enumerate(zip(votes.ids, votes.values)):
    np.add.at(out[i], ids[ids >= 0], values[ids >= 0])
  return out


def test_terms_equal_the_dense_reference():
  train, queries, label_texts, labels, _ = _problem()
  index = lexical.LexicalIndex.build(train, label_texts, labels)
  got = index.votes(queries, k=7, temperature=0.2, top=17)
  t, u = _dense_terms(train, queries, label_texts, labels, 7, 0.2)
  # Neighbours tied in cosine may be taken in another order; the vote is the same only
  # where the 7th and 8th are apart, which these rows are chosen to be.
  np.testing.assert_allclose(_dense(got.label_text, 17), t, atol=1e-5)
  rows = _reference_vectors(train, train)
  cos = _reference_vectors(train, queries) @ rows.T
  gap = np.sort(cos, axis=1)[:, ::-1]
  apart = gap[:, 6] - gap[:, 7] > 1e-4
  assert apart.sum() >= 10
  np.testing.assert_allclose(_dense(got.neighbours, 17)[apart], u[apart], atol=1e-5)


def test_each_term_keeps_its_top_labels():
  train, queries, label_texts, labels, _ = _problem(seed=1)
  index = lexical.LexicalIndex.build(train, label_texts, labels)
  t, _ = _dense_terms(train, queries, label_texts, labels, 5, 0.1)
  got = index.votes(queries, k=5, temperature=0.1, top=3).label_text
  assert got.ids.shape == (len(queries), 3)
  np.testing.assert_allclose(got.values, -np.sort(-t, axis=1)[:, :3], atol=1e-5)


@pytest.mark.parametrize("model_weight", [0.0, 0.6])
def test_folded_votes_rank_as_the_mixed_score(model_weight):
  """The kernels' (1 - a') p + a' v' of `fold` equals (1 - g - h)((1 - a) p + a v) + g t + h u
  for every label, so the exact top-k is the dense formula's."""
  train, queries, label_texts, labels, rng = _problem(seed=2)
  L, d = labels.num_cols, 6
  emb = rng.normal(size=(len(queries), d)).astype(np.float32)
  w = rng.normal(size=(L, d)).astype(np.float32)
  keys = rng.normal(size=(len(train), d)).astype(np.float32)
  weights = lexical.LexicalWeights(0.2, 0.3, k=5, temperature=0.1)
  model = neighbour_vote.NeighbourVote(model_weight, 5, 0.1, max_votes=L) if model_weight else None
  own = vote_memory.Memory.from_embeddings(keys, labels).votes(emb, model) if model else None
  terms = lexical.LexicalIndex.build(train, label_texts, labels).votes(queries, 5, 0.1, top=L)
  folded = lexical.fold(model, weights, neighbour_vote.NeighbourVote(0.0, 5, 0.1))
  votes = lexical.fold_votes(own, model_weight, terms, weights)
  tiles = {"query_block": 8, "label_block": 4}
  score = exact_topk.tile_score(None, folded)
  scores, ids = exact_topk.topk(emb, w, 5, score=score, vote=folded, votes=votes, **tiles)
  p = 1 / (1 + np.exp(-(emb.astype(np.float64) @ w.T)))
  v = _dense(own, L) if own is not None else 0.0
  t, u = _dense(terms.label_text, L), _dense(terms.neighbours, L)
  dense = 0.5 * ((1 - model_weight) * p + model_weight * v) + 0.2 * t + 0.3 * u
  np.testing.assert_allclose(scores, -np.sort(-dense, axis=1)[:, :5], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.take_along_axis(dense, ids, 1), scores, rtol=1e-5, atol=1e-6)


def test_no_lexical_weight_leaves_the_vote_alone():
  vote = neighbour_vote.NeighbourVote(0.4, 5, 0.1)
  assert lexical.fold(vote, lexical.LexicalWeights(), vote) is vote
  assert lexical.fold(None, lexical.LexicalWeights(), vote) is None


def test_a_saved_index_votes_as_the_one_built(tmp_path):
  train, queries, label_texts, labels, _ = _problem(seed=3)
  built = lexical.LexicalIndex.build(train, label_texts, labels)
  built.save(str(tmp_path / "lexical"))
  loaded = lexical.LexicalIndex.load(str(tmp_path / "lexical"), labels.num_cols)
  a, b = built.votes(queries, 5, 0.1), loaded.votes(queries, 5, 0.1)
  for x, y in ((a.label_text, b.label_text), (a.neighbours, b.neighbours)):
    np.testing.assert_array_equal(x.ids, y.ids)
    np.testing.assert_allclose(x.values, y.values, rtol=1e-6)


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"lexical_label_text_weight": 1.5}, "scoring.lexical_label_text_weight"),
    (
      {
        "lexical_label_text_weight": 0.6,
        "lexical_neighbour_weight": 0.4,
        "lexical_label_text_weight_choices": (),
        "lexical_neighbour_weight_choices": (),
      },
      "share",
    ),
    ({"lexical_neighbour_weight_choices": (0.2, -0.1)}, "scoring.lexical_neighbour_weight_choices"),
    (
      {"lexical_label_text_weight_choices": (0.6,), "lexical_neighbour_weight_choices": (0.5,)},
      "share",
    ),
  ],
)
def test_a_bad_lexical_setting_is_one_error(load_config, changes, message):
  c = load_config("experiments/xc_text.py", "ngram")
  c.data.dir = "/nonexistent"
  c.scoring.update(changes)
  from astra_jax.config import model as model_config

  with pytest.raises(InputError, match=message):
    model_config.validate(c)
