"""The few-shot update of a grown model: a short run from its export (`train.init_from`) on a
dataset that adds the new labels' training pairs, training what a setting says.

`python -m astra_jax.extend --train_data=DIR` runs it after growing, with the config of the
run the model came from; `reproduce --table=grow` chooses its setting on a validation split
(reproduce/few_shot_choice.py). Hard negatives are mined from the grown W before the first
step (negatives.tau_s = 0, a refresh every epoch); there is no warm start.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from astra_jax.config import base as config_base
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export
from astra_jax.training import run_config


@dataclasses.dataclass(frozen=True)
class FewShot:
  """One setting of the few-shot update: which parts train, and the learning rates (encoder's
  and classifier's) as a multiple of the config's."""

  name: str
  freeze_encoder: bool
  freeze_old_rows: bool
  lr_scale: float = 1.0

  def overrides(self, optim: ml_collections.ConfigDict) -> dict:
    """The config overrides of this setting, on a config whose optimizer is `optim`."""
    out = {
      "train.freeze_encoder": self.freeze_encoder,
      "train.freeze_old_rows": self.freeze_old_rows,
      "optim.encoder_lr": optim.encoder_lr * self.lr_scale,
      "optim.classifier_lr": optim.classifier_lr * self.lr_scale,
    }
    if self.freeze_old_rows:  # the decay would shrink the frozen rows
      out["optim.classifier_weight_decay"] = 0.0
    return out


# What `extend --update` may train, at the config's learning rates.
UPDATES = {
  u.name: u
  for u in (
    FewShot("new_rows", freeze_encoder=True, freeze_old_rows=True),
    FewShot("classifier", freeze_encoder=True, freeze_old_rows=False),
    FewShot("all", freeze_encoder=False, freeze_old_rows=False),
  )
}


def run_overrides(grown_workdir: str, epochs: int) -> dict:
  """The overrides every few-shot run has, whatever it trains: start from GROWN_WORKDIR's
  export, `epochs` epochs, no warm start, hard negatives from the first step."""
  return {
    "train.init_from": grown_workdir,
    "warmstart.epochs": 0,
    "train.epochs": epochs,
    "negatives.tau_s": 0,
    "negatives.tau_r": 1,
    "train.eval_every_epochs": 0,
  }


def update_config(
  trained_workdir: str, data_dir: str, grown_workdir: str, epochs: int, update: str
) -> ml_collections.ConfigDict:
  """The few-shot run's config: the config TRAINED_WORKDIR's model was trained with, on
  DATA_DIR (an XC dataset over the old and new labels, matched by text), from
  GROWN_WORKDIR's export, training what `update` (a key of UPDATES) says.

  Raises:
    InputError: an unknown update, fewer than one epoch, or no config.json in
      TRAINED_WORKDIR.
  """
  if update not in UPDATES:
    raise InputError(f"--update={update}: use one of {', '.join(UPDATES)}")
  if epochs < 1:
    raise InputError(f"--epochs={epochs}: the few-shot update needs at least one epoch")
  config = run_config.saved_config(trained_workdir)
  overrides = {
    "data.dir": data_dir,
    "data.synthetic.enabled": False,
    # A run on generated data recorded no tokenizer: the export's copy is the one it used.
    "data.tokenizer_dir": config.data.tokenizer_dir
    or os.path.join(export.model_dir(trained_workdir), "tokenizer"),
    **run_overrides(grown_workdir, epochs),
    **UPDATES[update].overrides(config.optim),
  }
  return config_base.with_overrides(config, overrides)
