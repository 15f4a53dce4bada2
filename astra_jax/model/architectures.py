"""The registry of encoder architectures, keyed on `config.encoder.arch`.

An architecture is a record of what the rest of the code needs to know about it: how to
read its shape from an experiment config, its shape's dataclass (stored in an exported
model's model.json), where its module lives, and its exact parameter count and
activation bytes for the memory planner. The module holds no jax, so the planner sizes an
encoder without starting a backend; `model/factory.py` builds the module.

What an encoder module must provide is `model/interface.py`'s `QueryEncoder`.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

from astra_jax.model import pretrained
from astra_jax.model.encoder_config import EncoderConfig
from astra_jax.model.ngram_bag_config import NgramBagConfig
from astra_jax.runtime.errors import InputError


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One encoder architecture.

  Attributes:
    name: the value of `config.encoder.arch` (and of model.json's `encoder_arch`).
    shape_cls: the frozen dataclass holding the encoder's shape.
    module: "package.module:Class" of the NNX module, imported when first built.
    shape_from_config: (experiment config, token vocabulary size, pad id) -> shape.
    param_count: shape -> exact number of parameters.
    activation_bytes: (shape, batch, tokens) -> (bytes kept for the backward pass, formula).
    loads_hf_weights: whether `encoder.hf_dir`'s model.safetensors can initialise it.
    lookup_table: the path of a parameter the encoder reads only by rows (an embedding
      table far larger than what a batch reads), whose module then offers
      `table_rows(input_ids) -> (rows, mask)` and `states_of_rows(rows, mask)`; () if none.
      `optim.encoder_table_update=rows` updates only the rows a step reads
      (training/table_rows.py).
  """

  name: str
  shape_cls: type
  module: str
  shape_from_config: Callable[[Any, int, int], Any]
  param_count: Callable[[Any], int]
  activation_bytes: Callable[[Any, int, int], tuple[int, str]]
  loads_hf_weights: bool = False
  lookup_table: tuple[str, ...] = ()

  def module_class(self) -> type:
    module, cls = self.module.split(":")
    return getattr(importlib.import_module(module), cls)


_REGISTRY: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
  """Adds `arch` (a name registered twice is an error)."""
  if arch.name in _REGISTRY:
    raise ValueError(f"encoder architecture {arch.name!r} is already registered")
  _REGISTRY[arch.name] = arch
  return arch


def names() -> tuple[str, ...]:
  return tuple(_REGISTRY)


def get(name: str) -> Architecture:
  """The architecture `config.encoder.arch` names; an InputError naming the choices else."""
  if name not in _REGISTRY:
    raise InputError(f"config.encoder.arch={name!r}: unknown; choose one of {', '.join(_REGISTRY)}")
  return _REGISTRY[name]


def of_shape(shape) -> Architecture:
  """The architecture whose shape dataclass `shape` is."""
  for arch in _REGISTRY.values():
    if isinstance(shape, arch.shape_cls):
      return arch
  raise TypeError(f"no encoder architecture has the shape {type(shape).__name__}")


def shape_from_config(config, vocab_size: int, pad_id: int):
  """The shape `config.encoder` describes, for a tokenizer of `vocab_size` ids.

  Args:
    config: the experiment config.
    vocab_size: the token vocabulary's size (ids are below it).
    pad_id: the padding token's id (the attention mask is ids != pad_id).
  Returns:
    The architecture's shape dataclass.
  Raises:
    InputError: an unknown architecture or a shape the data cannot use.
  """
  return get(config.encoder.get("arch", "bert")).shape_from_config(config, vocab_size, pad_id)


# ------------------------------------------------------------------------------ BERT
def _bert_shape(config, vocab_size: int, pad_id: int) -> EncoderConfig:
  ec = config.encoder
  common = dict(
    bottleneck_dim=ec.bottleneck_dim, embedding_dropout=ec.embedding_dropout, dtype=ec.dtype
  )
  hf_dir = pretrained.resolve(ec.hf_dir) if ec.hf_dir else ""
  if hf_dir:
    cfg = EncoderConfig.from_hf(hf_dir, **common)
    if cfg.vocab_size < vocab_size:
      raise InputError(
        f"{hf_dir}/config.json: vocab_size {cfg.vocab_size} is smaller than "
        f"the tokenizer's {vocab_size}"
      )
  else:
    cfg = EncoderConfig(
      vocab_size=vocab_size,
      hidden_size=ec.hidden_size,
      num_layers=ec.num_layers,
      num_heads=ec.num_heads,
      intermediate_size=ec.intermediate_size,
      max_position=max(512, config.data.max_len),
      pad_token_id=pad_id,
      hidden_dropout=ec.hidden_dropout,
      attention_dropout=ec.hidden_dropout,
      **common,
    )
  if config.data.max_len > cfg.max_position:
    raise InputError(
      f"config.data.max_len={config.data.max_len} exceeds the encoder's "
      f"max_position_embeddings={cfg.max_position}"
    )
  return cfg


def bert_param_count(e: EncoderConfig) -> int:
  """Parameters of astra_jax.model.encoder.Encoder(e), exactly."""
  H, I = e.hidden_size, e.intermediate_size
  embeddings = (e.vocab_size + e.max_position + e.type_vocab_size) * H + 2 * H  # + LayerNorm
  layer = (
    4 * (H * H + H)  # query, key, value, out (with biases)
    + 2 * H  # attention LayerNorm
    + H * I
    + I  # ffn_in
    + I * H
    + H  # ffn_out
    + 2 * H
  )  # output LayerNorm
  return embeddings + e.num_layers * layer + H * e.bottleneck_dim  # bias-free bottleneck


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# XLA keeps more than the minimal set of activations counted below (see
# bert_activation_bytes; the CPU measurements behind the factor: docs/results/planner.md).
XLA_OVERHEAD = 1.25


def bert_activation_bytes(e: EncoderConfig, b: int, T: int) -> tuple[int, str]:
  """Bytes the encoder keeps for its backward pass on b queries of T tokens.

  s = bytes per element of the compute dtype; masks are 1 byte; LayerNorm statistics and
  the exact GELU's erf term are fp32. Per layer, what autodiff keeps:
    b T H (8 s + 10): layer input, q, k, v, attention context, two dropout masks, two
                      LayerNorm inputs and normalised values (fp32), the attention
                      LayerNorm's output (the FFN's input)
    b T I (2 s + 4):  FFN pre-GELU, erf term, post-GELU
    b nh T^2 (9 + s): attention logits and softmax output (fp32), dropout mask, dropped
                      probabilities in the compute dtype
  Plus the embeddings (b T H (s + 1)) and the pooling (b T H 4), one more layer's worth for
  the backward pass's own temporaries, all times XLA_OVERHEAD: XLA keeps more than this
  minimal set, more with more layers (tests/test_plan.py checks the plan stays above XLA's
  temporaries on CPU; docs/results/planner.md). On a GPU, fusion usually keeps less."""
  s = DTYPE_BYTES[e.dtype]
  H, I, nh = e.hidden_size, e.intermediate_size, e.num_heads
  per_layer = b * T * H * (8 * s + 10) + b * T * I * (2 * s + 4) + b * nh * T * T * (9 + s)
  total = (e.num_layers + 1) * per_layer + b * T * H * (s + 1) + b * T * H * 4
  return int(XLA_OVERHEAD * total), (
    f"{XLA_OVERHEAD} x [(layers + 1) x (b T H (8s+10) + b T I (2s+4) + b nh T^2 (9+s)) "
    f"+ b T H (s+5)]; b={b}, T={T}, s={s}"
  )


BERT = register(
  Architecture(
    name="bert",
    shape_cls=EncoderConfig,
    module="astra_jax.model.encoder:Encoder",
    shape_from_config=_bert_shape,
    param_count=bert_param_count,
    activation_bytes=bert_activation_bytes,
    loads_hf_weights=True,
  )
)


# ------------------------------------------------------------------------ n-gram bag
def _ngram_bag_shape(config, vocab_size: int, pad_id: int) -> NgramBagConfig:
  ec = config.encoder
  if ec.hf_dir:
    raise InputError(
      f"config.encoder.hf_dir={ec.hf_dir!r}: the ngram_bag encoder has no "
      f"pretrained weights; set the tokenizer with config.data.tokenizer_dir"
    )
  return NgramBagConfig(
    hidden_size=ec.hidden_size,
    hash_buckets=ngram_hash_buckets(ec.ngram, vocab_size),
    ngram_orders=ec.ngram.orders,
    pad_token_id=pad_id,
    bottleneck_dim=ec.bottleneck_dim,
    embedding_dropout=ec.embedding_dropout,
    normalize_scale=ec.ngram.normalize_scale,
    dtype=ec.dtype,
  )


def ngram_hash_buckets(ngram_cfg, vocab_size: int) -> int:
  """The n-gram bag's table size: `hash_buckets`, or with `buckets_per_token` > 0 the
  power of two >= buckets_per_token x vocab_size if that is larger.

  Args:
    ngram_cfg: `config.encoder.ngram`.
    vocab_size: the tokenizer's vocabulary size.
  Returns:
    The number of hash buckets.
  """
  wanted = ngram_cfg.get("buckets_per_token", 0) * vocab_size
  return max(ngram_cfg.hash_buckets, 1 << max(0, math.ceil(wanted) - 1).bit_length())


def ngram_bag_param_count(e: NgramBagConfig) -> int:
  """Parameters of astra_jax.model.ngram_bag.NgramBagEncoder(e), exactly."""
  return e.hash_buckets * e.hidden_size + e.hidden_size * e.bottleneck_dim


def ngram_bag_activation_bytes(e: NgramBagConfig, b: int, T: int) -> tuple[int, str]:
  """Bytes kept for the backward pass: the gathered n-gram vectors (b, n T, H) in fp32 and
  their bucket ids and mask, times XLA_OVERHEAD."""
  grams = b * T * e.ngram_orders
  total = grams * (4 * e.hidden_size + 5)
  return int(XLA_OVERHEAD * total), (
    f"{XLA_OVERHEAD} x b T n (4 H + 5); b={b}, T={T}, n={e.ngram_orders}"
  )


NGRAM_BAG = register(
  Architecture(
    name="ngram_bag",
    shape_cls=NgramBagConfig,
    module="astra_jax.model.ngram_bag:NgramBagEncoder",
    shape_from_config=_ngram_bag_shape,
    param_count=ngram_bag_param_count,
    activation_bytes=ngram_bag_activation_bytes,
    lookup_table=("ngram_embeddings", "embedding"),
  )
)


def shape_from_json(meta: dict):
  """The shape an exported model.json stores (`encoder_arch` absent: BERT, the only
  architecture models were exported with before the registry)."""
  arch = get(meta.get("encoder_arch", "bert"))
  return arch.shape_cls(**meta["encoder"])


def describe(shape) -> str:
  """One line for logs: the architecture and its size."""
  arch = of_shape(shape)
  return f"{arch.name} ({arch.param_count(shape):,} parameters, d={shape.embed_dim})"
