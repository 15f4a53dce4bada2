"""Exact top-k labels by <w_l, E(x)> in bounded memory.

Scores are computed one (query block x label block) tile at a time and merged into a running
top-k (`merge_topk`, which the sharded search on the mesh shares), so memory is
O(qb x (lb + k)), never O(n x L). Training's evaluation, serving's exact index and the
refresh's device backend (`DeviceIndex`) use it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from astra_jax.xc.neighbour_vote import NeighbourVote, Votes, add_votes


def dot_scores(queries: jax.Array, rows: jax.Array) -> jax.Array:
  """<w_l, e>: the classifiers' scores of a query block against a label block."""
  return queries @ rows.T.astype(jnp.float32)


def probability_scores(queries: jax.Array, rows: jax.Array) -> jax.Array:
  """sigmoid(<w_l, e>): the classifiers' probabilities, what the neighbour vote mixes with."""
  return jax.nn.sigmoid(dot_scores(queries, rows))


def tile_score(fusion=None, vote: NeighbourVote | None = None):
  """The score a kernel computes per tile: the label-text fusion's (a probability) when
  there is one, else <w_l, e>, or its sigmoid when the neighbour vote is mixed in."""
  if fusion is not None:
    return fusion
  return probability_scores if vote is not None else dot_scores


def merge_topk(
  best_s: jax.Array, best_i: jax.Array, s: jax.Array, ids: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
  """One tile's scores merged into a running top-k.

  Args:
    best_s, best_i: (q, k) the running top-k's scores and ids, best first.
    s: (q, t) the tile's scores (-inf where a row must not be returned).
    ids: (t,) the tile's label ids.
    k: labels kept.
  Returns:
    (scores, ids) (q, k) of the best k of both, best first.
  """
  # The tile's own top-k first, then a merge of two (q, k) lists: the tile's ids are
  # gathered for k columns only, never broadcast to (q, t), which XLA would otherwise
  # materialise (and constant-fold at compile time when the tile is the only one). Ties keep
  # the running list's entry, then the lower position, as one top-k over both would.
  tile_s, pos = jax.lax.top_k(s, min(k, s.shape[1]))
  cand_s = jnp.concatenate([best_s, tile_s], axis=1)
  cand_i = jnp.concatenate([best_i, jnp.take(ids, pos)], axis=1)
  top_s, pos = jax.lax.top_k(cand_s, k)
  return top_s, jnp.take_along_axis(cand_i, pos, axis=1)


@functools.partial(jax.jit, static_argnames=("k", "label_block", "num_labels", "score", "vote"))
def topk_block(
  queries: jax.Array,
  w_blocks: jax.Array,
  k: int,
  label_block: int,
  num_labels: int,
  score=dot_scores,
  vote: NeighbourVote | None = None,
  vote_ids: jax.Array | None = None,
  vote_values: jax.Array | None = None,
):
  """queries (qb, d); w_blocks (nb, lb, d) -> (scores (qb, k), ids (qb, k)); `score`
  (hashable: it is part of the compiled function) scores a query block against a label
  block; with `vote`, each block's scores are mixed with the queries' votes (qb, S)
  (neighbour_vote.add_votes; `score` must then give probabilities)."""
  qb = queries.shape[0]
  init = (jnp.full((qb, k), -jnp.inf, jnp.float32), jnp.full((qb, k), -1, jnp.int32))

  def body(carry, xs):
    best_s, best_i = carry
    w, b = xs
    s = score(queries, w)
    if vote is not None:
      s = add_votes(s, vote, vote_ids, vote_values, b * label_block)
    ids = b * label_block + jnp.arange(label_block, dtype=jnp.int32)
    s = jnp.where(ids[None, :] < num_labels, s, -jnp.inf)
    return merge_topk(best_s, best_i, s, ids, k), None

  (s, i), _ = jax.lax.scan(body, init, (w_blocks, jnp.arange(w_blocks.shape[0], dtype=jnp.int32)))
  return s, i


def label_blocks(classifier, label_block: int) -> jax.Array:
  """W (L, d) -> (nb, label_block, d), zero-padded (padded ids are masked in the kernel)."""
  L, d = classifier.shape
  nb = -(-L // label_block)
  w = jnp.pad(jnp.asarray(classifier, jnp.float32), ((0, nb * label_block - L), (0, 0)))
  return w.reshape(nb, label_block, d)


def topk(
  embeddings: np.ndarray,
  classifier: jax.Array,
  k: int,
  query_block: int = 1024,
  label_block: int = 32768,
  score=dot_scores,
  vote: NeighbourVote | None = None,
  votes: Votes | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Top-k labels for every row of `embeddings`: (scores, ids), best first.

  Args:
    embeddings: (n, d') query rows.
    classifier: (L, d') label rows.
    k: labels per query (at most L).
    query_block: queries per compiled call (the last block is padded to it).
    label_block: label rows scored at a time (bounds the (query_block, label_block) scores).
    score: (query block, label block) -> scores; <w_l, e> by default, the fused score of
      `score_fusion.LabelTextFusion` with its query and label rows (`tile_score`).
    vote: the neighbour vote mixed into the scores, with each row's `votes`
      (xc/neighbour_vote.py), or None.
    votes: the rows' votes (n, S) when `vote` is set.
  Returns:
    (scores (n, k) float32, ids (n, k) int32).
  """
  label_block = min(label_block, len(classifier))
  w_blocks = label_blocks(classifier, label_block)
  return _blocked_topk(
    embeddings, w_blocks, len(classifier), k, query_block, label_block, score, vote, votes
  )


def _blocked_topk(
  embeddings: np.ndarray,
  w_blocks: jax.Array,
  num_labels: int,
  k: int,
  query_block: int,
  label_block: int,
  score=dot_scores,
  vote: NeighbourVote | None = None,
  votes: Votes | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """`topk` over label rows already in blocks (`label_blocks`)."""
  k = min(k, num_labels)
  n = len(embeddings)
  scores = np.empty((n, k), np.float32)
  ids = np.empty((n, k), np.int32)
  for start in range(0, n, query_block):
    q = np.asarray(embeddings[start : start + query_block], np.float32)
    m = len(q)
    pad = query_block - m if m < query_block and n > query_block else 0  # one compiled shape
    q = np.pad(q, ((0, pad), (0, 0)))
    vi, vv = votes.padded(start, start + m, m + pad) if vote is not None else (None, None)
    s, i = topk_block(jnp.asarray(q), w_blocks, k, label_block, num_labels, score, vote, vi, vv)
    scores[start : start + m], ids[start : start + m] = np.asarray(s)[:m], np.asarray(i)[:m]
  return scores, ids


class DeviceIndex:
  """Exact maximum-inner-product search over label rows held on the default device (the
  refresh's `negatives.refresh_backend=device`): the blocked top-k, a query block at a time.
  The interface of ann/index.py's host indexes: `search(queries, k) -> (n, k) ids`."""

  exact = True  # recall 1.0 by construction: a refresh skips its recall check

  def __init__(self, rows: np.ndarray, query_block: int = 4096, label_block: int = 32768):
    self.num_rows = len(rows)
    self.query_block = query_block
    self.label_block = min(label_block, self.num_rows)
    self.w_blocks = label_blocks(rows, self.label_block)

  def search(self, queries: np.ndarray, k: int) -> np.ndarray:
    """(n, k) int32 ids of each query's top k rows, best first (ties: lower id)."""
    _, ids = _blocked_topk(
      queries, self.w_blocks, self.num_rows, k, self.query_block, self.label_block
    )
    return ids
