"""Regenerates the paper's tables (and fig:ttvsperf) with our numbers beside the paper's.

  python -m astra_jax.reproduce --table=NAME [--workdir=workdir/reproduce] [--scale=0.01]
      [--out=docs/results] [--epochs=15] [--seeds=5] [--data=DIR] [--jobs=1]

NAME: rq3 (negative-sampling ablation), rq3_paper_refreshes (the same with the paper's
number of hard-negative refreshes), timebreakup, memory, tau_s_ablation,
tau_r_ablation, ratio_ablation, ttvsperf (PNG), ttvsperf_full_labels (the same at the
dataset's full 131,073 labels: ASTRA, full-L and random; PNG), motivation (fig:motivation:
table + PNG), rq3_real (the ablation and full-L on a real dataset, `--data=DIR`, by
experiments/xc_text.py:ngram; seeds from --seeds), encoders_real (the encoders on a real
dataset, `--data=DIR`: settings chosen on a validation split by its first stage,
encoders_real_validation, then the test split read once; reproduce/real_encoders.py),
grow (growing a trained model with held-out labels on a real dataset, `--data=DIR`;
reproduce/grow_protocol.py), grow_stand_in (the same on a 10^6-label synthetic stand-in,
also grown tenfold), or all_cpu (the tables docs/results.md holds). Each run writes
WORKDIR/[scaleS_epochsE/]<run>/results.json; a run whose results.json exists is reused, so
rerunning a command only tabulates. Writes OUT/<table>.md
and OUT/<table>.csv.
--jobs=N runs N of a table's runs at once as child processes (reproduce/parallel.py).
Training tables run a reduced-scale synthetic stand-in of a paper dataset (the paper's
column is the real dataset); timebreakup and memory time the L-dependent classifier step
(astra_jax/reproduce/classifier_bench.py).
"""

from __future__ import annotations

import sys

from absl import flags

from astra_jax.reproduce.paper import NEEDS_GPUS
from astra_jax.reproduce.tables import ALL_CPU, TABLES, reproduce, write_index
from astra_jax.runtime import cli, host_memory

WRONG_TABLE_EXIT = 2


def define_flags() -> None:
  """The command line (see the module docstring)."""
  flags.DEFINE_string("table", None, f"{' | '.join(sorted(TABLES))} | all_cpu")
  flags.DEFINE_string("workdir", "workdir/reproduce", "where the runs' workdirs go")
  flags.DEFINE_float("scale", 0.01, "stand-in scale")
  flags.DEFINE_integer("epochs", 15, "stand-in epochs")
  flags.DEFINE_string("out", "docs/results", "where the tables (.md, .csv, .png) go")
  flags.DEFINE_integer(
    "seeds", 5, "training seeds of the ablations (rq3, rq3_paper_refreshes, rq3_real)"
  )
  flags.DEFINE_string(
    "data", "", "the real dataset (XC layout) of rq3_real, which ignores --scale and --epochs"
  )
  flags.DEFINE_integer(
    "jobs",
    1,
    "runs at once, as child processes (a GPU runs many small runs side by side); 1: one "
    "after another in this process",
  )
  flags.mark_flags_as_required(["table"])


def main(argv) -> int:
  del argv  # cli.run allows none
  F = flags.FLAGS
  choices = sorted(TABLES) + ["all_cpu"]
  if F.table in NEEDS_GPUS:
    print(f"{F.table}: needs the real datasets + GPUs; run: {NEEDS_GPUS[F.table]}", file=sys.stderr)
    return WRONG_TABLE_EXIT
  if F.table not in choices:
    print(f"unknown table {F.table!r}; choose from {', '.join(choices)}", file=sys.stderr)
    return WRONG_TABLE_EXIT
  if F.table in TABLES and TABLES[F.table].real_data and not F.data:
    print(f"--table={F.table} trains on a real dataset: give --data=DIR", file=sys.stderr)
    return WRONG_TABLE_EXIT
  mds = [
    reproduce(
      name, F.workdir, F.out, F.scale, F.epochs, seeds=F.seeds, data_dir=F.data, jobs=F.jobs
    )
    for name in (ALL_CPU if F.table == "all_cpu" else (F.table,))
  ]
  print("\n".join(mds))
  if F.table == "all_cpu":
    print("wrote", write_index(F.out, mds, F.scale, F.epochs, F.workdir, F.seeds))
  return 0


def cli_main() -> None:
  """The console entry point `astra-reproduce` (and `python -m astra_jax.reproduce`)."""
  host_memory.keep_freed_memory()  # before jax starts (see host_memory.py)
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
