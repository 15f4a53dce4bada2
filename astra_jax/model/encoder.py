"""BERT / DistilBERT query encoder in Flax NNX, built from a HuggingFace `config.json`.

Both architectures are the same post-LayerNorm transformer; they differ in parameter names
(handled by `weights.py`), DistilBERT has no token-type embeddings. The backbone gives the
last hidden states; the query head (`model/interface.py`) takes their mean over the
attention mask (as sentence-transformers does), the optional bottleneck and the paper's
high embedding dropout (0.7-0.85). Dropout takes an explicit PRNG key, so a train step is
a pure function of (params, batch, key).

Dropout is `model/dropout.py`'s counter-based hash; pooling, bottleneck and embedding
dropout are the query head every backbone shares (`model/interface.py`). LayerNorm is
written out (two-pass variance in fp32) rather than nnx.LayerNorm, whose broadcast scale
XLA:CPU materialises per call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from astra_jax.model.dropout import (
  dropout as _dropout,
  dropout_mask,  # noqa: F401 (re-exported)
)
from astra_jax.model.encoder_config import EncoderConfig  # noqa: F401 (re-exported)
from astra_jax.model.interface import QueryHead

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class _Keys:
  """Hands out fresh dropout keys (or None when deterministic)."""

  def __init__(self, key: jax.Array | None):
    self.key, self.n = key, 0

  def __call__(self) -> jax.Array | None:
    if self.key is None:
      return None
    self.n += 1
    return jax.random.fold_in(self.key, self.n)


def _linear(cin: int, cout: int, cfg: EncoderConfig, rngs: nnx.Rngs, bias: bool = True):
  return nnx.Linear(
    cin,
    cout,
    use_bias=bias,
    dtype=_DTYPES[cfg.dtype],
    kernel_init=nnx.initializers.normal(0.02),
    rngs=rngs,
  )


class LayerNorm(nnx.Module):
  """y = (x - mean) / sqrt(var + eps) * scale + bias over the last axis, statistics in fp32,
  output in the compute dtype. Parameters `scale`, `bias` as nnx.LayerNorm's."""

  def __init__(self, n: int, eps: float, dtype):
    self.scale = nnx.Param(jnp.ones((n,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((n,), jnp.float32))
    self.eps, self.dtype = eps, dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    centred = x - x.mean(-1, keepdims=True)
    var = (centred * centred).mean(-1, keepdims=True)
    y = centred * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]
    return y.astype(self.dtype)


def _layer_norm(n: int, cfg: EncoderConfig, rngs: nnx.Rngs):
  del rngs  # deterministic init (ones, zeros)
  return LayerNorm(n, cfg.layer_norm_eps, _DTYPES[cfg.dtype])


class SelfAttention(nnx.Module):
  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    h = cfg.hidden_size
    self.cfg = cfg
    self.query, self.key, self.value, self.out = (_linear(h, h, cfg, rngs) for _ in range(4))

  def __call__(self, x: jax.Array, mask: jax.Array, keys: _Keys) -> jax.Array:
    b, t, h = x.shape
    nh = self.cfg.num_heads
    split = lambda y: y.reshape(b, t, nh, h // nh)
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(h / nh)
    logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(x.dtype)
    probs = _dropout(probs, self.cfg.attention_dropout, keys())
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, h)
    return self.out(ctx)


class TransformerLayer(nnx.Module):
  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.attention = SelfAttention(cfg, rngs)
    self.attention_norm = _layer_norm(cfg.hidden_size, cfg, rngs)
    self.ffn_in = _linear(cfg.hidden_size, cfg.intermediate_size, cfg, rngs)
    self.ffn_out = _linear(cfg.intermediate_size, cfg.hidden_size, cfg, rngs)
    self.output_norm = _layer_norm(cfg.hidden_size, cfg, rngs)

  def __call__(self, x: jax.Array, mask: jax.Array, keys: _Keys) -> jax.Array:
    p = self.cfg.hidden_dropout
    a = self.attention(x, mask, keys)
    if self.cfg.model_type != "distilbert":  # HF DistilBERT's block drops no attention output
      a = _dropout(a, p, keys())
    x = self.attention_norm(x + a)
    y = self.ffn_out(jax.nn.gelu(self.ffn_in(x), approximate=False))
    return self.output_norm(x + _dropout(y, p, keys()))


class Encoder(QueryHead, nnx.Module):
  """E(x): token ids (B, T) -> embeddings (B, d) float32 (a `QueryEncoder`)."""

  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    init = nnx.initializers.normal(0.02)
    self.word_embeddings = nnx.Embed(
      cfg.vocab_size, cfg.hidden_size, embedding_init=init, rngs=rngs
    )
    self.position_embeddings = nnx.Embed(
      cfg.max_position, cfg.hidden_size, embedding_init=init, rngs=rngs
    )
    if cfg.type_vocab_size:
      self.token_type_embeddings = nnx.Embed(
        cfg.type_vocab_size, cfg.hidden_size, embedding_init=init, rngs=rngs
      )
    self.embedding_norm = _layer_norm(cfg.hidden_size, cfg, rngs)
    self.layers = nnx.List([TransformerLayer(cfg, rngs) for _ in range(cfg.num_layers)])
    if cfg.bottleneck_dim:
      self.bottleneck = _linear(cfg.hidden_size, cfg.bottleneck_dim, cfg, rngs, bias=False)

  def token_states(
    self, input_ids: jax.Array, dropout_key: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """Last hidden states (B, T, hidden) and the attention mask (B, T)."""
    cfg = self.cfg
    keys = _Keys(dropout_key)
    mask = input_ids != cfg.pad_token_id
    t = input_ids.shape[1]
    if t > cfg.max_position:
      raise ValueError(f"sequence length {t} exceeds max_position {cfg.max_position}")
    x = self.word_embeddings(input_ids) + self.position_embeddings(jnp.arange(t))[None]
    if cfg.type_vocab_size:
      x = x + self.token_type_embeddings(jnp.zeros_like(input_ids))
    x = _dropout(self.embedding_norm(x.astype(_DTYPES[cfg.dtype])), cfg.hidden_dropout, keys())
    for layer in self.layers:
      x = layer(x, mask, keys)
    return x, mask
