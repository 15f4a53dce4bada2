"""Loads HuggingFace BERT / DistilBERT `model.safetensors` into our NNX encoder (no torch).

torch Linear weights are (out, in); nnx.Linear kernels are (in, out): transposed here.
"""

from __future__ import annotations

import os
import re

import jax.numpy as jnp
from absl import logging
from flax import nnx

from astra_jax.model.encoder import Encoder
from astra_jax.runtime.errors import InputError

_BERT_LAYER = {
  "attention.query": "attention.self.query",
  "attention.key": "attention.self.key",
  "attention.value": "attention.self.value",
  "attention.out": "attention.output.dense",
  "attention_norm": "attention.output.LayerNorm",
  "ffn_in": "intermediate.dense",
  "ffn_out": "output.dense",
  "output_norm": "output.LayerNorm",
}
_DISTIL_LAYER = {
  "attention.query": "attention.q_lin",
  "attention.key": "attention.k_lin",
  "attention.value": "attention.v_lin",
  "attention.out": "attention.out_lin",
  "attention_norm": "sa_layer_norm",
  "ffn_in": "ffn.lin1",
  "ffn_out": "ffn.lin2",
  "output_norm": "output_layer_norm",
}
_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}


class WeightsError(InputError):
  pass


def hf_name(path: tuple, model_type: str) -> str | None:
  """Our parameter path -> the HF checkpoint key (None: not in HF checkpoints)."""
  parts = [str(p) for p in path]
  leaf, module = parts[-1], parts[:-1]
  if module[0] == "bottleneck":
    return None
  if module[0] == "layers":
    i, rest = module[1], ".".join(module[2:])
    table = _DISTIL_LAYER if model_type == "distilbert" else _BERT_LAYER
    stem = ("transformer.layer." if model_type == "distilbert" else "encoder.layer.") + i
    return f"{stem}.{table[rest]}.{_LEAF[leaf]}"
  emb = {
    "word_embeddings": "word_embeddings",
    "position_embeddings": "position_embeddings",
    "token_type_embeddings": "token_type_embeddings",
    "embedding_norm": "LayerNorm",
  }
  return f"embeddings.{emb[module[0]]}.{_LEAF[leaf]}"


def load_hf_weights(model: Encoder, path: str) -> None:
  """Copies weights from a `model.safetensors` (file or its directory) into `model`."""
  from safetensors.numpy import load_file

  if os.path.isdir(path):
    path = os.path.join(path, "model.safetensors")
  try:
    tensors = load_file(path)
  except Exception as e:  # safetensors raises its own error types for bad headers
    raise WeightsError(f"{path}: cannot read safetensors weights: {e}") from e
  # Strip the architecture prefix ("bert.", "distilbert.") and old gamma/beta names.
  clean = {}
  for k, v in tensors.items():
    k = re.sub(r"^(bert|distilbert|model)\.", "", k)
    k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
    k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
    clean[k] = v
  used = set()
  params = nnx.state(model, nnx.Param)
  for p, var in nnx.to_flat_state(params):
    name = hf_name(p, model.cfg.model_type)
    if name is None:
      continue
    if name not in clean:
      raise WeightsError(
        f"{path}: missing tensor {name!r} for parameter {'/'.join(map(str, p))} "
        f"(is config.json's model_type {model.cfg.model_type!r} right?)"
      )
    arr = clean[name]
    if p[-1] == "kernel":
      arr = arr.T
    if tuple(arr.shape) != tuple(var.shape):
      raise WeightsError(
        f"{path}: tensor {name!r} has shape {tuple(clean[name].shape)}, the "
        f"config wants {tuple(var.shape)} for {'/'.join(map(str, p))}"
      )
    var.set_value(jnp.asarray(arr, var.dtype))
    used.add(name)
  unused = sorted(set(clean) - used - {"embeddings.position_ids"})
  if unused:
    logging.info(
      "weights not used from %s: %s",
      path,
      ", ".join(unused[:8]) + (" ..." if len(unused) > 8 else ""),
    )
  nnx.update(model, params)
