"""Trains and evaluates one experiment; prints progress, evaluations and a results table.

python -m astra_jax.main --config=experiments/demo.py --workdir=DIR [--config.a.b=v]
"""

from __future__ import annotations

import os
import sys

from astra_jax.runtime import host_memory

host_memory.keep_freed_memory()  # before jax starts its threads (see host_memory.py)

import jax  # noqa: E402
from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from astra_jax.evaluation import metrics_table  # noqa: E402
from astra_jax.parallel import device_check  # noqa: E402
from astra_jax.runtime import cli, distributed, faults  # noqa: E402
from astra_jax.runtime.errors import InputError  # noqa: E402
from astra_jax.training import checkpoint, train  # noqa: E402

PREEMPTED_EXIT_CODE = 75  # SIGTERM/SIGINT: checkpoint written, rerun to resume
# Also written (by the leader, once its checkpoint is saved): a launcher whose job step
# reports another status (srun's --kill-on-bad-exit ends the other tasks as the first exits
# 75) can still tell a preemption it may requeue from a crash.
PREEMPTED_MARKER = "PREEMPTED"


def define_flags() -> None:
  """The command line: --config (and its --config.a.b=v overrides) and --workdir."""
  config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
  flags.DEFINE_string("workdir", "workdir/run", "where results.json and logs go")
  flags.mark_flags_as_required(["config"])


def main(argv):
  del argv  # cli.run allows none
  config = cli.config_flag()
  if config is None:
    sys.exit("--config=experiments/<name>.py is required")
  logging.get_absl_handler().python_handler.stream = sys.stdout
  workdir = flags.FLAGS.workdir
  try:
    distributed.initialize(config.mesh.distributed)
    device_check.check_devices(jax.devices())
    marker = os.path.join(workdir, PREEMPTED_MARKER)
    if distributed.is_leader() and os.path.exists(marker):
      os.remove(marker)  # there only while the last run ended preempted
    results = train.train_and_evaluate(config, workdir)
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
    full = (
      e if isinstance(e, faults.DiskFull) else faults.DiskFull(found[1] or workdir, None, found[0])
    )
    sys.exit(f"error: {full}")
  if distributed.is_leader():
    print(metrics_table.format_results(results, f"{workdir}/results.json"))


def cli_main() -> None:
  """The console entry point `astra-train` (and `python -m astra_jax.main`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
