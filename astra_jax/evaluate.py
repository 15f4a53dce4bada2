r"""Evaluates XC predictions from any method.

  python -m astra_jax.evaluate --pred=SCORES.txt --truth=tst_X_Y.txt --train=trn_X_Y.txt \
      [--filter=filter_labels_test.txt] [--A=0.55 --B=1.5] [--out=metrics.json]

SCORES.txt is a sparse score matrix in the repository's text format (`label:score` per
row). Filtered (row, label) pairs are removed from the predictions before the top-k is taken;
the truth is left as it is. Prints P@k, nDCG@k, PSP@k, PSnDCG@k (x100) for k = 1, 3, 5.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from absl import flags

from astra_jax.data import sparse_rows, xc_format
from astra_jax.evaluation import metrics, metrics_table, ranking
from astra_jax.runtime import cli


def ranked_from_scores(scores: sparse_rows.SparseRows, k: int) -> np.ndarray:
  """Top-k label ids per row of a sparse score matrix, best first (ties: lower id first)."""
  out = np.full((scores.num_rows, k), -1, np.int64)
  for i in range(scores.num_rows):
    ids, s = scores.row(i), scores.row_values(i)
    order = np.lexsort((ids, -s))[:k]
    out[i, : len(order)] = ids[order]
  return out


def evaluate_files(
  pred: str, truth: str, train: str, filter_path: str | None, A: float, B: float, ks=(1, 3, 5)
) -> dict[str, float]:
  truth_m = xc_format.read_sparse(truth)
  train_m = xc_format.read_sparse(train, truth_m.num_cols)
  pred_m = xc_format.read_sparse(pred, truth_m.num_cols)
  if pred_m.num_rows != truth_m.num_rows:
    raise sparse_rows.XCFormatError(
      pred, None, f"{pred_m.num_rows} rows, but {truth} has {truth_m.num_rows}"
    )
  filt = (
    xc_format.read_filter(filter_path, truth_m.num_rows, truth_m.num_cols)
    if filter_path
    else np.zeros((0, 2), np.int64)
  )
  inv = metrics.inverse_propensity(train_m, A, B)
  return ranking.rank_filter_score(
    lambda k: ranked_from_scores(pred_m, k), truth_m, filt, inv, tuple(ks)
  )


def define_flags() -> None:
  """The command line (see the module docstring)."""
  flags.DEFINE_string("pred", None, "sparse score matrix (label:score rows)")
  flags.DEFINE_string("truth", None, "test label matrix, e.g. tst_X_Y.txt")
  flags.DEFINE_string("train", None, "train label matrix, for propensities")
  flags.DEFINE_string("filter", None, "optional filter file of 'row label' pairs")
  flags.DEFINE_float("A", 0.55, "propensity A (0.6 Amazon, 0.5 Wikipedia, 0.55 otherwise)")
  flags.DEFINE_float("B", 1.5, "propensity B (2.6 Amazon, 0.4 Wikipedia, 1.5 otherwise)")
  flags.DEFINE_string("out", None, "write the metrics as JSON here")
  flags.DEFINE_multi_integer("k", [1, 3, 5], "cut-offs")
  flags.mark_flags_as_required(["pred", "truth", "train"])


def main(argv):
  del argv
  F = flags.FLAGS
  try:
    result = evaluate_files(F.pred, F.truth, F.train, F.filter, F.A, F.B, tuple(F.k))
  except (sparse_rows.XCFormatError, OSError) as e:
    sys.exit(f"error: {e}")
  print(metrics_table.format_table({"predictions": result}, tuple(F.k)))
  if F.out:
    with xc_format.atomic_text_writer(F.out) as f:
      json.dump(result, f, indent=1)


def cli_main() -> None:
  """The console entry point `astra-evaluate` (and `python -m astra_jax.evaluate`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
