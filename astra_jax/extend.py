"""Grows a trained model with new labels, without retraining.

python -m astra_jax.extend --workdir=DIR --labels=FILE --out=NEW_DIR [--retire=FILE]
    [--train_data=DATA_DIR [--epochs=1] [--update=new_rows|classifier|all]]

FILE: the new labels' texts, one per line (`uid->text` lines for *.raw.txt); their ids
continue the model's (L, L+1, ...), old ids keep their meaning. --retire: label ids, one per
line, masked from every prediction (ids are never renumbered). Writes NEW_DIR/model, which
`python -m astra_jax.predict --workdir=NEW_DIR` and `Predictor` serve; NEW_DIR may be DIR
(its model is replaced atomically). How the new rows are made:
astra_jax/serving/grow.py. A bad line, a repeated text or an unknown id is one error line
naming it, and nothing is written.

--train_data: an XC dataset over the old and new labels (the run's layout; labels matched to
the model's by text, in any order) whose training pairs include the new labels'. The model
is then grown into NEW_DIR/grown and trained on for --epochs with the config DIR was
trained with (training/few_shot.py) into NEW_DIR, whose model/ is the result: --update
new_rows trains only the new labels' rows (the old rows and the encoder stay bit for bit),
classifier every row, all the encoder too. results.json's `trained` and `stage_seconds` say
what it changed and how long it took.
"""

from __future__ import annotations

import os

from absl import flags, logging

from astra_jax.runtime import cli
from astra_jax.runtime.errors import InputError
from astra_jax.serving import grow
from astra_jax.training import few_shot, train


def define_flags() -> None:
  """The command line (see the module docstring)."""
  flags.DEFINE_string("workdir", None, "a training workdir holding model/")
  flags.DEFINE_string("labels", None, "new label texts, one per line")
  flags.DEFINE_string("retire", None, "label ids to mask from predictions, one per line")
  flags.DEFINE_string("out", None, "the workdir the grown model/ goes to")
  flags.DEFINE_string("train_data", None, "a dataset over old and new labels: train on it")
  flags.DEFINE_integer("epochs", 1, "epochs of the few-shot update (with --train_data)")
  flags.DEFINE_enum("update", "new_rows", list(few_shot.UPDATES), "what the few-shot update trains")
  flags.mark_flags_as_required(["workdir", "out"])


def main(argv) -> None:
  del argv  # cli.run allows none
  F = flags.FLAGS
  # An InputError (a bad line, a repeated text, an unknown id) ends the run in cli.run.
  texts = grow.read_label_texts(F.labels) if F.labels else []
  retire = grow.read_ids(F.retire) if F.retire else []
  if not texts and not retire:
    raise InputError("nothing to do: give --labels (new label texts) or --retire (ids)")
  grown_wd = os.path.join(F.out, "grown") if F.train_data else F.out
  config = None
  if F.train_data:  # a bad flag or a workdir without its config stops before any writing
    config = few_shot.update_config(F.workdir, F.train_data, grown_wd, F.epochs, F.update)
  report = grow.grow_model(F.workdir, texts, grown_wd, retire, source_name=F.labels or "")
  logging.info(
    "grown: %d labels + %d new (ids %d..%d), %d retired; text -> row map fitted on %d "
    "labels (R^2 %.2f); %.1fs: %s",
    report.old_labels,
    report.new_labels,
    report.old_labels,
    report.old_labels + report.new_labels - 1,
    len(report.retired),
    report.fit_labels,
    report.fit_r2,
    report.seconds,
    report.path,
  )
  if config is not None:
    results = train.train_and_evaluate(config, F.out)
    logging.info(
      "few-shot update (%s, %d epochs): trained %s; %.1f s of training: %s",
      F.update,
      F.epochs,
      results["trained"],
      results["stage_seconds"].get("training", 0.0),
      os.path.join(F.out, "model"),
    )


def cli_main() -> None:
  """The console entry point `astra-extend` (and `python -m astra_jax.extend`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
