"""The default configuration every experiment starts from, and its validation.

Experiments (`experiments/*.py`) call `base_config()` and change what differs; any field
can be overridden on the command line (`--config.train.epochs=3`); an unknown key is an
error from ml_collections that names it.
"""

from __future__ import annotations

import importlib.util

import ml_collections

from astra_jax.config import data, evaluation, model, negatives, training
from astra_jax.data import dataset
from astra_jax.model import encoder_source
from astra_jax.runtime.errors import InputError

# The config's sections, each module with its fields' defaults and their validation.
SECTIONS = (data, model, negatives, training, evaluation)


def base_config() -> ml_collections.ConfigDict:
  """The defaults every experiment starts from (each section's module documents its
  fields)."""
  c = ml_collections.ConfigDict()
  for section in SECTIONS:
    section.add_defaults(c)
  return c


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field, section by section (the fields alone:
  `check_inputs` looks for the files they name)."""
  for section in SECTIONS:
    section.validate(c)


def check_inputs(c: ml_collections.ConfigDict) -> None:
  """Raises one InputError naming everything a run needs and lacks: the dataset's files
  (unless the synthetic stand-in generates them) and the encoder's files, each with what
  to do about it."""
  missing = [] if c.data.synthetic.enabled else dataset.missing_files(c.data)
  try:
    encoder_source.check(c.encoder)
  except InputError as e:
    missing.append(str(e))
  if len(missing) == 1:
    raise InputError(missing[0])
  if missing:  # one line, as every user error is
    raise InputError(
      f"{len(missing)} inputs are missing: "
      + " ".join(f"[{i}] {m}" for i, m in enumerate(missing, 1))
    )


def with_overrides(c: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
  """`c` with each dotted key of `overrides` ("train.epochs") set to its value, in place;
  returns `c`."""
  for key, value in overrides.items():
    *path, leaf = key.split(".")
    node = c
    for part in path:
      node = node[part]
    node[leaf] = value
  return c


def load_config(path: str, variant: str | None = None) -> ml_collections.ConfigDict:
  """An experiment file's `get_config()` (`get_config(variant)` for `--config=PATH:VARIANT`),
  outside absl's --config flag."""
  spec = importlib.util.spec_from_file_location("_astra_experiment", path)
  if spec is None:
    raise InputError(f"{path}: not a Python config file")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if variant is None else module.get_config(variant)
