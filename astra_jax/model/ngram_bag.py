"""A hashed n-gram bag encoder (fastText's architecture over subword token ids).

Every 1..n-gram of the row's non-pad token ids is hashed into one of `hash_buckets` learned
vectors; the query head (`model/interface.py`) averages them and, with
`normalize_scale` > 0, scales the mean to a fixed L2 norm. It has no attention and no
pretrained weights, and one step costs a gather of B x T x n vectors, so it trains on a CPU
in seconds per epoch where the tiny transformer takes minutes. On short texts whose
surface strings carry the signal (package names, product titles) it is the stronger
encoder on a CPU budget (docs/real_data.md).

Hash collisions are the price of a fixed table: with 2^18 buckets and a few hundred
thousand distinct n-grams, a rare n-gram shares its vector with one or two others, which the
frequent ones dominate; n-grams never cross the padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from astra_jax.model.dropout import fmix32
from astra_jax.model.interface import QueryHead
from astra_jax.model.ngram_bag_config import NgramBagConfig

_FNV_OFFSET = 2166136261
_FNV_PRIME = 16777619


def hashed_ngrams(
  input_ids: jax.Array, orders: int, buckets: int, pad_id: int
) -> tuple[jax.Array, jax.Array]:
  """Bucket ids of every n-gram (n = 1..orders) of each row, and which are real.

  Args:
    input_ids: (B, T) int token ids, padded with `pad_id`.
    orders: the largest n.
    buckets: the number of hash buckets.
    pad_id: the padding id; an n-gram touching a pad is masked out.
  Returns:
    (ids (B, G) int32 in [0, buckets), mask (B, G) bool), G = sum over n of (T - n + 1): the
    n-grams of order n starting at each position, orders concatenated.
  """
  x = input_ids.astype(jnp.uint32)
  real = input_ids != pad_id
  t = input_ids.shape[1]
  ids, masks = [], []
  for n in range(1, min(orders, t) + 1):
    width = t - n + 1
    # FNV-1a over the n ids, seeded by n so that an n-gram and an (n+1)-gram differ.
    h = jnp.full((x.shape[0], width), jnp.uint32(_FNV_OFFSET + n))
    m = jnp.ones((x.shape[0], width), bool)
    for j in range(n):
      h = (h ^ x[:, j : j + width]) * jnp.uint32(_FNV_PRIME)
      m = m & real[:, j : j + width]
    ids.append((fmix32(h) % jnp.uint32(buckets)).astype(jnp.int32))
    masks.append(m)
  return jnp.concatenate(ids, 1), jnp.concatenate(masks, 1)


class NgramBagEncoder(QueryHead, nnx.Module):
  """E(x): token ids (B, T) -> embeddings (B, d) float32 (a `QueryEncoder`)."""

  def __init__(self, cfg: NgramBagConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    # Adam moves each element by about the learning rate per step, so the init's scale sets
    # the relative step: 0.1 with lr 3e-3 is 3%, as fastText's uniform(+-1/H) init and
    # lr 0.1 SGD give about the same early on.
    self.ngram_embeddings = nnx.Embed(
      cfg.hash_buckets, cfg.hidden_size, embedding_init=nnx.initializers.normal(0.1), rngs=rngs
    )
    if cfg.bottleneck_dim:
      self.bottleneck = nnx.Linear(
        cfg.hidden_size,
        cfg.bottleneck_dim,
        use_bias=False,
        kernel_init=nnx.initializers.normal(0.02),
        rngs=rngs,
      )

  def token_states(
    self, input_ids: jax.Array, dropout_key: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """The vectors of every hashed n-gram (B, G, H) and their mask (B, G)."""
    del dropout_key  # no dropout inside the bag; the head's embedding dropout applies
    return self.states_of_rows(*self.table_rows(input_ids))

  # The lookup table a step reads by rows (Architecture.lookup_table): the train step can
  # update only the rows a batch reads (training/table_rows.py).
  def table_rows(self, input_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The table rows each n-gram reads (B, G) int32 and which n-grams are real (B, G)."""
    cfg = self.cfg
    return hashed_ngrams(input_ids, cfg.ngram_orders, cfg.hash_buckets, cfg.pad_token_id)

  def states_of_rows(self, rows: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(The table's rows `rows` (B, G, H), `mask`): `token_states` from `table_rows`, or
    from local row ids into a table of gathered rows."""
    return self.ngram_embeddings(rows), mask
