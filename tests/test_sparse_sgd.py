"""The O(rows touched) classifier update equals dense SGD + decoupled weight decay."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from astra_jax.data.batch import TrainBatch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.parallel import sharding
from astra_jax.training import optim, steps
from astra_jax.xc import classifier


def test_update_by_hand_with_duplicate_ids():
  v = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  ids = jnp.array([0, 2, 0])
  g = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
  v2, s2 = classifier.sgd_update(v, jnp.float32(1.0), ids, g, jnp.float32(0.1), 0.5)
  w = np.asarray(classifier.fold(v2, s2)[0])
  # Dense: W <- (1 - 0.1 * 0.5) W - 0.1 * G, G[0] = (2, 1), G[2] = (0, 1), G[1] = 0
  g = np.array([[2, 1], [0, 0], [0, 1]])
  want = 0.95 * np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]) - 0.1 * g
  np.testing.assert_allclose(w, want, rtol=1e-6)


# block_bytes 1: the update adds one query's rows at a time (classifier.UPDATE_BLOCK_BYTES).
@pytest.mark.parametrize("block_bytes", [None, 1])
def test_sparse_step_equals_dense_optax_step(block_bytes, monkeypatch):
  if block_bytes:
    monkeypatch.setattr(classifier, "UPDATE_BLOCK_BYTES", block_bytes)
  L, B, d = 200, 16, 8
  cfg = EncoderConfig(
    vocab_size=50,
    hidden_size=d,
    num_layers=1,
    num_heads=2,
    intermediate_size=16,
    max_position=16,
    embedding_dropout=0.3,
  )
  graphdef, enc = nnx.split(Encoder(cfg, nnx.Rngs(0)), nnx.Param)
  w0 = 0.5 * jax.random.normal(jax.random.key(1), (L, d))
  oc = ml_collections.ConfigDict(
    dict(
      encoder_lr=1e-2,
      classifier_lr=0.5,
      warmup_steps=2,
      encoder_weight_decay=0.0,
      classifier_weight_decay=0.05,
      classifier_momentum=0.0,
      grad_clip_norm=0.0,
    )
  )
  total = 20
  dense_tx = optim.make_optimizer(oc, total)
  dense_step = steps.make_train_step(graphdef, dense_tx)
  enc_tx = optim.encoder_optimizer(oc, total)
  sparse_step = steps.make_sparse_train_step(
    graphdef,
    enc_tx,
    optim.classifier_schedule(oc, total),
    oc.classifier_weight_decay,
    sharding.make_mesh(1, 1),
    B,
  )
  copy = lambda t: jax.tree.map(jnp.array, t)
  dense_p = {"encoder": copy(enc), "classifier": jnp.array(w0)}
  sparse_p = {"encoder": copy(enc), "classifier": jnp.array(w0)}
  dense_s = steps.init_dense_state(dense_tx, dense_p)
  sparse_s = steps.init_sparse_state(enc_tx, sparse_p)
  rng = np.random.default_rng(0)
  labels = SparseRows.from_lists([list(rng.choice(L, 3, replace=False)) for _ in range(64)], L)
  sampler = NegativeSampler(labels, k_p=4, k_h=5, k_r=30)
  for step in range(6):
    rows = rng.choice(64, B, replace=False)
    hard = rng.integers(0, L, (B, 5)) if step >= 3 else None  # both batch shapes
    b = TrainBatch(rng.integers(1, 50, (B, 10)).astype(np.int32), sampler(rows, rng, hard))
    batch = jax.tree.map(lambda v: jnp.asarray(v)[None], b)  # one micro-batch
    key = jax.random.key(step)
    dense_s, dl, _ = dense_step(dense_s, batch, key)
    sparse_s, sl, _ = sparse_step(sparse_s, batch, key)
    np.testing.assert_allclose(sl, dl, rtol=1e-5)
  assert float(sparse_s.scale) < 1.0  # the decay went into the scale
  w_sparse, _ = classifier.fold(sparse_s.classifier, sparse_s.scale)
  dense_p, sparse_p = dense_s.params, sparse_s.params
  np.testing.assert_allclose(w_sparse, dense_p["classifier"], rtol=1e-5, atol=1e-6)
  # Adam divides by sqrt(v): for parameters whose gradient is ~0 (float noise) it turns
  # rounding differences into updates of up to lr, so compare to 2% of one step (lr=1e-2).
  for a, b in zip(jax.tree.leaves(sparse_p["encoder"]), jax.tree.leaves(dense_p["encoder"])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-4)
  assert not np.allclose(w_sparse, w0)  # it did train
