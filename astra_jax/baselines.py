"""What other methods get on a dataset in the XC layout: the classic floors (label
popularity, character n-gram TF-IDF kNN and label-text votes) and the XC libraries a user
tries first (PECOS XR-Linear, Parabel, Bonsai, napkinXC's PLT), each scored by the
project's own metric code under the model's filter (`evaluation/baselines.py`,
`evaluation/peers.py`; docs/baselines.md). A trained model that does not beat these is not
worth its training time.

  python -m astra_jax.baselines --data=DIR [--methods=popularity,tfidf_knn,...]
      [--split=test|validation] [--filter_self=off|on|auto]
  python -m astra_jax.baselines --data=DIR --methods=xrlinear,parabel,bonsai,plt

It prints P@1/3/5, PSP@1/3/5 and each method's train + predict seconds. scikit-learn is an
optional extra (`pip install astra_jax[baselines]`); without it only popularity is
computed. The peers run in an environment of their own, which `make peers` builds.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from astra_jax.data import xc_format
from astra_jax.data.validation import SplitSpec
from astra_jax.evaluation import baselines, metrics
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
  flags.DEFINE_integer(
    "validation_max_rows", 0, "--split=validation: as data.validation_max_rows (0: no cap)"
  )
  flags.DEFINE_enum(
    "filter_self",
    "off",
    ["off", "on", "auto"],
    "filter each row's own item, as data.filter_self (needs label texts)",
  )
  flags.DEFINE_list(
    "methods",
    list(baselines.CLASSIC),
    f"what to run, in order: any of {', '.join(baselines.BASELINES)}",
  )
  flags.DEFINE_string(
    "peers_python", "", "the peers' interpreter (default: $ASTRA_PEERS_PYTHON, .venv-peers)"
  )
  flags.DEFINE_float("propensity_A", 0.55, "PSP's A, as data.propensity_A")
  flags.DEFINE_float("propensity_B", 1.5, "PSP's B, as data.propensity_B")
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
      SplitSpec(f.validation_fraction, f.validation_seed, f.validation_max_rows)
      if f.split == "validation"
      else None,
      f.filter_self,
    )
    inv_prop = metrics.inverse_propensity(data.train_labels, f.propensity_A, f.propensity_B)
    results = baselines.run_all(
      data, methods=tuple(f.methods), inv_prop=inv_prop, peers_python=f.peers_python
    )
  except OSError as e:  # an InputError ends the run in cli.run
    sys.exit(f"error: {e}")
  print(baselines.table(results))
  if not baselines.sklearn_available() and any(
    baselines.BASELINES[m].needs_sklearn for m in f.methods
  ):
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
