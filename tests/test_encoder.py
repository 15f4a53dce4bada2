import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpy_bert
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from astra_jax.data.tokenize import load_tokenizer
from astra_jax.model.encoder import Encoder, EncoderConfig, dropout_mask
from astra_jax.model.weights import WeightsError, hf_name, load_hf_weights


@pytest.fixture(scope="module")
def minilm(minilm_dir):
  cfg = EncoderConfig.from_hf(minilm_dir)
  model = Encoder(cfg, nnx.Rngs(0))
  load_hf_weights(model, minilm_dir)
  return model, load_tokenizer(minilm_dir)


def _ids(tok, sentences, max_len=16):
  return np.asarray(
    tok(sentences, padding="max_length", max_length=max_len, truncation=True)["input_ids"], np.int32
  )


def test_minilm_matches_independent_numpy_forward(minilm, minilm_dir):
  model, tok = minilm
  ids = _ids(tok, ["extreme classification with millions of labels", "a short one"])
  ours = np.asarray(model(jnp.asarray(ids)))
  with open(os.path.join(minilm_dir, "config.json")) as f:
    cfg = json.load(f)
  ref = numpy_bert.forward(load_file(os.path.join(minilm_dir, "model.safetensors")), cfg, ids)
  np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=2e-5)


def test_minilm_model_card_similarity(minilm):
  # The sentence-transformers documentation's example for all-MiniLM-L6-v2:
  # model.similarity(...) -> [[1, 0.6660, 0.1046], [0.6660, 1, 0.1411], [0.1046, 0.1411, 1]]
  model, tok = minilm
  s = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
  e = np.asarray(model(jnp.asarray(_ids(tok, s))))
  e = e / np.linalg.norm(e, axis=1, keepdims=True)
  want = np.array([[1, 0.6660, 0.1046], [0.6660, 1, 0.1411], [0.1046, 0.1411, 1]])
  np.testing.assert_allclose(e @ e.T, want, atol=6e-5)


def test_padding_does_not_change_embedding(minilm):
  model, tok = minilm
  short = np.asarray(model(jnp.asarray(_ids(tok, ["hello world"], 8))))
  long = np.asarray(model(jnp.asarray(_ids(tok, ["hello world"], 24))))
  np.testing.assert_allclose(short, long, atol=1e-5)


def _tiny_distilbert(tmp_path):
  cfg = {
    "model_type": "distilbert",
    "vocab_size": 50,
    "dim": 16,
    "n_layers": 2,
    "n_heads": 2,
    "hidden_dim": 32,
    "max_position_embeddings": 20,
    "activation": "gelu",
    "pad_token_id": 0,
  }
  rng = np.random.default_rng(0)
  t = {
    "distilbert.embeddings.word_embeddings.weight": (50, 16),
    "distilbert.embeddings.position_embeddings.weight": (20, 16),
    "distilbert.embeddings.LayerNorm.weight": (16,),
    "distilbert.embeddings.LayerNorm.bias": (16,),
  }
  for i in range(2):
    p = f"distilbert.transformer.layer.{i}."
    for n in ("q_lin", "k_lin", "v_lin", "out_lin"):
      t[p + f"attention.{n}.weight"], t[p + f"attention.{n}.bias"] = (16, 16), (16,)
    t[p + "ffn.lin1.weight"], t[p + "ffn.lin1.bias"] = (32, 16), (32,)
    t[p + "ffn.lin2.weight"], t[p + "ffn.lin2.bias"] = (16, 32), (16,)
    for n in ("sa_layer_norm", "output_layer_norm"):
      t[p + n + ".weight"], t[p + n + ".bias"] = (16,), (16,)
  tensors = {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in t.items()}
  with open(tmp_path / "config.json", "w") as f:
    json.dump(cfg, f)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  return cfg, tensors


def test_distilbert_loads_and_matches_numpy(tmp_path):
  cfg, tensors = _tiny_distilbert(tmp_path)
  model = Encoder(EncoderConfig.from_hf(str(tmp_path)), nnx.Rngs(0))
  load_hf_weights(model, str(tmp_path))
  ids = np.array([[5, 7, 9, 11, 0, 0], [3, 4, 0, 0, 0, 0]], np.int32)
  np.testing.assert_allclose(
    np.asarray(model(jnp.asarray(ids))), numpy_bert.forward(tensors, cfg, ids), rtol=1e-4, atol=1e-5
  )


def test_weights_that_do_not_match_config_are_named(tmp_path):
  _tiny_distilbert(tmp_path)
  bad = EncoderConfig.from_hf(str(tmp_path), hidden_size=32, num_heads=2)
  with pytest.raises(
    WeightsError,
    match=r"model\.safetensors: tensor '.*' has shape \(16,\), "
    r"the config wants \(32,\)",
  ):
    load_hf_weights(Encoder(bad, nnx.Rngs(0)), str(tmp_path))
  (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
  with pytest.raises(WeightsError, match="cannot read"):
    load_hf_weights(Encoder(EncoderConfig.from_hf(str(tmp_path)), nnx.Rngs(0)), str(tmp_path))


def test_bottleneck_and_dropout():
  cfg = EncoderConfig(
    vocab_size=30,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    max_position=16,
    bottleneck_dim=4,
    embedding_dropout=0.5,
  )
  model = Encoder(cfg, nnx.Rngs(0))
  assert "bias" not in nnx.state(model.bottleneck, nnx.Param)
  ids = jnp.array([[1, 2, 3, 0]], jnp.int32)
  assert model(ids).shape == (1, 4)
  a, b = model(ids, dropout_key=jax.random.key(1)), model(ids, dropout_key=jax.random.key(2))
  assert not np.allclose(a, b)  # stochastic in training
  np.testing.assert_array_equal(model(ids), model(ids))  # deterministic in evaluation
  # Roughly half the pooled coordinates are dropped, the rest scaled by 1/(1-p) = 2.
  drops = [np.asarray(model(ids, dropout_key=jax.random.key(s))) for s in range(200)]
  zero_frac = np.mean([np.mean(x == 0) for x in drops])
  assert 0.4 < zero_frac < 0.6


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.85])
def test_dropout_mask_is_bernoulli(rate):
  """The hash masks behave as independent Bernoulli(1 - rate) draws: the keep rate, pairs of
  neighbouring elements along each axis, and the same element under two keys; each within
  6 standard deviations of the binomial count."""
  shape = (64, 48, 40)
  n = np.prod(shape)
  keep, p = dropout_mask(jax.random.key(0), rate, shape)
  keep = np.asarray(keep)
  assert abs(p - (1 - rate)) < 1e-9

  def close(observed, q, count):
    assert abs(observed - q) < 6 * np.sqrt(q * (1 - q) / count), (observed, q)

  close(keep.mean(), p, n)
  for axis in range(3):  # neighbours along each axis, incl. across row boundaries (flat)
    a = np.moveaxis(keep, axis, 0)
    close((a[1:] & a[:-1]).mean(), p * p, a[1:].size)
  flat = keep.reshape(-1)
  close((flat[1:] & flat[:-1]).mean(), p * p, n - 1)
  other = np.asarray(dropout_mask(jax.random.key(1), rate, shape)[0])
  close((keep & other).mean(), p * p, n)
  # A key is not a shifted copy of another key's stream.
  close((flat[1:] & other.reshape(-1)[:-1]).mean(), p * p, n - 1)


@pytest.mark.parametrize("model_type, hidden_sites", [("bert", 3), ("distilbert", 2)])
def test_dropout_sites_follow_hf(monkeypatch, model_type, hidden_sites):
  # One layer. HF BERT drops the embeddings, the attention output and the FFN output; HF
  # DistilBERT (TransformerBlock: sa_layer_norm(attention + x)) only the embeddings and the
  # FFN output. Both drop the attention probabilities.
  from astra_jax.model import encoder as encoder_lib

  calls = []
  real = encoder_lib._dropout
  monkeypatch.setattr(
    encoder_lib, "_dropout", lambda x, rate, key: calls.append((x.ndim, rate)) or real(x, rate, key)
  )
  cfg = EncoderConfig(
    vocab_size=30,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    max_position=16,
    model_type=model_type,
    hidden_dropout=0.1,
    attention_dropout=0.2,
    embedding_dropout=0.0,
  )
  Encoder(cfg, nnx.Rngs(0))(jnp.array([[1, 2, 3, 0]], jnp.int32), dropout_key=jax.random.key(0))
  assert calls.count((3, 0.1)) == hidden_sites and calls.count((4, 0.2)) == 1


def test_dropout_keeps_the_expectation():
  from astra_jax.model.encoder import _dropout

  x = jnp.full((200_000,), 3.0)
  y = np.asarray(_dropout(x, 0.3, jax.random.key(5)))
  assert set(np.unique(y)) <= {0.0, np.float32(3.0 / 0.7)}
  assert abs(y.mean() - 3.0) < 6 * 3.0 * np.sqrt(0.3 / 0.7 / x.size)


def test_train_step_flops_by_hand():
  """One layer, h=2, I=4, B=1, T=2: forward = 2*2*4*2^2 (Q,K,V,O) + 2*2*2*2*4 (FFN) +
  2*2*1*2^2*2 (QK^T, PV) = 160 FLOP, +2*1*2*3 = 12 with a bottleneck to 3; step = 3x."""
  cfg = EncoderConfig(hidden_size=2, intermediate_size=4, num_layers=1, num_heads=1)
  assert cfg.train_step_gflop(1, 2) * 1e9 == pytest.approx(480)
  assert cfg.__class__(**{**cfg.__dict__, "bottleneck_dim": 3}).train_step_gflop(
    1, 2
  ) * 1e9 == pytest.approx(516)
  # all-MiniLM-L6-v2 at 256 x 32 tokens: the 529 GFLOP of benchmarks/train_step.py.
  assert EncoderConfig().train_step_gflop(256, 32) == pytest.approx(529.086283776)


def test_every_parameter_has_an_hf_name():
  for model_type, cfg in (
    (
      "bert",
      EncoderConfig(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=8),
    ),
    (
      "distilbert",
      EncoderConfig(
        model_type="distilbert",
        vocab_size=10,
        hidden_size=8,
        num_layers=2,
        num_heads=2,
        intermediate_size=8,
        type_vocab_size=0,
      ),
    ),
  ):
    names = [
      hf_name(p, model_type)
      for p, _ in nnx.to_flat_state(nnx.state(Encoder(cfg, nnx.Rngs(0)), nnx.Param))
    ]
    assert len(set(names)) == len(names) and all(names)
