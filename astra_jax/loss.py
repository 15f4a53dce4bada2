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
B x k_r matmul, unbiased too but much noisier; README). The paper draws from [L] \\ H with
weight (L - k_h)/k_r; drawing from [L] loses the ~k_h/L of draws that hit H, negligible for
L >> k_h.

Reduction: sum over labels, mean over the batch (the paper's peers found mean-over-labels
trains worse).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def positive_terms(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """softplus(-f) where the mask is set (padding contributes 0)."""
  return jnp.where(mask, jax.nn.softplus(-scores), 0.0)


def negative_terms(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """softplus(f) where the mask is set (a draw that is a positive contributes 0)."""
  return jnp.where(mask, jax.nn.softplus(scores), 0.0)


def sampled_bce_per_query(pos_scores: jax.Array, pos_mask: jax.Array,
                          hard_scores: jax.Array, hard_mask: jax.Array,
                          rand_scores: jax.Array, rand_mask: jax.Array,
                          rand_weight: jax.Array | float,
                          pos_weight: jax.Array | float = 1.0) -> jax.Array:
  """Per-query estimator values (B,). All score arrays are (B, k_*); masks are boolean;
  rand_weight: a scalar or one weight per draw (k_r,) (per-shard draws, see sampler.py);
  pos_weight: a scalar or one weight per query (B,), |P| / k_p where the sampler kept k_p
  of |P| > k_p positives."""
  return (positive_terms(pos_scores, pos_mask).sum(-1) * pos_weight +
          negative_terms(hard_scores, hard_mask).sum(-1) +
          (negative_terms(rand_scores, rand_mask) * rand_weight).sum(-1))


def score_rows(emb: jax.Array, rows: jax.Array) -> jax.Array:
  """(B, k) scores of embeddings (B, d) against rows gathered per query (B, k, d), or against
  rows shared by the batch (k, d): one dense matmul."""
  return emb @ rows.T if rows.ndim == 2 else jnp.einsum("bd,bkd->bk", emb, rows)


def classifier_scores(embeddings: jax.Array, classifier: jax.Array, batch: dict,
                      scale: jax.Array | float = 1.0):
  """The classifier forward pass over W = scale * classifier (L, d): scores of positives
  (B, k_p), hard negatives (B, k_h) and random negatives (B, k_r); random ids of shape
  (k_r,) are one draw shared by the batch. (The sparse step's W is scale * V; timing its
  forward with a traced scale also keeps XLA:CPU's gather fused as the step has it.)"""
  emb = embeddings.astype(jnp.float32)
  return tuple(score_rows(emb, scale * classifier[batch[k]].astype(jnp.float32))
               for k in ("pos_ids", "hard_ids", "rand_ids"))


def batch_loss(scores: tuple[jax.Array, jax.Array, jax.Array], batch: dict) -> jax.Array:
  """Mean over the batch of the estimator, from `classifier_scores`."""
  pos, hard, rand = scores
  return sampled_bce_per_query(pos, batch["pos_mask"], hard, batch["hard_mask"], rand,
                               batch["rand_mask"], batch["rand_weight"],
                               batch.get("pos_weight", 1.0)).mean()


def sampled_bce(embeddings: jax.Array, classifier: jax.Array, batch: dict) -> jax.Array:
  """The estimator's batch mean. embeddings: (B, d); classifier: (L, d); batch holds
  pos/hard ids (B, k) and masks, random ids drawn per query (B, k_r) or shared (k_r,),
  their (B, k_r) mask and (k_r,) weights (see sampler.py)."""
  return batch_loss(classifier_scores(embeddings, classifier, batch), batch)


def full_bce_chunked(embeddings: jax.Array, classifier: jax.Array, pos_ids: jax.Array,
                     pos_mask: jax.Array, block: int = 8192) -> jax.Array:
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
    target = jnp.zeros(s.shape, bool).at[rows, jnp.where(here, pos_ids - b * block, block)].set(
        True, mode="drop")
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
