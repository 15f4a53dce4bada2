r"""A dataset whose test split is a held-out share of another's training rows.

  PYTHONPATH=. python benchmarks/outer_split.py --data=SRC --out=DIR [--fraction=0.1] [--seed=12345]

DIR gets SRC's training rows minus the held-out share as its training split and the
held-out share as its test split, in the raw-text layout (`raw_data/{train,test,label}.raw.txt`,
`trn_X_Y.txt`, `tst_X_Y.txt`), with SRC's label texts. The held-out rows are the ones
`data.validation_fraction=FRACTION` with `data.validation_seed=SEED` carves from SRC (the same
`validation.split_rows`), and SRC's test split is not read. Training on DIR and reading its
test split measures a choice the recipe cannot make on its own validation split (training
on that split too, a second seed) without reading SRC's test split; the recipe's own
validation split inside DIR (seed 0) is other rows. Every row's own item is found again from
the texts (`data.filter_self`), which are written unchanged.

It holds the whole dataset in memory (`baselines.load_texts`: the texts as Python strings,
the labels as CSR, then their two parts), which suits the datasets the baselines run on,
up to ~10^6 rows. At SS-20M's 146M rows and 3.8e9 positives that is about 50 GB: ~17 GB of
strings at ~60 characters a text, 15.2 GB of int32 label ids, and as much again for the
split's copies.
"""

import os

from absl import app, flags

from astra_jax.data import xc_format
from astra_jax.data.validation import SplitSpec
from astra_jax.evaluation import baselines
from astra_jax.runtime.errors import InputError


def write_outer_split(src: str, out: str, fraction: float, seed: int) -> tuple[int, int]:
  """Writes `out` (module docstring); returns (training rows, test rows).

  Raises:
    InputError: `src` has no label texts (the raw-text layout needs them).
  """
  texts = baselines.load_texts(src, split=SplitSpec(fraction, seed))
  if texts.label_texts is None:
    raise InputError(f"--data={src}: no label texts; the raw-text layout needs them")
  os.makedirs(os.path.join(out, "raw_data"), exist_ok=True)
  splits = {"train": texts.train_texts, "test": texts.test_texts, "label": texts.label_texts}
  for name, rows in splits.items():
    xc_format.write_texts(os.path.join(out, "raw_data", f"{name}.raw.txt"), rows, layout="uid")
  xc_format.write_sparse(os.path.join(out, "trn_X_Y.txt"), texts.train_labels)
  xc_format.write_sparse(os.path.join(out, "tst_X_Y.txt"), texts.test_labels)
  return len(texts.train_texts), len(texts.test_texts)


def main(_):
  f = flags.FLAGS
  n_train, n_test = write_outer_split(f.data, f.out, f.fraction, f.seed)
  print(f"{f.out}: {n_train} training rows, {n_test} test rows held out of {f.data}'s")


if __name__ == "__main__":
  # Defined here, not on import, so that tests importing `write_outer_split` beside other
  # benchmark scripts define no flag twice.
  flags.DEFINE_string("data", None, "source dataset directory (any layout the trainer reads)")
  flags.DEFINE_string("out", None, "directory to write")
  flags.DEFINE_float("fraction", 0.1, "share of the source's training rows held out as test rows")
  flags.DEFINE_integer("seed", 12345, "the held-out rows' seed (as data.validation_seed)")
  flags.mark_flags_as_required(["data", "out"])
  app.run(main)
