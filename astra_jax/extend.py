"""Grows a trained model with new labels, without retraining.

python -m astra_jax.extend --workdir=DIR --labels=FILE --out=NEW_DIR [--retire=FILE]

FILE: the new labels' texts, one per line (`uid->text` lines for *.raw.txt); their ids
continue the model's (L, L+1, ...), old ids keep their meaning. --retire: label ids, one per
line, masked from every prediction (ids are never renumbered). Writes NEW_DIR/model, which
`python -m astra_jax.predict --workdir=NEW_DIR` and `Predictor` serve; NEW_DIR may be DIR
(its model is replaced atomically). How the new rows are made:
astra_jax/serving/grow.py. A bad line, a repeated text or an unknown id is one error line
naming it, and nothing is written.
"""

from __future__ import annotations

from absl import flags, logging

from astra_jax.runtime import cli
from astra_jax.runtime.errors import InputError
from astra_jax.serving import grow


def define_flags() -> None:
  """The command line (see the module docstring)."""
  flags.DEFINE_string("workdir", None, "a training workdir holding model/")
  flags.DEFINE_string("labels", None, "new label texts, one per line")
  flags.DEFINE_string("retire", None, "label ids to mask from predictions, one per line")
  flags.DEFINE_string("out", None, "the workdir the grown model/ goes to")
  flags.mark_flags_as_required(["workdir", "out"])


def main(argv) -> None:
  del argv  # cli.run allows none
  F = flags.FLAGS
  # An InputError (a bad line, a repeated text, an unknown id) ends the run in cli.run.
  texts = grow.read_label_texts(F.labels) if F.labels else []
  retire = grow.read_ids(F.retire) if F.retire else []
  if not texts and not retire:
    raise InputError("nothing to do: give --labels (new label texts) or --retire (ids)")
  report = grow.grow_model(F.workdir, texts, F.out, retire, source_name=F.labels or "")
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


def cli_main() -> None:
  """The console entry point `astra-extend` (and `python -m astra_jax.extend`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
