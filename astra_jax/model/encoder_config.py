"""The encoder's shape (BERT / DistilBERT), read from a HuggingFace `config.json`.

Kept apart from `encoder.py` and free of jax, so the memory planner (`astra_jax/plan/`) can
size an encoder without starting a jax backend.
"""

from __future__ import annotations

import dataclasses
import json
import os

from astra_jax.runtime.errors import InputError


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  model_type: str = "bert"  # "bert" or "distilbert"
  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_position: int = 512
  type_vocab_size: int = 2  # 0 for DistilBERT
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  pad_token_id: int = 0
  bottleneck_dim: int = 0  # 0: no bottleneck, d = hidden_size
  embedding_dropout: float = 0.0  # dropout on the pooled embedding (the paper's "dropout")
  dtype: str = "float32"  # compute dtype; parameters stay float32

  @property
  def embed_dim(self) -> int:
    return self.bottleneck_dim or self.hidden_size

  def train_step_gflop(self, batch_size: int, seq_len: int) -> float:
    """Model GFLOP of one forward + backward (3 x forward), matmuls only: per layer Q, K, V, O
    and the two FFN matmuls over B*T tokens, QK^T and PV; plus the bottleneck when there
    is one. Layer norms, softmax, GELU, the embedding lookup and the optimizer are not
    counted (the convention of MFU figures)."""
    b, t, h, i = batch_size, seq_len, self.hidden_size, self.intermediate_size
    n = b * t
    fwd = self.num_layers * (2 * n * 4 * h * h + 2 * n * 2 * h * i + 2 * 2 * b * t * t * h)
    if self.bottleneck_dim:
      fwd += 2 * b * h * self.bottleneck_dim
    return 3 * fwd / 1e9

  @staticmethod
  def from_hf(config: str | dict, **overrides) -> EncoderConfig:
    """From a HF config.json path/dict (BERT or DistilBERT keys)."""
    if isinstance(config, (str, os.PathLike)):
      path = os.path.join(config, "config.json") if os.path.isdir(config) else config
      try:
        with open(path) as f:
          config = json.load(f)
      except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read encoder config: {e}") from e
    mt = config.get("model_type", "bert")
    if mt == "distilbert":
      kw = dict(
        model_type=mt,
        vocab_size=config["vocab_size"],
        hidden_size=config["dim"],
        num_layers=config["n_layers"],
        num_heads=config["n_heads"],
        intermediate_size=config["hidden_dim"],
        max_position=config.get("max_position_embeddings", 512),
        type_vocab_size=0,
        layer_norm_eps=1e-12,
        hidden_dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.1),
        pad_token_id=config.get("pad_token_id", 0),
      )
      if config.get("activation", "gelu") != "gelu" or config.get("sinusoidal_pos_embds"):
        raise InputError("only gelu DistilBERT with learned position embeddings is supported")
    elif mt in ("bert", "roberta", "xlm-roberta") or "hidden_size" in config:
      if config.get("hidden_act", "gelu") != "gelu":
        raise InputError(f"hidden_act {config.get('hidden_act')!r} not supported (gelu only)")
      if mt != "bert":
        raise InputError(f"model_type {mt!r} not supported; use bert or distilbert")
      kw = dict(
        model_type="bert",
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        intermediate_size=config["intermediate_size"],
        max_position=config.get("max_position_embeddings", 512),
        type_vocab_size=config.get("type_vocab_size", 2),
        layer_norm_eps=config.get("layer_norm_eps", 1e-12),
        hidden_dropout=config.get("hidden_dropout_prob", 0.1),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        pad_token_id=config.get("pad_token_id", 0),
      )
    else:
      raise InputError(f"model_type {mt!r} not supported; use bert or distilbert")
    kw.update(overrides)
    return EncoderConfig(**kw)
