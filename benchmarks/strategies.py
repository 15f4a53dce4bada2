r"""The negative-sampling ablation (paper table tab:rq3) on one config, one line per strategy.

  python benchmarks/strategies.py --config=experiments/demo.py --out=strategies.jsonl \
      [--strategies=random,random+w_hard,w_hard] [--config.train.epochs=12]

Every strategy trains from the same seed on the same data with the same number of
negatives per query; each line: strategy, P@1, P@3, P@5, PSP@5, train_time_s, refreshes.
"""

import os

import jsonl  # benchmarks/jsonl.py
from absl import app, flags, logging
from ml_collections import config_flags

from astra_jax.negatives import strategies
from astra_jax.training import train

config_flags.DEFINE_config_file("config", "experiments/demo.py", "experiment config")
flags.DEFINE_string("out", None, "JSON lines output")
flags.DEFINE_list("strategies", list(strategies.names()), "strategies to run")
flags.DEFINE_string("workdir", "workdir/strategies", "one sub-directory per strategy")


def main(_):
  F = flags.FLAGS
  rows = []
  for strategy in F.strategies:
    config = F.config.copy_and_resolve_references()
    config.negatives.strategy = strategy
    r = train.train_and_evaluate(config, os.path.join(F.workdir, strategy.replace("+", "_")))
    row = {
      "strategy": strategy,
      **{k: r[k] for k in ("P@1", "P@3", "P@5", "PSP@5")},
      "train_time_s": r["train_time_s"],
      "num_labels": r["num_labels"],
      "epochs": r["epochs"],
      "refreshes": r["negatives"]["refreshes"],
    }
    rows.append(row)
    jsonl.emit(row, F.out)
  print("\n| strategy | P@1 | P@5 | train s |\n|---|---|---|---|")
  for row in rows:
    print(
      f"| {row['strategy']} | {row['P@1']:.2f} | {row['P@5']:.2f} | {row['train_time_s']:.0f} |"
    )


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main)
