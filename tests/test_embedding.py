"""embedding.embed: E(x) of token rows, batch by batch."""

import jax.numpy as jnp
import numpy as np

from astra_jax.data.dataset import RowConcat
from astra_jax.model.embedding import embed, embed_rows


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
