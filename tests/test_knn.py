"""k-NN label votes (knn.py) against hand-computed votes and a brute-force search."""

import numpy as np

from astra_jax.ann import vote_memory
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import knn


def test_vote_sums_similarities_per_label_by_hand():
  # Training rows' labels: row 0 {1, 2}, row 1 {2}, row 2 {0, 3}.
  labels = SparseRows.from_lists([[1, 2], [2], [0, 3]], 5)
  neighbors = np.array([[0, 1, 2], [2, -1, -1]])
  sims = np.array([[0.9, 0.5, 0.8], [0.3, 0.0, 0.0]])
  # Query 0: label 2 = 0.9 + 0.5 = 1.4, label 1 = 0.9, labels 0 and 3 = 0.8 (tie: 0 first).
  # Query 1: labels 0 and 3 = 0.3, then nothing.
  out = knn.vote(neighbors, sims, labels, 4)
  np.testing.assert_array_equal(out, [[2, 1, 0, 3], [0, 3, -1, -1]])


def test_nearest_neighbours_match_brute_force_cosine():
  rng = np.random.default_rng(0)
  q, keys = rng.normal(size=(37, 8)), rng.normal(size=(50, 8))
  ids, sims = vote_memory.nearest(q, keys, 5, block=16)
  cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
    keys / np.linalg.norm(keys, axis=1, keepdims=True)
  ).T
  np.testing.assert_array_equal(ids, np.argsort(-cos, axis=1)[:, :5])
  np.testing.assert_allclose(sims, np.sort(cos, axis=1)[:, ::-1][:, :5], rtol=1e-5, atol=1e-6)
