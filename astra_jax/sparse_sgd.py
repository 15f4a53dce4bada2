"""SGD with decoupled weight decay on the classifier, in O(rows touched) per step.

Dense SGD + decoupled decay updates every row each step: W <- (1 - lr wd) W - lr G, where G
is non-zero only on the rows the batch touched. We keep W = scale * V instead. The decay of
all rows is one scalar multiply, scale <- scale (1 - lr wd), and the gradient goes into the
touched rows of V: V[ids] <- V[ids] - (lr / scale_new) G[ids] (a scatter-add into the donated
buffer, so duplicate ids add up exactly like the dense gradient). This is the dense update,
exactly, not an approximation ("decay of touched rows" would be a different optimizer).
`fold` multiplies the scale back into V (O(L)); the trainer folds at epoch ends, before
anything outside the step reads W, and whenever the scale falls below 1e-2 (float range).
With optim.classifier_momentum > 0 the update is sparse_momentum.py's instead (each row
caught up from the step it was last touched; its docstring derives it).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def decayed_scale(scale: jax.Array, lr: jax.Array, weight_decay: float) -> jax.Array:
  """The scale after one step's decay of every row: scale (1 - lr wd)."""
  return scale * (1.0 - lr * weight_decay)


def add_rows(v: jax.Array, ids: jax.Array, grads: jax.Array, step: jax.Array) -> jax.Array:
  """V[ids] += step * grads, duplicates adding up; ids out of range are dropped (another
  shard's rows, padding)."""
  return v.at[ids].add((step * grads).astype(v.dtype), mode="drop")


def sgd_update(v: jax.Array, scale: jax.Array, ids: jax.Array, grads: jax.Array,
               lr: jax.Array, weight_decay: float) -> tuple[jax.Array, jax.Array]:
  """ids: (n,) row ids (duplicates allowed); grads: (n, d) dLoss/dW rows for them."""
  new_scale = decayed_scale(scale, lr, weight_decay)
  return add_rows(v, ids, grads, -(lr / new_scale)), new_scale


@functools.partial(jax.jit, donate_argnums=(0,))
def fold(v: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
  """V * scale, scale = 1: the true W."""
  return (v * scale).astype(v.dtype), jnp.ones_like(scale)
