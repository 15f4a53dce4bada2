"""`python -m astra_jax.reproduce`: the paper's tables and figures from the
configs: the paper's numbers (paper.py), the runs behind each table (runs.py), the tables and
the files written (tables.py), the classifier-step timing some tables use
(classifier_bench.py), and the command line (__main__.py).

Layer 13 of 13: may import every other package.
"""

from astra_jax.reproduce.runs import (
  ABLATION,
  BENCH_LABELS,
  REAL_ABLATION,
  Run,
  ablation_runs,
  load_or_run,
  motivation_runs,
  paper_refreshes_runs,
  paper_refreshes_tau,
  real_ablation_runs,
  run_dir,
  tau_runs,
)
from astra_jax.reproduce.table_rows import plot_motivation
from astra_jax.reproduce.tables import TABLES, reproduce, write_index

__all__ = [
  "ABLATION",
  "BENCH_LABELS",
  "REAL_ABLATION",
  "TABLES",
  "Run",
  "ablation_runs",
  "load_or_run",
  "motivation_runs",
  "paper_refreshes_runs",
  "paper_refreshes_tau",
  "plot_motivation",
  "real_ablation_runs",
  "reproduce",
  "run_dir",
  "tau_runs",
  "write_index",
]
