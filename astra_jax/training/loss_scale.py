"""Loss scaling for float16 compute (V100s have no bfloat16).

Float16 gradients of a loss near 1 underflow: the backward pass runs on loss x S instead and
the gradients are divided by S in float32. Dynamic scaling (the usual recipe): start at
2^15; a step whose gradients overflow (inf/nan) is skipped and S halves; after `period`
good steps in a row S doubles. A static scale never changes and never skips. The state is
a dict of two scalars, so it lives in the optimizer state and in checkpoints.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init(scale: float = 2.0**15) -> dict:
  return {"scale": jnp.float32(scale), "good_steps": jnp.int32(0)}


def all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))


def adjust(state: dict, finite: jax.Array, period: int = 2000, factor: float = 2.0) -> dict:
  """The next state after a step whose gradients were (not) all finite."""
  good = jnp.where(finite, state["good_steps"] + 1, 0)
  grow = good >= period
  scale = jnp.where(
    finite,
    jnp.where(grow, state["scale"] * factor, state["scale"]),
    jnp.maximum(state["scale"] / factor, 1.0),
  )
  return {"scale": scale, "good_steps": jnp.where(grow, 0, good).astype(jnp.int32)}
