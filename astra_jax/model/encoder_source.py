"""Which encoder a config trains, checked before anything runs, and what identifies it.

A paper config names the paper's encoder (`encoder.paper_encoder`) and looks for it in
`$ASTRA_MODELS_DIR/<its last path part>` (default `models/`); nothing is downloaded at run
time. If that directory is missing, training stops with one `error:` line that says what
goes there, how to convert a PyTorch checkpoint, and the override that trains the installed
all-MiniLM-L6-v2 instead: a different encoder (d = 384, 6 layers) is never chosen silently.
A directory with config.json but no model.safetensors is an error too, unless
`encoder.load_weights=False` asks for a randomly initialised encoder of that shape.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import NamedTuple

from astra_jax.model import architectures, pretrained
from astra_jax.runtime.errors import InputError

MODELS_DIR_ENV = "ASTRA_MODELS_DIR"
MINILM = "all-MiniLM-L6-v2"
WEIGHTS_FILE = "model.safetensors"
# How a PyTorch checkpoint becomes model.safetensors (docs/datasets.md, "The paper's
# datasets", shows the same conversion with torch and safetensors).
CONVERT_HINT = (
  'python -c "from transformers import AutoModel; '
  "AutoModel.from_pretrained('DIR').save_pretrained('DIR', "
  'safe_serialization=True)" (DIR holding pytorch_model.bin and config.json)'
)


class EncoderIdentity(NamedTuple):
  """What results.json records about the trained encoder."""

  architecture: str  # the registered architecture that ran (config.encoder.arch)
  name: str  # encoder.hf_dir as configured, or "<architecture>, randomly initialised"
  directory: str  # where its config.json (and weights) were read; "" if none
  parameters: int  # trainable parameters, bottleneck included
  weights_sha256: str | None  # of the loaded weights file; None when randomly initialised


def local_encoder_dir(name: str) -> str:
  """`$ASTRA_MODELS_DIR/<last path part of name>` (default models/)."""
  return os.path.join(os.environ.get(MODELS_DIR_ENV, "models"), name.rstrip("/").split("/")[-1])


def missing_paper_encoder_message(paper_encoder: str, directory: str) -> str:
  return (
    f"config.encoder.hf_dir: the paper's encoder {paper_encoder} is not in "
    f"{directory} (${MODELS_DIR_ENV}/<name>, default models/): put its config.json, "
    f"{WEIGHTS_FILE} and tokenizer files (tokenizer.json or vocab.txt) there (a PyTorch "
    f"checkpoint converts with {CONVERT_HINT}), or pass "
    f"--config.encoder.hf_dir={MINILM} to train the installed {MINILM} instead "
    f"(d = 384, 6 layers: not the paper's encoder)"
  )


def check(encoder_cfg) -> None:
  """Raises InputError unless the configured encoder can be built as asked.

  Args:
    encoder_cfg: config.encoder (hf_dir, load_weights, and paper_encoder if a paper config).
  """
  if not encoder_cfg.hf_dir:
    return  # the tiny random BERT
  hf_dir = pretrained.resolve(encoder_cfg.hf_dir)
  if not os.path.exists(os.path.join(hf_dir, "config.json")):
    paper = encoder_cfg.get("paper_encoder", "")
    if paper and os.path.abspath(hf_dir) == os.path.abspath(local_encoder_dir(paper)):
      raise InputError(missing_paper_encoder_message(paper, hf_dir))
    raise InputError(f"config.encoder.hf_dir: {hf_dir}/config.json does not exist")
  if encoder_cfg.load_weights and not os.path.exists(os.path.join(hf_dir, WEIGHTS_FILE)):
    raise InputError(
      f"config.encoder.hf_dir: {hf_dir} has config.json but no {WEIGHTS_FILE}: "
      f"put the weights there (a PyTorch checkpoint converts with "
      f"{CONVERT_HINT}), or pass --config.encoder.load_weights=False to train "
      f"a randomly initialised encoder of that shape"
    )


def weights_sha256(path: str) -> str:
  """sha256 of a weights file, computed once per (path, size, mtime) in this process."""
  st = os.stat(path)
  return _sha256(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # the cache key: a rewritten file is hashed again
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  return h.hexdigest()


def identity(encoder_cfg, parameters: int) -> EncoderIdentity:
  """The record of the encoder `check` accepted and factory.build_encoder built."""
  arch = encoder_cfg.get("arch", "bert")
  if not encoder_cfg.hf_dir or not architectures.get(arch).loads_hf_weights:
    return EncoderIdentity(
      architecture=arch,
      name=f"{arch}, randomly initialised",
      directory="",
      parameters=parameters,
      weights_sha256=None,
    )
  hf_dir = pretrained.resolve(encoder_cfg.hf_dir)
  weights = os.path.join(hf_dir, WEIGHTS_FILE)
  loaded = encoder_cfg.load_weights and os.path.exists(weights)
  return EncoderIdentity(
    architecture=arch,
    name=encoder_cfg.hf_dir,
    directory=os.path.abspath(hf_dir),
    parameters=parameters,
    weights_sha256=weights_sha256(weights) if loaded else None,
  )
