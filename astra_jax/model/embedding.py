"""E(x) of token rows outside the train step: evaluation, the refresh's inputs, the
classifier's initialisation. Multi-process runs compute on each process's own copy."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

EmbedFn = Callable[[object, jax.Array], jax.Array]  # (encoder params, (B, T) ids) -> (B, d)


def make_embed_fn(graphdef) -> EmbedFn:
  """The jitted inference-mode encoder: (encoder params, ids) -> E(x)."""
  return jax.jit(lambda p, ids: nnx.merge(graphdef, p)(ids))


def embed(
  embed_fn: EmbedFn, enc_params, tokens, batch_size: int, rows: np.ndarray | None = None
) -> np.ndarray:
  """(n, d) float32 E(x) of `tokens` (n, T), or of its `rows` in their order, in batches
  of `batch_size` (the last padded, so that one compilation serves all). Rows are read a
  batch at a time: the token rows are never copied whole."""
  out = []
  n = len(tokens) if rows is None else len(rows)
  for start in range(0, n, batch_size):
    batch = slice(start, start + batch_size)
    ids = np.asarray(tokens[batch] if rows is None else tokens[rows[batch]], np.int32)
    m = len(ids)
    if m < batch_size:
      ids = np.pad(ids, ((0, batch_size - m), (0, 0)))
    out.append(np.asarray(embed_fn(enc_params, jnp.asarray(ids)))[:m])
  return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def embed_rows(
  embed_fn: EmbedFn, enc_params, tokens, rows: np.ndarray, batch_size: int
) -> np.ndarray:
  """E(x) of the given rows of `tokens`, in the rows' order (read in ascending order: a
  memory-mapped token file is read forward)."""
  order = np.argsort(rows)
  emb = embed(embed_fn, enc_params, tokens, batch_size, rows[order])
  out = np.empty_like(emb)
  out[order] = emb
  return out


def host_local(tree):
  """A replicated tree as this process can compute with alone: in a multi-process run its
  own copy of each array (the arrays themselves on one process)."""
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)
