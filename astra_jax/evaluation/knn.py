"""k-nearest-neighbour label votes: the classic XC baseline and the encoder diagnostic.

A query's score for label l is the sum of its k nearest training points' similarities over
those that carry l; labels are ranked by it. Over TF-IDF vectors this is the baseline
(`astra_jax.baselines`); over the trained encoder's own normalised embeddings it shows what
the encoder knows, beside what its classifiers W make of the same embeddings
(`eval.knn_diagnostic`): a large gap says W, not E, is what is under-trained.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from astra_jax.data.sparse_rows import SparseRows


def vote(
  neighbors: np.ndarray, sims: np.ndarray, train_labels: SparseRows, k_out: int
) -> np.ndarray:
  """Ranked labels from similarity-weighted votes of neighbours.

  Args:
    neighbors: (n, k) training-row ids (-1: none).
    sims: (n, k) their similarities (the votes' weights).
    train_labels: the training rows' labels.
    k_out: labels to return per query.
  Returns:
    (n, k_out) int64 label ids, best first, -1 where fewer labels got votes. Ties go to the
    smaller label id.
  """
  n, k = neighbors.shape
  valid = neighbors >= 0
  q = np.repeat(np.arange(n), k)[valid.ravel()]
  nb = neighbors.ravel()[valid.ravel()]
  w = sims.ravel()[valid.ravel()].astype(np.float64)
  counts = train_labels.indptr[nb + 1] - train_labels.indptr[nb]
  starts = np.repeat(train_labels.indptr[nb], counts)
  offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
  labels = train_labels.indices[starts + offsets].astype(np.int64)
  qs = np.repeat(q, counts)
  # One score per (query, label) pair.
  keys, inverse = np.unique(qs * train_labels.num_cols + labels, return_inverse=True)
  scores = np.bincount(inverse, weights=np.repeat(w, counts), minlength=len(keys))
  kq, kl = keys // train_labels.num_cols, keys % train_labels.num_cols
  order = np.lexsort((kl, -scores, kq))  # by query, then score descending, then label
  kq, kl = kq[order], kl[order]
  first = np.searchsorted(kq, np.arange(n))
  rank = np.arange(len(kq)) - first[kq]
  out = np.full((n, k_out), -1, np.int64)
  keep = rank < k_out
  out[kq[keep], rank[keep]] = kl[keep]
  return out


def embedding_neighbors(
  queries: np.ndarray, keys: np.ndarray, k: int, block: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
  """The k most cosine-similar keys of each query (exact, in query blocks).

  Args:
    queries: (n, d) embeddings (normalised here).
    keys: (m, d) embeddings (normalised here).
    k: neighbours per query (at most m).
    block: queries per matmul.
  Returns:
    ((n, k) key ids, (n, k) cosine similarities), most similar first.
  """
  normalise = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  keys_n = normalise(jnp.asarray(keys, jnp.float32))
  k = min(k, keys.shape[0])
  top = jax.jit(lambda q: jax.lax.top_k(normalise(q) @ keys_n.T, k))
  ids, sims = [], []
  for start in range(0, len(queries), block):
    s, i = top(jnp.asarray(queries[start : start + block], jnp.float32))
    sims.append(np.asarray(s)), ids.append(np.asarray(i))
  if not ids:
    return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
  return np.concatenate(ids).astype(np.int64), np.concatenate(sims)
