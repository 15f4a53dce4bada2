"""Exact top-k prediction in bounded memory: scores are computed one (query block x label
block) tile at a time and merged into a running top-k, so memory is O(qb x (lb + k)),
never O(n x L)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.jit, static_argnames=("k", "label_block", "num_labels"))
def _topk_block(queries: jax.Array, w_blocks: jax.Array, k: int, label_block: int,
                num_labels: int):
  """queries (qb, d); w_blocks (nb, lb, d) -> (scores (qb, k), ids (qb, k))."""
  qb = queries.shape[0]
  init = (jnp.full((qb, k), -jnp.inf, jnp.float32), jnp.full((qb, k), -1, jnp.int32))

  def body(carry, xs):
    best_s, best_i = carry
    w, b = xs
    s = queries @ w.T.astype(jnp.float32)
    ids = b * label_block + jnp.arange(label_block, dtype=jnp.int32)
    s = jnp.where(ids[None, :] < num_labels, s, -jnp.inf)
    cand_s = jnp.concatenate([best_s, s], axis=1)
    cand_i = jnp.concatenate([best_i, jnp.broadcast_to(ids, s.shape)], axis=1)
    top_s, pos = jax.lax.top_k(cand_s, k)
    return (top_s, jnp.take_along_axis(cand_i, pos, axis=1)), None

  (s, i), _ = jax.lax.scan(body, init, (w_blocks, jnp.arange(w_blocks.shape[0], dtype=jnp.int32)))
  return s, i


def topk(embeddings: np.ndarray, classifier: jax.Array, k: int, query_block: int = 1024,
         label_block: int = 32768) -> tuple[np.ndarray, np.ndarray]:
  """Top-k labels by <w_l, e> for every row of `embeddings`: (scores, ids), best first."""
  L, d = classifier.shape
  k = min(k, L)
  label_block = min(label_block, L)
  nb = -(-L // label_block)
  w = jnp.pad(jnp.asarray(classifier, jnp.float32), ((0, nb * label_block - L), (0, 0)))
  w_blocks = w.reshape(nb, label_block, d)
  n = len(embeddings)
  scores = np.empty((n, k), np.float32)
  ids = np.empty((n, k), np.int32)
  for start in range(0, n, query_block):
    q = np.asarray(embeddings[start:start + query_block], np.float32)
    m = len(q)
    if m < query_block and n > query_block:  # keep one compiled shape
      q = np.pad(q, ((0, query_block - m), (0, 0)))
    s, i = _topk_block(jnp.asarray(q), w_blocks, k, label_block, L)
    scores[start:start + m], ids[start:start + m] = np.asarray(s)[:m], np.asarray(i)[:m]
  return scores, ids
