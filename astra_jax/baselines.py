"""What a classic method gets for free on a dataset in the XC layout: label popularity and
character n-gram TF-IDF k-nearest-neighbour votes (`evaluation/baselines.py` says how each
is computed). A trained model that does not beat these is not worth its training time.

  python -m astra_jax.baselines --data=DIR [--split=test|validation] [--filter_self=off|on|auto]

scikit-learn is an optional extra (`pip install astra_jax[baselines]`); without it only
popularity is computed.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from astra_jax.data import xc_format
from astra_jax.evaluation import baselines
from astra_jax.runtime import cli


def define_flags() -> None:
  """The command line (see the module docstring)."""
  flags.DEFINE_string("data", None, "dataset directory (XC layout)", required=True)
  flags.DEFINE_string("layout", "auto", "auto | renee | ngame | json")
  flags.DEFINE_bool("use_content", False, "json layout: title + content")
  flags.DEFINE_enum("split", "test", ["test", "validation"], "what the baselines rank")
  flags.DEFINE_float(
    "validation_fraction",
    0.1,
    "--split=validation: the held-out share (as data.validation_fraction)",
  )
  flags.DEFINE_integer("validation_seed", 0, "--split=validation: as data.validation_seed")
  flags.DEFINE_enum(
    "filter_self",
    "off",
    ["off", "on", "auto"],
    "filter each row's own item, as data.filter_self (needs label texts)",
  )
  flags.DEFINE_string("output", "", "also write the numbers as JSON here")


def main(argv: list[str]) -> None:
  """Prints (and with --output writes) the baselines' metrics."""
  del argv  # cli.run allows none
  f = flags.FLAGS
  try:
    data = baselines.load_texts(
      f.data,
      f.layout,
      f.use_content,
      f.validation_fraction if f.split == "validation" else 0.0,
      f.validation_seed,
      f.filter_self,
    )
    results = baselines.run_all(data)
  except OSError as e:  # an InputError ends the run in cli.run
    sys.exit(f"error: {e}")
  print(baselines.table(results))
  if not baselines.sklearn_available():
    print(
      "(TF-IDF baselines skipped: scikit-learn is not installed; "
      "pip install 'astra_jax[baselines]')"
    )
  if f.output:
    with xc_format.atomic_text_writer(f.output) as out:
      json.dump(results, out, indent=1)


def cli_main() -> None:
  """The console entry point `astra-baselines` (and `python -m astra_jax.baselines`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
