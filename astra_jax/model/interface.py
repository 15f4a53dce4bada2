"""What an encoder provides, and the query head every backbone shares.

An encoder maps token ids (B, T) to the embedding E(x) (B, d) the classifiers score. It is
a backbone (per-position states and their mask) under a query head: masked mean pooling,
an optional bias-free bottleneck to d (Renée/ASTRA use d = 64 at very large L), an optional
L2 scaling, and the paper's high embedding dropout on the result. The trainer calls
`pooled` and `embedding_dropout` separately because the refresh index wants the embedding
before dropout; `__call__` is both.

New architectures subclass `QueryHead`, implement `token_states`, and register a record in
`model/architectures.py`; nothing else in the trainer changes.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from astra_jax.model.dropout import dropout


@runtime_checkable
class EncoderShape(Protocol):
  """An architecture's shape record (a frozen dataclass, stored in model.json)."""

  model_type: str
  bottleneck_dim: int
  embedding_dropout: float
  pad_token_id: int
  dtype: str

  @property
  def embed_dim(self) -> int:
    """d, the width of E(x) and of each classifier row."""

  def train_step_gflop(self, batch_size: int, seq_len: int) -> float:
    """Model GFLOP of one forward and backward pass."""


@runtime_checkable
class QueryEncoder(Protocol):
  """The interface the trainer, the refresh and the predictor use."""

  cfg: Any  # an EncoderShape

  def pooled(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """Embeddings before the embedding dropout, (B, d) float32."""

  def embedding_dropout(self, pooled: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
    """The paper's dropout on E(x); identity when `dropout_key` is None."""

  def __call__(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """E(x), (B, d) float32; `dropout_key=None` means evaluation (no dropout)."""


class QueryHead:
  """Pooling, bottleneck, L2 scaling and embedding dropout over a backbone's states.

  A mixin for `nnx.Module` backbones: the subclass defines `cfg` (an EncoderShape, with an
  optional `normalize_scale`), `token_states` and, when `cfg.bottleneck_dim` > 0, a
  bias-free linear `self.bottleneck` (a parameter of the backbone's module, so checkpoint
  paths stay `bottleneck/kernel`)."""

  cfg: Any

  def token_states(
    self, input_ids: jax.Array, dropout_key: jax.Array | None
  ) -> tuple[jax.Array, jax.Array]:
    """(states (B, T', H), mask (B, T') bool) for the head to pool."""
    raise NotImplementedError

  def pooled(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """Masked mean of the states, then the bottleneck and the L2 scaling, (B, d) float32."""
    return self.pool(*self.token_states(input_ids, dropout_key))

  def pool(self, states: jax.Array, mask: jax.Array) -> jax.Array:
    """`pooled` of given states (B, T', H) and their mask (B, T')."""
    m = mask[..., None].astype(jnp.float32)
    pooled = (states.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    if self.cfg.bottleneck_dim:
      pooled = self.bottleneck(pooled).astype(jnp.float32)
    scale = getattr(self.cfg, "normalize_scale", 0.0)
    if scale:
      norm = jnp.sqrt(jnp.sum(pooled * pooled, axis=-1, keepdims=True) + 1e-12)
      pooled = pooled * (scale / norm)
    return pooled

  def embedding_dropout(self, pooled: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, 2**31 - 1)
    return dropout(pooled, self.cfg.embedding_dropout, key)

  def __call__(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    return self.embedding_dropout(self.pooled(input_ids, dropout_key), dropout_key)
