"""The paper's BCE loss: the unbiased sampled estimator (eq. 2) and the full-L reference (eq. 1).

For one query with positives P, hard negatives H and k_r uniform draws r_1..r_k from [L]:

  loss = (|P| / |K|) sum_{l in K} softplus(-f_l)          (positives)
       + sum_{l in H \\ P} softplus(f_l)                  (hard negatives)
       + (L / k_r) * sum_j [r_j not in P u H] softplus(f_{r_j})   (random negatives)

K = P when |P| <= k_p, else a uniform random k_p-subset of P (sampler.py): each positive
is in K with probability |K| / |P|, so E[positive term] = sum_{l in P} softplus(-f_l).
softplus(f) = f + log(1 + exp(-f)) is the paper's negative term. The draws are uniform over
all of [L] with replacement and the indicator masks out positives and hard negatives, so
E[random term] = sum_{l not in P u H} softplus(f_l) exactly: the estimator is unbiased for
the full BCE (Lemma 1). Each query draws its own k_r, as in the paper's Algorithm 1
(negatives.random_draws=per_query), or one draw serves the whole batch (=shared: a dense
B x k_r matmul, unbiased too but much noisier; docs/training.md, "Design choices"). The
paper draws from [L] \\ H with weight (L - k_h)/k_r; drawing from [L] loses the ~k_h/L
of draws that hit H, negligible for L >> k_h.

Reduction: sum over labels, mean over the batch (the paper's peers found mean-over-labels
trains worse).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from astra_jax.data.batch import LabelBatch


def positive_terms(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """softplus(-f) where the mask is set (padding contributes 0)."""
  return jnp.where(mask, jax.nn.softplus(-scores), 0.0)


def negative_terms(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """softplus(f) where the mask is set (a draw that is a positive contributes 0)."""
  return jnp.where(mask, jax.nn.softplus(scores), 0.0)


class EstimatorTerms(NamedTuple):
  """The estimator's three terms for a batch (or a W shard's part of it), each masked and
  weighted but not yet reduced: the dense step takes the batch mean of `per_query`, the
  sharded kernel sums the positives (the same on every shard) apart from the negatives (a
  shard's own), and both reduce exactly these arrays.

  positives: (B,) sum_{l in K} softplus(-f_l), times |P| / |K| where K is a k_p-subset.
  hard: (B, k_h) softplus(f_l) of each hard negative (0 where masked: missing, a positive).
  random: (B, k_r) softplus(f_r) times the draw's weight L_s / k_r (0 where masked).
  """

  positives: jax.Array
  hard: jax.Array
  random: jax.Array

  def per_query(self) -> jax.Array:
    """(B,) the estimator of each query."""
    return self.positives + self.hard.sum(-1) + self.random.sum(-1)

  def negatives_total(self) -> jax.Array:
    """() the hard and random terms summed over the whole batch."""
    return self.hard.sum() + self.random.sum()


def estimator_terms(
  scores: tuple[jax.Array, jax.Array, jax.Array], labels: LabelBatch
) -> EstimatorTerms:
  """The estimator of the module docstring from a batch's scores: the one place its terms
  are composed (the dense step through `batch_loss`, the sharded classifier kernel directly).

  Args:
    scores: (positives (B, k_p), hard negatives (B, k_h), random negatives (B, k_r)).
    labels: the sampler's LabelBatch (batch.py): pos_mask, hard_mask, rand_mask (shaped
      like the scores), rand_weight ((k_r,): one weight per draw, per-shard draws in
      sampler.py) and pos_weight ((B,): |P| / k_p where the sampler kept k_p of |P| > k_p
      positives; None: 1).
  Returns:
    The terms, masked and weighted, not reduced.
  """
  pos, hard, rand = scores
  return EstimatorTerms(
    positives=positive_terms(pos, labels.pos_mask).sum(-1)
    * (1.0 if labels.pos_weight is None else labels.pos_weight),
    hard=negative_terms(hard, labels.hard_mask),
    random=negative_terms(rand, labels.rand_mask) * labels.rand_weight,
  )


def score_rows(emb: jax.Array, rows: jax.Array) -> jax.Array:
  """(B, k) scores of embeddings (B, d) against rows gathered per query (B, k, d), or against
  rows shared by the batch (k, d): one dense matmul."""
  return emb @ rows.T if rows.ndim == 2 else jnp.einsum("bd,bkd->bk", emb, rows)


def classifier_scores(
  embeddings: jax.Array, classifier: jax.Array, labels: LabelBatch, scale: jax.Array | float = 1.0
):
  """The classifier forward pass over W = scale * classifier (L, d): scores of positives
  (B, k_p), hard negatives (B, k_h) and random negatives (B, k_r); random ids of shape
  (k_r,) are one draw shared by the batch. (The sparse step's W is scale * V; timing its
  forward with a traced scale also keeps XLA:CPU's gather fused as the step has it.)"""
  emb = embeddings.astype(jnp.float32)
  return tuple(
    score_rows(emb, scale * classifier[ids].astype(jnp.float32))
    for ids in (labels.pos_ids, labels.hard_ids, labels.rand_ids)
  )


def batch_loss(scores: tuple[jax.Array, jax.Array, jax.Array], labels: LabelBatch) -> jax.Array:
  """Mean over the batch of the estimator, from `classifier_scores`."""
  return estimator_terms(scores, labels).per_query().mean()


def sampled_bce(embeddings: jax.Array, classifier: jax.Array, labels: LabelBatch) -> jax.Array:
  """The estimator's batch mean. embeddings: (B, d); classifier: (L, d); labels: the
  sampler's LabelBatch (batch.py)."""
  return batch_loss(classifier_scores(embeddings, classifier, labels), labels)


def full_bce_chunked(
  embeddings: jax.Array,
  classifier: jax.Array,
  pos_ids: jax.Array,
  pos_mask: jax.Array,
  block: int = 8192,
) -> jax.Array:
  """Eq. 1 over all L labels (the Renée-style full-L baseline), mean over the batch, in
  label blocks: each block's scores are recomputed in the backward pass (jax.checkpoint),
  so memory is O(B x block) whatever L; time and the gradient w.r.t. W are O(L).
  pos_ids (B, P): every positive of each query where pos_mask (the trainer passes the
  sampler's all_pos_ids: a positive left out would be trained as a negative)."""
  L, d = classifier.shape
  block = min(block, L)
  nb = -(-L // block)
  w = jnp.pad(classifier.astype(jnp.float32), ((0, nb * block - L), (0, 0))).reshape(nb, block, d)
  emb = embeddings.astype(jnp.float32)
  rows = jnp.arange(emb.shape[0])[:, None]

  @jax.checkpoint
  def block_loss(w_b, b):
    ids = b * block + jnp.arange(block)
    s = emb @ w_b.T
    # Scattered, not compared: O(B x (block + P)) rather than O(B x block x P) for rows
    # with thousands of positives. Positives outside the block go to column `block`: dropped.
    here = pos_mask & (pos_ids >= b * block) & (pos_ids < (b + 1) * block)
    target = (
      jnp.zeros(s.shape, bool)
      .at[rows, jnp.where(here, pos_ids - b * block, block)]
      .set(True, mode="drop")
    )
    per = jnp.where(target, jax.nn.softplus(-s), jax.nn.softplus(s))
    return jnp.where(ids[None, :] < L, per, 0.0).sum()

  def body(total, xs):
    return total + block_loss(*xs), None

  total, _ = jax.lax.scan(body, jnp.float32(0.0), (w, jnp.arange(nb)))
  return total / embeddings.shape[0]


def full_bce(embeddings: jax.Array, classifier: jax.Array, targets: jax.Array) -> jax.Array:
  """Eq. 1 over all L labels, mean over the batch: the reference the estimator is unbiased for.

  targets: (B, L) in {0, 1}. O(B L) memory: for tests and small L only.
  """
  scores = embeddings.astype(jnp.float32) @ classifier.astype(jnp.float32).T
  per_label = jnp.where(targets > 0, jax.nn.softplus(-scores), jax.nn.softplus(scores))
  return per_label.sum(-1).mean()
