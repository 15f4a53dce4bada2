import jax.numpy as jnp
import numpy as np

from astra_jax import predict


def test_blocked_topk_equals_dense_ranking():
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(37, 8)).astype(np.float32)
  w = rng.normal(size=(1003, 8)).astype(np.float32)  # not a multiple of the label block
  scores, ids = predict.topk(emb, jnp.asarray(w), k=7, query_block=16, label_block=128)
  dense = emb @ w.T
  want = np.argsort(-dense, axis=1, kind="stable")[:, :7]
  np.testing.assert_array_equal(ids, want)
  np.testing.assert_allclose(scores, np.take_along_axis(dense, want, 1), rtol=1e-5)


def test_k_larger_than_labels():
  s, i = predict.topk(np.ones((2, 3), np.float32), jnp.eye(3, dtype=jnp.float32), k=10)
  assert i.shape == (2, 3) and sorted(i[0]) == [0, 1, 2]
