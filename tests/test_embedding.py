"""embedding.embed: E(x) of token rows, batch by batch; mesh_embedding.embed_on_mesh: the
same over every device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from astra_jax.data.dataset import RowConcat
from astra_jax.model.embedding import embed, embed_rows
from astra_jax.parallel import sharding
from astra_jax.parallel.mesh_embedding import embed_on_mesh


def _embed_fn(params, ids):
  """A stand-in encoder: each row's token ids summed into a table's rows."""
  return params[ids].sum(1)


def test_given_rows_are_embedded_in_their_order_a_batch_at_a_time():
  rng = np.random.default_rng(0)
  table = jnp.asarray(rng.normal(size=(50, 3)), jnp.float32)
  a, b = rng.integers(0, 50, (7, 4)), rng.integers(0, 50, (5, 4))
  tokens = RowConcat(a, b)  # row-indexable only, as the training rows with label texts
  rows = np.array([11, 0, 6, 7, 3, 3, 9])  # both parts, unsorted, a repeat
  whole = np.concatenate([a, b])
  expect = np.asarray(table)[whole[rows]].sum(1)
  np.testing.assert_allclose(embed(_embed_fn, table, tokens, 3, rows), expect, rtol=1e-6)
  np.testing.assert_allclose(embed_rows(_embed_fn, table, tokens, rows, 4), expect, rtol=1e-6)
  # Without rows: every row of a sliceable array, the last batch padded and cut.
  np.testing.assert_allclose(
    embed(_embed_fn, table, whole, 5), np.asarray(table)[whole].sum(1), rtol=1e-6
  )


@pytest.mark.parametrize("shape,batch_size", [((1, 1), 4), ((2, 4), 3), ((4, 2), 16)])
def test_embedding_on_the_mesh_equals_one_device(shape, batch_size):
  """embed_on_mesh splits each block over every device (the batch rounded up to them, the
  last block padded): the same rows as embed on one device, in the rows' order."""
  mesh = sharding.make_mesh(*shape, jax.devices()[: shape[0] * shape[1]])
  rng = np.random.default_rng(1)
  table = jnp.asarray(rng.normal(size=(50, 3)), jnp.float32)
  a, b = rng.integers(0, 50, (13, 4)), rng.integers(0, 50, (6, 4))
  tokens, whole = RowConcat(a, b), np.concatenate([a, b])
  rows = np.array([18, 0, 6, 7, 3, 3, 9, 14, 1, 2, 12])
  got = embed_on_mesh(mesh, _embed_fn, table, tokens, batch_size, rows)
  np.testing.assert_allclose(got, embed(_embed_fn, table, tokens, 5, rows), rtol=1e-6)
  got = embed_on_mesh(mesh, _embed_fn, table, whole, batch_size)
  np.testing.assert_allclose(got, np.asarray(table)[whole].sum(1), rtol=1e-6)
  assert embed_on_mesh(mesh, _embed_fn, table, whole, batch_size, rows[:0]).shape[0] == 0
