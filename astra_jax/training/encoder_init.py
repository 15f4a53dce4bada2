"""The encoder a run starts from: `model.factory`'s (pretrained or random), then, with
`encoder.init_from_workdir`, a finished run's exported encoder weights."""

from __future__ import annotations

import os

import jax.numpy as jnp
from absl import logging
from flax import nnx

from astra_jax.model.factory import build_encoder
from astra_jax.model.interface import QueryEncoder
from astra_jax.runtime.errors import InputError
from astra_jax.serving.export import load_model


def start_encoder(config, vocab_size: int, pad_id: int, seed: int) -> QueryEncoder:
  """The encoder `config.encoder` describes, with the weights the run starts from.

  Args:
    config: the experiment config.
    vocab_size: the tokenizer's vocabulary size.
    pad_id: the tokenizer's padding id.
    seed: the random init's seed.
  Returns:
    `factory.build_encoder`'s encoder, then `encoder.init_from_workdir`'s weights when set.
  Raises:
    InputError: as `build_encoder`, or an exported model missing or of another shape.
  """
  model = build_encoder(config, vocab_size, pad_id, seed)
  source = config.encoder.get("init_from_workdir", "") or config.train.get("init_from", "")
  if source:
    init_from_exported(model, source)
  return model


def init_from_exported(model: QueryEncoder, workdir: str) -> None:
  """Copies the encoder weights of WORKDIR/model (export.py) into `model`.

  Args:
    model: the encoder the config built.
    workdir: a finished run's workdir (`encoder.init_from_workdir`).
  Raises:
    InputError: no exported model there, or its encoder has another shape.
  """

  exported = load_model(workdir)
  ours = nnx.state(model, nnx.Param)
  theirs = dict(nnx.to_flat_state(exported.encoder_params))
  for path, var in nnx.to_flat_state(ours):
    got = theirs.get(path)
    if got is None or tuple(got.shape) != tuple(var.shape):
      raise InputError(
        f"config.encoder.init_from_workdir={workdir}: its encoder's "
        f"{'/'.join(map(str, path))} is "
        f"{'missing' if got is None else tuple(got.shape)}, this config's is "
        f"{tuple(var.shape)}; give the encoder that run's shape"
      )
    var.set_value(jnp.asarray(got.get_value(), var.dtype))
  nnx.update(model, ours)
  logging.info("encoder initialised from %s", os.path.join(workdir, "model"))
