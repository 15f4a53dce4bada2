"""The paper's encoder or a loud error: a paper config never trains another encoder silently,
a model directory without weights is an error unless load_weights=False, and results.json's
record of the encoder (name, parameters, sha256 of the weights)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from astra_jax.config import base as config_base
from astra_jax.model import encoder_source
from astra_jax.runtime.errors import InputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_CONFIG = "experiments/lf_amazontitles_131k.py"
DISTILBERT = {
  "model_type": "distilbert",
  "dim": 768,
  "n_layers": 6,
  "n_heads": 12,
  "hidden_dim": 3072,
  "vocab_size": 30522,
  "max_position_embeddings": 512,
}


def _paper_config(models_dir, monkeypatch):
  monkeypatch.setenv("ASTRA_MODELS_DIR", str(models_dir))
  return config_base.load_config(os.path.join(REPO, PAPER_CONFIG))


def test_paper_config_without_its_encoder_stops_with_one_line(tmp_path):
  models = tmp_path / "models"
  models.mkdir()
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.main",
      f"--config={PAPER_CONFIG}",
      f"--workdir={tmp_path / 'wd'}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, "ASTRA_MODELS_DIR": str(models)},
  )
  assert r.returncode != 0
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
  msg = errors[0]
  for part in (
    str(models / "msmarco-distilbert-base-v4"),
    "config.json",
    "model.safetensors",
    "tokenizer",
    "safe_serialization=True",
    "--config.encoder.hf_dir=all-MiniLM-L6-v2",
  ):
    assert part in msg, part
  assert not (tmp_path / "wd" / "results.json").exists()


def test_minilm_only_when_asked(tmp_path, monkeypatch):
  c = _paper_config(tmp_path, monkeypatch)
  assert c.encoder.hf_dir == str(tmp_path / "msmarco-distilbert-base-v4")
  with pytest.raises(InputError, match="the paper's encoder"):
    config_base.check_inputs(c)
  c.encoder.hf_dir = "all-MiniLM-L6-v2"  # the explicit override; the tokenizer follows
  assert c.data.tokenizer_dir == "all-MiniLM-L6-v2"
  encoder_source.check(c.encoder)
  config_base.validate(c)


def test_config_without_weights_is_an_error_unless_load_weights_false(tmp_path, monkeypatch):
  enc = tmp_path / "msmarco-distilbert-base-v4"
  enc.mkdir()
  (enc / "config.json").write_text(json.dumps(DISTILBERT))
  c = _paper_config(tmp_path, monkeypatch)
  with pytest.raises(
    InputError,
    match=r"has config.json but no model.safetensors.*"
    r"--config.encoder.load_weights=False",
  ):
    config_base.check_inputs(c)
  c.encoder.load_weights = False
  encoder_source.check(c.encoder)
  config_base.validate(c)
  assert encoder_source.identity(c.encoder, 7).weights_sha256 is None


def test_identity_records_the_weights_hash(tmp_path):
  import ml_collections

  (tmp_path / "config.json").write_text(json.dumps(DISTILBERT))
  weights = tmp_path / "model.safetensors"
  weights.write_bytes(b"not really weights, but bytes to hash")
  ec = ml_collections.ConfigDict({"hf_dir": str(tmp_path), "load_weights": True})
  got = encoder_source.identity(ec, 66_362_880)
  assert got.weights_sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
  assert (got.name, got.parameters) == (str(tmp_path), 66_362_880)
  # Rewritten (new size and mtime): hashed again, not served from the cache.
  weights.write_bytes(b"other bytes")
  os.utime(weights, ns=(1, 1))
  assert encoder_source.identity(ec, 1).weights_sha256 == hashlib.sha256(b"other bytes").hexdigest()
  tiny = ml_collections.ConfigDict({"hf_dir": "", "load_weights": True})
  assert encoder_source.identity(tiny, 5) == ("bert", "bert, randomly initialised", "", 5, None)
  # An n-gram bag reads no weights from hf_dir (only its tokenizer): it is named as what ran.
  bag = ml_collections.ConfigDict(
    {"arch": "ngram_bag", "hf_dir": str(tmp_path), "load_weights": True}
  )
  assert encoder_source.identity(bag, 3) == (
    "ngram_bag",
    "ngram_bag, randomly initialised",
    "",
    3,
    None,
  )
