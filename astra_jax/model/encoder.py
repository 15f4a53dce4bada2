"""BERT / DistilBERT query encoder in Flax NNX, built from a HuggingFace `config.json`.

Both architectures are the same post-LayerNorm transformer; they differ in parameter names
(handled by `weights.py`), DistilBERT has no token-type embeddings. The sentence embedding
is the mean of the last hidden states over the attention mask (as sentence-transformers
does), optionally followed by a bias-free bottleneck to `bottleneck_dim` (Renée/ASTRA use
d=64 for very large L) and by the paper's high `embedding_dropout` (0.7-0.85): that is the
dropout the appendix table tunes, applied to the embedding the classifiers see. Dropout
takes an explicit PRNG key, so a train step is a pure function of (params, batch, key).

Dropout masks come from a counter-based hash of (key, element index) rather than
`jax.random.bernoulli`: threefry costs about 10 ns per element on XLA:CPU (0.3-0.4 s of a
4 s MiniLM step at batch 256 x 32, where the masks cover 60M elements), while the hash fuses
into the masked op (see `dropout_mask`). LayerNorm is written out (two-pass variance in
fp32) rather than nnx.LayerNorm, whose broadcast scale XLA:CPU materialises per call.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from astra_jax.model.encoder_config import EncoderConfig  # noqa: F401 (re-exported)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _fmix32(h: jax.Array) -> jax.Array:
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
  h = _fmix32(_fmix32((index * jnp.uint32(0x9E3779B9)) ^ s[0]) + s[1])
  threshold = min(round(rate * 2.0 ** 32), 2 ** 32 - 1)
  return h >= jnp.uint32(threshold), 1.0 - threshold / 2.0 ** 32


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if key is None or rate <= 0.0:
    return x
  keep, p = dropout_mask(key, rate, x.shape)
  return jnp.where(keep, x * jnp.asarray(1.0 / p, x.dtype), jnp.zeros_like(x))


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
  return nnx.Linear(cin, cout, use_bias=bias, dtype=_DTYPES[cfg.dtype],
                    kernel_init=nnx.initializers.normal(0.02), rngs=rngs)


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


class Encoder(nnx.Module):
  """E(x): token ids (B, T) -> embeddings (B, d) float32."""

  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    init = nnx.initializers.normal(0.02)
    self.word_embeddings = nnx.Embed(cfg.vocab_size, cfg.hidden_size, embedding_init=init, rngs=rngs)
    self.position_embeddings = nnx.Embed(cfg.max_position, cfg.hidden_size, embedding_init=init,
                                         rngs=rngs)
    if cfg.type_vocab_size:
      self.token_type_embeddings = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size,
                                             embedding_init=init, rngs=rngs)
    self.embedding_norm = _layer_norm(cfg.hidden_size, cfg, rngs)
    self.layers = nnx.List([TransformerLayer(cfg, rngs) for _ in range(cfg.num_layers)])
    if cfg.bottleneck_dim:
      self.bottleneck = _linear(cfg.hidden_size, cfg.bottleneck_dim, cfg, rngs, bias=False)

  def token_states(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """Last hidden states (B, T, hidden)."""
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
    return x

  def pooled(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """Mean-pooled (over non-pad tokens) embeddings before the embedding dropout, (B, d)."""
    mask = (input_ids != self.cfg.pad_token_id)[..., None].astype(jnp.float32)
    states = self.token_states(input_ids, dropout_key).astype(jnp.float32)
    pooled = (states * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)
    if self.cfg.bottleneck_dim:
      pooled = self.bottleneck(pooled).astype(jnp.float32)
    return pooled

  def embedding_dropout(self, pooled: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, 2**31 - 1)
    return _dropout(pooled, self.cfg.embedding_dropout, key)

  def __call__(self, input_ids: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """E(x): (B, d) float32. `dropout_key=None` means evaluation (no dropout)."""
    return self.embedding_dropout(self.pooled(input_ids, dropout_key), dropout_key)
