"""The loss is defined once: the sharded classifier kernel and the dense reference (autodiff
of loss.sampled_bce w.r.t. E(x) and all of W) give the same loss and gradients, and both
compose the estimator through loss.estimator_terms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.parallel import sharding
from astra_jax.xc import classifier, loss

L, B, D, K_P, K_H, K_R = 22, 8, 4, 3, 2, 5


def _case(num_shards: int, per_query: bool, seed: int = 0):
  """(embeddings (B, d), W (L, d), one micro-batch's label arrays) with hard negatives
  grouped by shard as the per-shard indexes return them; L = 22 leaves the last of 4
  shards short (padded rows)."""
  rng = np.random.default_rng(seed)
  labels = SparseRows.from_lists(
    [list(rng.choice(L, rng.integers(1, 6), replace=False)) for _ in range(B)], L
  )
  sampler = NegativeSampler(
    labels, k_p=K_P, k_h=K_H, k_r=K_R, num_shards=num_shards, per_query_random=per_query
  )
  hard = np.concatenate(
    [lo + rng.integers(0, hi - lo, (B, K_H)) for lo, hi in sampler.shard_bounds], 1
  )
  batch = sampler(np.arange(B), rng, hard)
  emb = rng.normal(0, 0.7, (B, D)).astype(np.float32)
  w = rng.normal(0, 1.0, (L, D)).astype(np.float32)
  return jnp.asarray(emb), jnp.asarray(w), jax.tree.map(jnp.asarray, batch)


def _dense_w_grad(row_grads: dict, num_shards: int, rows_per_shard: int) -> np.ndarray:
  """The kernel's factored row gradients as the (L, d) gradient w.r.t. W: shard s's block
  of every leaf (out spec P('model')) adds into its own rows."""
  g = {k: np.asarray(v) for k, v in row_grads.items()}
  dw = np.zeros((num_shards * rows_per_shard + 1, D), np.float64)  # + a row for "not mine"
  for s in range(num_shards):
    part = {k: np.split(v, num_shards)[s] for k, v in g.items()}
    ids = s * rows_per_shard + np.minimum(part["ids"], rows_per_shard)
    ids[part["ids"] >= rows_per_shard] = len(dw) - 1
    np.add.at(
      dw, ids.reshape(-1), (part["coef"][..., None] * part["queries"][:, None]).reshape(-1, D)
    )
    np.add.at(dw, s * rows_per_shard + part["shared_ids"], part["shared_grads"])
  return dw[:L]


@pytest.mark.parametrize(
  "shape,per_query", [((1, 1), False), ((1, 1), True), ((2, 4), False), ((2, 4), True)]
)
def test_kernel_equals_the_dense_reference(shape, per_query):
  mesh = sharding.make_mesh(*shape)
  emb, w, batch = _case(shape[1], per_query)
  value, (d_emb, d_w) = jax.value_and_grad(loss.sampled_bce, (0, 1))(emb, w, batch)

  rows = sharding.padded_rows(L, mesh)
  v = jnp.concatenate([w, jnp.zeros((rows - L, D), w.dtype)])
  got, got_d_emb, row_grads = classifier.classifier_grads(mesh, B)(emb, v, jnp.float32(1.0), batch)
  np.testing.assert_allclose(float(got), float(value), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got_d_emb), np.asarray(d_emb), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    _dense_w_grad(row_grads, shape[1], rows // shape[1]), np.asarray(d_w), rtol=1e-5, atol=1e-6
  )


def test_both_paths_compose_the_estimator_in_loss_estimator_terms(monkeypatch):
  """A change to the estimator's terms reaches both paths: doubling the hard negatives'
  term through loss.estimator_terms changes the dense and the sharded loss alike."""
  mesh = sharding.make_mesh(2, 4)
  emb, w, batch = _case(4, per_query=True)
  v = jnp.concatenate([w, jnp.zeros((sharding.padded_rows(L, mesh) - L, D), w.dtype)])
  kernel = lambda: float(classifier.classifier_grads(mesh, B)(emb, v, jnp.float32(1.0), batch)[0])
  dense = lambda: float(loss.sampled_bce(emb, w, batch))
  before = dense(), kernel()
  hard_only = loss.estimator_terms(
    (jnp.zeros((B, K_P)), loss.classifier_scores(emb, w, batch)[1], jnp.zeros((B, K_R * 4))),
    batch._replace(pos_mask=jnp.zeros((B, K_P), bool), rand_mask=jnp.zeros((B, K_R * 4), bool)),
  )
  hard_mean = float(hard_only.hard.sum() / B)
  assert hard_mean > 0.1

  real = loss.estimator_terms
  calls = []

  def doubled_hard(scores, labels):
    calls.append(1)
    terms = real(scores, labels)
    return terms._replace(hard=2 * terms.hard)

  monkeypatch.setattr(loss, "estimator_terms", doubled_hard)
  after = dense(), kernel()
  assert len(calls) >= 2
  np.testing.assert_allclose(np.array(after) - np.array(before), [hard_mean, hard_mean], rtol=1e-5)


@pytest.mark.parametrize("shape,per_query", [((1, 1), False), ((2, 4), False), ((2, 4), True)])
def test_forward_equals_the_dense_scores(shape, per_query):
  # The step profiler's classifier forward: shard-local, the dense scores laid out alike.
  mesh = sharding.make_mesh(*shape)
  emb, w, batch = _case(shape[1], per_query)
  rows = sharding.padded_rows(L, mesh)
  v = jnp.concatenate([w, jnp.zeros((rows - L, D), w.dtype)])
  got = classifier.classifier_forward(mesh)(emb, v, batch, jnp.float32(1.0))
  for g, want in zip(got, loss.classifier_scores(emb, w, batch)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_update_blocks_divide_the_queries_and_only_on_the_cpu():
  d, k, n = 4, 3, 8
  g = {
    "ids": jnp.arange(n * k).reshape(n, k),
    "coef": jnp.ones((n, k)),
    "queries": jnp.ones((n, d)),
  }
  per_query = k * d * 4  # bytes of one query's row gradients
  assert classifier._query_blocks(g, 0)["ids"].shape == (1, 8, 3)  # 0: one block
  assert classifier._query_blocks(g, 2 * per_query)["ids"].shape == (4, 2, 3)
  # 3 queries' worth: the largest divisor of 8 that fits is 2.
  blocks = classifier._query_blocks(g, 3 * per_query)
  assert blocks["queries"].shape == (4, 2, 4)
  np.testing.assert_array_equal(blocks["ids"].reshape(n, k), g["ids"])  # order kept
  cpu = sharding.make_mesh(1, 1)
  assert classifier.update_block_bytes(cpu) == classifier.UPDATE_BLOCK_BYTES
  gpu = type("Mesh", (), {"devices": np.array([type("D", (), {"platform": "gpu"})()])})()
  assert classifier.update_block_bytes(gpu) == 0


@pytest.mark.parametrize("per_query", [True, False])
def test_momentum_blocks_by_hand(per_query):
  """classifier_bench's shapes: 457 rows a query per query-drawn negatives (7 + 50 + 400),
  117 KB of row gradients; 4 MB holds 35 queries, and the largest divisor of 256 under that
  is 32: 8 blocks. With a shared draw a query scores 57 rows (14.6 KB): 287, so 1 block."""
  from astra_jax.reproduce.classifier_bench import make_batch

  mesh = sharding.make_mesh(1, 1)
  labels = make_batch(1000, np.random.default_rng(0), per_query=per_query)
  blocks = classifier.momentum_query_blocks(mesh, labels, 64, 4 << 20)
  assert blocks == (8 if per_query else 1)
  assert classifier.momentum_query_blocks(mesh, labels, 64, 0) == 1


def test_device_blocks_keep_each_devices_queries():
  # 2 devices of 4 queries each, 2 blocks: block b is device 0's b-th pair, then device 1's.
  x = jnp.arange(8)
  blocks = classifier._split_by_device(x, 2, 2)
  np.testing.assert_array_equal(blocks, [[0, 1, 4, 5], [2, 3, 6, 7]])
  np.testing.assert_array_equal(classifier._join_by_device(blocks, 2), x)
