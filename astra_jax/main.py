"""python -m astra_jax.main --config=experiments/demo.py --workdir=DIR [--config.a.b=v]"""
from __future__ import annotations

import os
import sys

from astra_jax import host_memory

host_memory.keep_freed_memory()  # before jax starts its threads (see host_memory.py)

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import jax  # noqa: E402

from astra_jax import (checkpoint, cli, device_check, distributed, evaluate, faults,  # noqa: E402
                       train)
from astra_jax.errors import InputError  # noqa: E402

config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
flags.DEFINE_string("workdir", "workdir/run", "where results.json and logs go")
PREEMPTED_EXIT_CODE = 75  # SIGTERM/SIGINT: checkpoint written, rerun to resume
# Also written (by the leader, once its checkpoint is saved): a launcher whose job step
# reports another status (srun's --kill-on-bad-exit ends the other tasks as the first exits
# 75) can still tell a preemption it may requeue from a crash.
PREEMPTED_MARKER = "PREEMPTED"


def main(argv):
  if len(argv) > 1:
    sys.exit(f"unexpected arguments: {argv[1:]}")
  config = cli.config_flag()
  if config is None:
    sys.exit("--config=experiments/<name>.py is required")
  logging.get_absl_handler().python_handler.stream = sys.stdout
  try:
    distributed.initialize(config.mesh.distributed)
    device_check.check_devices(jax.devices())
    marker = os.path.join(flags.FLAGS.workdir, PREEMPTED_MARKER)
    if distributed.is_leader() and os.path.exists(marker):
      os.remove(marker)  # there only while the last run ended preempted
    results = train.train_and_evaluate(config, flags.FLAGS.workdir)
  except (InputError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  except checkpoint.Preempted as e:  # EX_TEMPFAIL: a launcher may requeue the job
    print(f"preempted: {e}", flush=True)
    if distributed.is_leader():
      with open(marker, "w") as f:
        f.write(f"{e}\n")
    sys.exit(PREEMPTED_EXIT_CODE)
  except Exception as e:  # a full disk (or one turned read-only) anywhere: one line
    found = faults.disk_error_code(e)
    if found is None:
      raise
    full = e if isinstance(e, faults.DiskFull) else faults.DiskFull(
        found[1] or flags.FLAGS.workdir, None, found[0])
    sys.exit(f"error: {full}")
  if not distributed.is_leader():
    return
  print()
  print(f"{results['num_labels']} labels, {results['num_train']} train / {results['num_test']} "
        f"test rows, {results['epochs']} epochs in {results['train_time_s']:.0f}s "
        f"(strategy {results['strategy']})")
  rows = {"astra_jax": results["metrics"], "label popularity": results["popularity_baseline"]}
  if "tfidf_knn_baseline" in results:
    rows["TF-IDF kNN"] = results["tfidf_knn_baseline"]
  knn_e = {k[len("kNN-E "):]: v for k, v in results["metrics"].items() if k.startswith("kNN-E ")}
  if knn_e:  # eval.knn_diagnostic: the same encoder, ranked by a kNN vote instead of W
    rows["kNN over own E(x)"] = knn_e
  print(evaluate.format_table(rows))
  print(f"\nresults: {flags.FLAGS.workdir}/results.json")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=cli.parse_flags)
