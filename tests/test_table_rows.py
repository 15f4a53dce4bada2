"""The encoder's lookup table updated by the rows a step reads (training/table_rows.py,
`optim.encoder_table_update=rows`) against a dense reference of the same rule: Adam whose
update and moments change only on rows with a nonzero gradient (LazyAdam), run by optax
over the whole table in the dense-table step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tiny_step import B, L, problem

from astra_jax.config import base as config_base
from astra_jax.model.ngram_bag import NgramBagEncoder
from astra_jax.model.ngram_bag_config import NgramBagConfig
from astra_jax.parallel import sharding
from astra_jax.runtime.errors import InputError
from astra_jax.training import optim, steps, table_rows

TABLE = ("ngram_embeddings", "embedding")
BUCKETS, H = 512, 8


def lazy_adam_reference(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` (Adam) where a table row whose gradient is all zero keeps its value and moments:
  the rule the row-sparse step implements, computed densely."""

  def update(grads, state, params):
    updates, new = tx.update(grads, state, params)

    def keep_rows(path, g, new_leaf, old_leaf):
      if not (hasattr(new_leaf, "shape") and new_leaf.ndim == 2 and new_leaf.shape[0] == BUCKETS):
        return new_leaf
      read = jnp.any(g != 0, axis=1, keepdims=True)
      return jnp.where(read, new_leaf, old_leaf)

    table_grad = jax.tree_util.tree_leaves(grads)[0]
    updates = jax.tree_util.tree_map_with_path(
      lambda p, g, u: keep_rows(p, g, u, jnp.zeros_like(u)), grads, updates
    )
    mask_g = lambda leaf: table_grad if leaf.ndim == 2 and leaf.shape[0] == BUCKETS else None
    new = jax.tree_util.tree_map_with_path(
      lambda p, n, o: keep_rows(p, mask_g(n), n, o) if mask_g(n) is not None else n, new, state
    )
    return updates, new

  return optax.GradientTransformation(tx.init, update)


def _ngram_problem(micro_batches: int, shards: int):
  graphdef, _, oc, batches, w0 = problem(num_shards=shards, micro_batches=micro_batches)
  cfg = NgramBagConfig(
    hidden_size=H, hash_buckets=BUCKETS, ngram_orders=2, embedding_dropout=0.3, normalize_scale=3.0
  )
  graphdef, enc = nnx.split(NgramBagEncoder(cfg, nnx.Rngs(0)), nnx.Param)
  return graphdef, enc, oc, batches, w0


def _run(by_rows: bool, micro_batches: int, shape: tuple[int, int]):
  graphdef, enc, oc, batches, w0 = _ngram_problem(micro_batches, shape[1])
  mesh = sharding.make_mesh(*shape)
  base_tx = optim.encoder_optimizer(oc, 3)
  tx = base_tx if by_rows else lazy_adam_reference(base_tx)
  w = np.zeros((sharding.padded_rows(L, mesh), w0.shape[1]), np.float32)
  w[:L] = w0
  params = {"encoder": jax.tree.map(jnp.array, enc), "classifier": jnp.asarray(w)}
  state = steps.shard_state(steps.init_sparse_state(tx, params), mesh)
  step = steps.make_sparse_train_step(
    graphdef,
    tx,
    optim.classifier_schedule(oc, 3),
    oc.classifier_weight_decay,
    mesh,
    B,
    lookup_table=TABLE if by_rows else (),
  )
  for i, b in enumerate(batches):
    state, _, _ = step(state, sharding.shard_batch(b, mesh), jax.random.key(i))
  state = steps.fold_classifier(state)
  return jax.device_get(enc), jax.device_get(state)


@pytest.mark.parametrize("micro_batches,shape", [(1, (1, 1)), (2, (1, 1)), (1, (2, 4))])
def test_rows_step_equals_dense_lazy_adam(micro_batches, shape):
  enc0, rows = _run(True, micro_batches, shape)
  _, dense = _run(False, micro_batches, shape)
  np.testing.assert_allclose(
    np.asarray(rows.classifier)[:L], np.asarray(dense.classifier)[:L], rtol=1e-5, atol=1e-6
  )
  for a, b in zip(jax.tree.leaves(rows.encoder), jax.tree.leaves(dense.encoder), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(rows.opt), jax.tree.leaves(dense.opt), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  # Three batches of 16 rows read some of the 512 rows, not all: the rest are as they were.
  table0 = jax.tree.leaves(enc0)[0]
  table = jax.tree.leaves(rows.encoder)[0]
  moved = np.any(table != table0, axis=1)
  assert 0 < moved.sum() < BUCKETS


def test_touched_finds_each_read_row_once():
  rows = jnp.array([[[5, 3, 5, 9]], [[3, 7, 0, 2]]])  # (A=2, b=1, G=4)
  mask = jnp.array([[[True, True, True, False]], [[True, True, False, False]]])
  t = table_rows.touched(rows, mask, table_size=10)
  assert t.ids.shape == (8,)  # capacity: 2 rows x 4 n-grams
  np.testing.assert_array_equal(t.ids[:4], [3, 5, 7, 10])  # 9, 0, 2 are masked
  read = np.asarray(t.ids)[np.asarray(t.local)]
  np.testing.assert_array_equal(np.where(mask, read, -1), np.where(mask, rows, -1))


def test_rows_needs_a_lookup_table(load_config):
  c = load_config("experiments/demo.py")  # the tiny BERT
  c.optim.encoder_table_update = "rows"
  with pytest.raises(InputError, match=r"optim\.encoder_table_update.*lookup table"):
    config_base.validate(c)
