"""The sampled BCE estimator against independent truth: a hand-computed case and the full-L
BCE it must be unbiased for (value and gradient w.r.t. the query embedding)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from astra_jax.data.batch import LabelBatch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.xc import loss


def sp(x):  # softplus, written independently of jax
  return math.log1p(math.exp(x))


def test_hand_computed_case():
  emb = jnp.array([[1.0, 2.0]])
  w = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.5, -1.0]])
  # scores: [1, 2, 3, 0, -1.5]; positive {0}; hard {1, 0(positive: masked)}; random draws
  # {2, 0(positive), 4} with weight 10.
  batch = LabelBatch(
    pos_ids=jnp.array([[0, 3]]),
    pos_mask=jnp.array([[True, False]]),
    hard_ids=jnp.array([[1, 0]]),
    hard_mask=jnp.array([[True, False]]),
    rand_ids=jnp.array([2, 0, 4]),
    rand_mask=jnp.array([[True, False, True]]),
    rand_weight=10.0,
  )
  want = sp(-1.0) + sp(2.0) + 10.0 * (sp(3.0) + sp(-1.5))
  np.testing.assert_allclose(loss.sampled_bce(emb, w, batch), want, rtol=1e-6)


def test_hand_computed_case_with_per_query_draws():
  # Two queries, each with its own random draws (B, k_r) and the weight 10.
  emb = jnp.array([[1.0, 2.0], [0.0, -1.0]])
  w = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.5, -1.0]])
  # scores, query 0: [1, 2, 3, 0, -1.5]; query 1: [0, -1, -1, -0.5, 1].
  batch = LabelBatch(
    pos_ids=jnp.array([[0], [4]]),
    pos_mask=jnp.array([[True], [True]]),
    hard_ids=jnp.array([[1], [3]]),
    hard_mask=jnp.array([[True], [True]]),
    rand_ids=jnp.array([[2, 4], [1, 4]]),
    rand_mask=jnp.array([[True, True], [True, False]]),  # 4 is query 1's positive
    rand_weight=jnp.array([10.0, 10.0]),
  )
  want = (
    (sp(-1.0) + sp(2.0) + 10.0 * (sp(3.0) + sp(-1.5))) + (sp(-1.0) + sp(-0.5) + 10.0 * sp(-1.0))
  ) / 2
  np.testing.assert_allclose(loss.sampled_bce(emb, w, batch), want, rtol=1e-6)


def test_full_bce_hand_computed():
  emb = jnp.array([[1.0, 2.0]])
  w = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
  targets = jnp.array([[1, 0, 0]])
  np.testing.assert_allclose(loss.full_bce(emb, w, targets), sp(-1) + sp(2) + sp(-1), rtol=1e-6)


def test_stable_for_large_scores():
  emb = jnp.array([[100.0]])
  w = jnp.array([[1.0], [-1.0]])
  batch = LabelBatch(
    pos_ids=jnp.array([[1]]),
    pos_mask=jnp.array([[True]]),
    hard_ids=jnp.array([[0]]),
    hard_mask=jnp.array([[True]]),
    rand_ids=jnp.array([0]),
    rand_mask=jnp.array([[False]]),
    rand_weight=2.0,
  )
  np.testing.assert_allclose(loss.sampled_bce(emb, w, batch), 200.0, rtol=1e-6)
  g = jax.grad(lambda e: loss.sampled_bce(e, w, batch))(emb)
  assert np.all(np.isfinite(g))


def _setup(L=60, d=6, seed=0):
  rng = np.random.default_rng(seed)
  w = rng.normal(0, 1.0, (L, d)).astype(np.float32)
  emb = rng.normal(0, 0.7, (2, d)).astype(np.float32)
  positives = [[3, 17, 40], [5]]
  labels = SparseRows.from_lists(positives, L)
  hard = np.array([[17, 8, 9, 22], [1, 2, 5, -1]])  # includes a positive and a missing slot
  return w, emb, labels, hard


def _full_bce_rows(w, emb, labels):
  """Eq. 1 per query, dense float64 numpy."""
  s = emb.astype(np.float64) @ w.T.astype(np.float64)
  t = labels.to_dense() > 0
  return np.where(t, np.logaddexp(0, -s), np.logaddexp(0, s)).sum(1), s, t


@pytest.mark.parametrize("num_shards,per_query", [(1, False), (3, False), (1, True), (3, True)])
def test_estimator_is_unbiased_value_and_gradient(num_shards, per_query):
  # With W split into shards, each shard has its own hard block and its own draws over its
  # rows with weight L_s / k_r (docs/DESIGN.md, section 1); the sum over shards is unbiased.
  L, k_r, k_h, M = 60, 8, 4, 6000
  w, emb, labels, hard = _setup(L)
  R = L // num_shards
  bounds = [(s * R, (s + 1) * R) for s in range(num_shards)]
  if num_shards > 1:  # hard negatives grouped by shard: shard s's block from its rows
    hard = np.concatenate([np.where(hard >= 0, lo + hard % R, -1) for lo, _ in bounds], 1)
  sampler = NegativeSampler(
    labels, k_p=3, k_h=k_h, k_r=k_r, num_shards=num_shards, per_query_random=per_query
  )
  rows = np.arange(2)
  rng = np.random.default_rng(1)
  draws = [sampler(rows, rng, hard) for _ in range(M)]
  stacked = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *draws)

  def per_query(e, b):
    pos = jnp.einsum("bd,bkd->bk", e, jnp.asarray(w)[b.pos_ids])
    hrd = jnp.einsum("bd,bkd->bk", e, jnp.asarray(w)[b.hard_ids])
    r = jnp.asarray(w)[b.rand_ids]  # (k, d) shared by the queries, or (B, k, d)
    rnd = e @ r.T if r.ndim == 2 else jnp.einsum("bd,bkd->bk", e, r)
    return loss.estimator_terms((pos, hrd, rnd), b).per_query()

  values = np.asarray(jax.vmap(per_query, (None, 0))(jnp.asarray(emb), stacked))  # (M, 2)
  grads = np.asarray(
    jax.vmap(jax.jacrev(lambda e, b: per_query(e, b).sum()), (None, 0))(jnp.asarray(emb), stacked)
  )  # (M, 2, d)

  full, s, t = _full_bce_rows(w, emb, labels)
  sig = 1 / (1 + np.exp(-s))
  full_grad = np.where(t, -(1 - sig), sig) @ w.astype(np.float64)  # (2, d)
  for i in range(2):
    # Only the random term is random: X = const + sum_s (L_s/k_r) sum_j g(r_sj), r_sj ~
    # U[shard s] iid, g(l) = softplus(s_l) [l not in P u H]. Var of the mean of M estimators:
    # sum_s L_s^2 Var_{l in s}[g(l)] / (k_r M) -- from the full score vector, not the samples.
    excluded = t[i] | np.isin(np.arange(L), hard[i][hard[i] >= 0])
    g = np.where(excluded, 0.0, np.logaddexp(0, s[i]))
    sd = np.sqrt(sum(R**2 * g[lo:hi].var() for lo, hi in bounds) / (k_r * M))
    assert abs(values[:, i].mean() - full[i]) < 5 * sd, (values[:, i].mean(), full[i], sd)
    G = np.where(excluded, 0.0, sig[i])[:, None] * w  # (L, d) per-label gradient terms
    sd_g = np.sqrt(sum(R**2 * G[lo:hi].var(0) for lo, hi in bounds) / (k_r * M))
    np.testing.assert_array_less(np.abs(grads[:, i].mean(0) - full_grad[i]), 5 * sd_g + 1e-6)
  # The estimator is not trivially exact: single draws do vary.
  assert values[:, 0].std() > 0.1


@pytest.mark.parametrize("per_query", [False, True])
def test_estimator_is_unbiased_with_more_positives_than_k_p(per_query):
  # |P| = 5 and 3 > k_p = 2: the sampler keeps a uniform 2-subset, weighted by |P| / k_p.
  # Unweighted, each positive's expected weight would be 2/5 (2/3): biased.
  L, k_p, M = 60, 2, 6000
  w, emb, _, hard = _setup(L)
  labels = SparseRows.from_lists([[3, 17, 40, 44, 51], [5, 6, 7]], L)
  sampler = NegativeSampler(labels, k_p=k_p, k_h=4, k_r=8, per_query_random=per_query)
  rng = np.random.default_rng(2)
  draws = [sampler(np.arange(2), rng, hard) for _ in range(M)]
  np.testing.assert_array_equal(draws[0].pos_weight, [2.5, 1.5])
  stacked = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *draws)

  def values_of(e, b):
    pos = jnp.einsum("bd,bkd->bk", e, jnp.asarray(w)[b.pos_ids])
    hrd = jnp.einsum("bd,bkd->bk", e, jnp.asarray(w)[b.hard_ids])
    r = jnp.asarray(w)[b.rand_ids]
    rnd = e @ r.T if r.ndim == 2 else jnp.einsum("bd,bkd->bk", e, r)
    return loss.estimator_terms((pos, hrd, rnd), b).per_query()

  values = np.asarray(jax.vmap(values_of, (None, 0))(jnp.asarray(emb), stacked))  # (M, 2)
  grads = np.asarray(
    jax.vmap(jax.jacrev(lambda e, b: values_of(e, b).sum()), (None, 0))(jnp.asarray(emb), stacked)
  )  # (M, 2, d)
  full, s, t = _full_bce_rows(w, emb, labels)
  sig = 1 / (1 + np.exp(-s))
  full_grad = np.where(t, -(1 - sig), sig) @ w.astype(np.float64)
  for i in range(2):
    # Both the positives' subset and the random draws vary: the sample standard error.
    se = values[:, i].std() / np.sqrt(M)
    assert abs(values[:, i].mean() - full[i]) < 5 * se, (values[:, i].mean(), full[i], se)
    se_g = grads[:, i].std(0) / np.sqrt(M)
    np.testing.assert_array_less(np.abs(grads[:, i].mean(0) - full_grad[i]), 5 * se_g + 1e-6)
  # The batch mean through batch_loss (the trainer's path) weights the positives too.
  b0 = jax.tree.map(jnp.asarray, draws[0])
  np.testing.assert_allclose(
    loss.sampled_bce(jnp.asarray(emb), jnp.asarray(w), b0), values[0].mean(), rtol=1e-5
  )


def test_weight_matches_the_paper_before_tau_s():
  # No hard negatives yet: all k_r + k_h negatives random, weight L/(k_r + k_h).
  L = 60
  w, emb, labels, _ = _setup(L)
  b = NegativeSampler(labels, k_p=3, k_h=4, k_r=8)(np.arange(2), np.random.default_rng(0))
  assert b.hard_ids.shape == (2, 0) and b.rand_ids.shape == (12,)
  np.testing.assert_array_equal(b.rand_weight, np.full(12, L / 12, np.float32))


def test_uptodate_mining_is_the_exact_top_k_of_non_positives():
  """Every positive is excluded, also those beyond the k_p the sampler kept."""
  from astra_jax.data.sparse_rows import SparseRows
  from astra_jax.negatives.sampler import NegativeSampler
  from astra_jax.training.steps import mine_in_step

  rng = np.random.default_rng(0)
  emb = rng.normal(size=(3, 4)).astype(np.float32)
  w = rng.normal(size=(20, 4)).astype(np.float32)
  positives = [{0, 5, 9, 13}, {1}, set()]
  labels = SparseRows(
    np.array([0, 4, 5, 5]), np.array([0, 5, 9, 13, 1], np.int32), np.ones(5, np.float32), 20
  )
  sampler = NegativeSampler(labels, k_p=2, k_h=3, k_r=20, all_positives=4)
  batch = sampler(np.arange(3), rng, num_random=20)
  assert batch.pos_mask[0].sum() == 2  # two of row 0's four positives are not in pos_ids
  out = mine_in_step(jnp.asarray(emb), jnp.asarray(w), jax.tree.map(jnp.asarray, batch), 3)
  for i, pos in enumerate(positives):
    ranked = [l for l in np.argsort(-(emb[i] @ w.T)) if l not in pos][:3]
    np.testing.assert_array_equal(out.hard_ids[i], ranked)
    # A random draw equal to a hard negative is not counted twice.
    hit = np.isin(np.asarray(batch.rand_ids), ranked)
    np.testing.assert_array_equal(out.rand_mask[i], batch.rand_mask[i] & ~hit)


def test_chunked_full_bce_equals_dense_reference():
  rng = np.random.default_rng(3)
  emb = jnp.asarray(rng.normal(size=(5, 5)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(23, 5)), jnp.float32)  # not a multiple of the block
  # blocks of 6: [0, 6), [6, 12), [12, 18), [18, 23); row 4: both edges of every block, -1s
  pos_ids = jnp.array(
    [
      [1, 7, 0, 0, 0, 0, 0],
      [22, 0, 0, 0, 0, 0, 0],
      [0] * 7,
      [3, 4, 5, 0, 0, 0, 0],
      [5, 6, 11, 12, 17, 18, -1],
    ]
  )
  pos_mask = jnp.array(
    [
      [True, True] + [False] * 5,
      [True] + [False] * 6,
      [False] * 7,
      [True] * 3 + [False] * 4,
      [True] * 6 + [False],
    ]
  )
  targets = np.zeros((5, 23))
  for i in range(5):
    targets[i, np.asarray(pos_ids[i])[np.asarray(pos_mask[i])]] = 1
  want = loss.full_bce(emb, w, jnp.asarray(targets))
  np.testing.assert_allclose(
    loss.full_bce_chunked(emb, w, pos_ids, pos_mask, block=6), want, rtol=1e-6
  )
  g = jax.grad(loss.full_bce_chunked, argnums=(0, 1))(emb, w, pos_ids, pos_mask, 6)
  g_ref = jax.grad(loss.full_bce, argnums=(0, 1))(emb, w, jnp.asarray(targets))
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
