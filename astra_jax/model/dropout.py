"""Dropout with an explicit key, its mask from a counter-based hash.

Masks come from a hash of (key, element index) rather than `jax.random.bernoulli`: the hash
fuses into the masked op, while threefry is a separate pass over every element, a visible
share of a CPU step (docs/results/implementation_notes.md).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection whose output bits each depend on all
  input bits."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def dropout_mask(key: jax.Array, rate: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
  """(keep mask, keep probability). Element i (row-major index; tensors up to 2^32
  elements) is kept when
  fmix32(fmix32(i * golden ^ s0) + s1) >= round(rate * 2^32), with (s0, s1) drawn from `key`:
  two rounds so that two keys never give shifted copies of one stream. The keep probability
  is exact to 2^-32; the caller scales by its inverse, so E[dropout(x)] = x."""
  s = jax.random.bits(key, (2,), jnp.uint32)
  index = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  h = fmix32(fmix32((index * jnp.uint32(0x9E3779B9)) ^ s[0]) + s[1])
  threshold = min(round(rate * 2.0**32), 2**32 - 1)
  return h >= jnp.uint32(threshold), 1.0 - threshold / 2.0**32


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  """x with each element zeroed at `rate` and the rest scaled by 1 / keep; x itself when
  `key` is None (evaluation) or `rate` is 0."""
  if key is None or rate <= 0.0:
    return x
  keep, p = dropout_mask(key, rate, x.shape)
  return jnp.where(keep, x * jnp.asarray(1.0 / p, x.dtype), jnp.zeros_like(x))
