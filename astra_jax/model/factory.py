"""Builds the encoder `config.encoder` describes (the architecture registry's module),
with its starting weights: a pretrained checkpoint, or random."""

from __future__ import annotations

import os

from absl import logging
from flax import nnx

from astra_jax.model import architectures, encoder_source, pretrained
from astra_jax.model.interface import QueryEncoder
from astra_jax.model.weights import load_hf_weights


def encoder_for_shape(shape, seed: int = 0) -> QueryEncoder:
  """A randomly initialised encoder of `shape` (any registered architecture's shape)."""
  cls = architectures.of_shape(shape).module_class()
  return cls(shape, nnx.Rngs(params=seed))


def build_encoder(config, vocab_size: int, pad_id: int, seed: int) -> QueryEncoder:
  """The encoder `config.encoder` describes, with its starting weights.

  Args:
    config: the experiment config (`config.encoder.arch` picks the architecture).
    vocab_size: the tokenizer's vocabulary size.
    pad_id: the tokenizer's padding id.
    seed: the random init's seed.
  Returns:
    The encoder (a `QueryEncoder`), with `encoder.hf_dir`'s weights when the architecture
    loads them (`encoder.init_from_workdir` is training.encoder_init's, above the exported
    model's format).
  Raises:
    InputError: an unknown architecture, a shape the data cannot use, missing weights.
  """
  ec = config.encoder
  arch = architectures.get(ec.get("arch", "bert"))
  shape = arch.shape_from_config(config, vocab_size, pad_id)
  model = encoder_for_shape(shape, seed)
  if arch.loads_hf_weights:
    encoder_source.check(ec)  # weights missing: an error unless load_weights=False
    hf_dir = pretrained.resolve(ec.hf_dir) if ec.hf_dir else ""
    if hf_dir and ec.load_weights:
      weights = os.path.join(hf_dir, encoder_source.WEIGHTS_FILE)
      load_hf_weights(model, weights)
      logging.info("loaded encoder weights from %s", weights)
    elif hf_dir:
      logging.info("encoder.load_weights=False: %s randomly initialised", hf_dir)
  return model
