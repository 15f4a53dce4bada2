"""An independent numpy forward pass of HF BERT / DistilBERT checkpoints, straight from
the safetensors names (no flax, no jax), used as the truth for our encoder."""

import math

import numpy as np


def _ln(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
  erf = np.vectorize(math.erf)
  return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _lin(t, name, x):
  return x @ t[name + ".weight"].T + t[name + ".bias"]


def forward(t: dict, cfg: dict, ids: np.ndarray, pad_id: int = 0) -> np.ndarray:
  """Mean-pooled last hidden states (B, H) in float64."""
  t = {
    k.split("bert.")[-1] if k.startswith(("bert.", "distilbert.")) else k: v.astype(np.float64)
    for k, v in t.items()
  }
  distil = cfg.get("model_type") == "distilbert"
  H = cfg["dim"] if distil else cfg["hidden_size"]
  nh = cfg["n_heads"] if distil else cfg["num_attention_heads"]
  nl = cfg["n_layers"] if distil else cfg["num_hidden_layers"]
  eps = 1e-12 if distil else cfg.get("layer_norm_eps", 1e-12)
  B, T = ids.shape
  mask = ids != pad_id
  x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:T]
  if not distil:
    x = x + t["embeddings.token_type_embeddings.weight"][0]
  x = _ln(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
  for i in range(nl):
    if distil:
      p = f"transformer.layer.{i}."
      q, k, v, o = (p + "attention." + n for n in ("q_lin", "k_lin", "v_lin", "out_lin"))
      ln1, ln2 = p + "sa_layer_norm", p + "output_layer_norm"
      f1, f2 = p + "ffn.lin1", p + "ffn.lin2"
    else:
      p = f"encoder.layer.{i}."
      q, k, v = (p + "attention.self." + n for n in ("query", "key", "value"))
      o, ln1 = p + "attention.output.dense", p + "attention.output.LayerNorm"
      f1, f2, ln2 = p + "intermediate.dense", p + "output.dense", p + "output.LayerNorm"
    hd = H // nh
    heads = lambda y, hd=hd: y.reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
    s = heads(_lin(t, q, x)) @ heads(_lin(t, k, x)).transpose(0, 1, 3, 2) / math.sqrt(hd)
    s = np.where(mask[:, None, None, :], s, -1e30)
    s = np.exp(s - s.max(-1, keepdims=True))
    s = s / s.sum(-1, keepdims=True)
    ctx = (s @ heads(_lin(t, v, x))).transpose(0, 2, 1, 3).reshape(B, T, H)
    x = _ln(x + _lin(t, o, ctx), t[ln1 + ".weight"], t[ln1 + ".bias"], eps)
    x = _ln(x + _lin(t, f2, _gelu(_lin(t, f1, x))), t[ln2 + ".weight"], t[ln2 + ".bias"], eps)
  m = mask[..., None].astype(np.float64)
  return (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
