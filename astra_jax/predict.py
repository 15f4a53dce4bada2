"""Top-k labels for texts from a trained model, one JSON object per input line.

python -m astra_jax.predict --workdir=DIR [--input=FILE] [--output=FILE] [--k=10] [--exact]

Reads stdin without --input; each output line is {"line", "ids", "scores"[, "labels"]
[, "warning"]} or {"line", "error"}. The Python API is `serving.predictor.Predictor`.
"""

from __future__ import annotations

import json
import sys

from absl import flags, logging

from astra_jax.runtime import cli
from astra_jax.runtime.errors import InputError
from astra_jax.serving.predictor import Predictor


# ---------------------------------------------------------------------------- command line
def _lines(f, batch_size: int):
  """Batches of (1-based line number, raw bytes without the line ending)."""
  batch = []
  for lineno, raw in enumerate(f, 1):
    batch.append((lineno, raw.rstrip(b"\n").rstrip(b"\r")))
    if len(batch) == batch_size:
      yield batch
      batch = []
  if batch:
    yield batch


def run(predictor: Predictor, infile, outfile, k: int, batch_size: int = 256) -> dict:
  """Predicts every line of the binary stream `infile`; writes one JSON object per line
  ({"line", "ids", "scores"[, "labels"][, "warning"]} or {"line", "error"}) to the binary
  stream `outfile`. Returns counts."""
  counts = {"lines": 0, "errors": 0, "warnings": 0}
  for batch in _lines(infile, batch_size):
    pred = predictor.predict([raw for _, raw in batch], k)
    for j, (lineno, _) in enumerate(batch):
      rec = {"line": lineno, **pred.record(j)}
      counts["errors"] += "error" in rec
      counts["warnings"] += "warning" in rec
      outfile.write(json.dumps(rec, ensure_ascii=False).encode("utf-8") + b"\n")
    counts["lines"] += len(batch)
    outfile.flush()
  return counts


def define_flags() -> None:
  """The command line (see the module docstring)."""
  flags.DEFINE_string("workdir", None, "a training workdir holding model/")
  flags.DEFINE_string("input", None, "queries, one per line (default: stdin)")
  flags.DEFINE_string("output", None, "where the JSON lines go (default: stdout)")
  flags.DEFINE_integer("k", 10, "labels per query")
  flags.DEFINE_bool("exact", False, "exact search over all of W instead of ScaNN")
  flags.DEFINE_integer("batch_size", 256, "lines per prediction call")
  flags.DEFINE_bool("rebuild_index", False, "rebuild the cached ScaNN index")
  flags.mark_flags_as_required(["workdir"])


def main(argv) -> None:
  del argv  # cli.run allows none
  F = flags.FLAGS
  if F.k < 1 or F.batch_size < 1:
    sys.exit("error: --k and --batch_size must be >= 1")
  try:
    predictor = Predictor.from_workdir(
      F.workdir, "exact" if F.exact else "scann", rebuild_index=F.rebuild_index
    )
    infile = open(F.input, "rb") if F.input else sys.stdin.buffer
    outfile = open(F.output, "wb") if F.output else sys.stdout.buffer
  except (InputError, OSError) as e:
    sys.exit(f"error: {e}")
  with infile, outfile:
    counts = run(predictor, infile, outfile, F.k, F.batch_size)
  logging.info(
    "%d lines: %d errors, %d warnings (%s index)",
    counts["lines"],
    counts["errors"],
    counts["warnings"],
    predictor.index_kind,
  )


def cli_main() -> None:
  """The console entry point `astra-predict` (and `python -m astra_jax.predict`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
