"""Memory plan of a training run, printed before anything is allocated.

  python -m astra_jax.plan --config=experiments/ss20m.py [--mesh=DATAxMODEL]
      [--gpu=v100-32gb|a100-80gb|h100-80gb] [--num_gpus=N] [--gpus_per_node=G]
      [--processes_per_node=P] [--host_cores_per_node=C] [--train_queries_per_s=Q]
      [--json] [--check] [--config.a.b=v ...]

Per device: W's shard, the optimizer states, the encoder's parameters, moments, gradients
and activations, the classifier step's temporaries, against 90% of the GPU's memory, with
fixes when it does not fit. Per node (--gpus_per_node, --processes_per_node: one process per
GPU as launch/slurm.sbatch runs, or 1 as launch/single_node.sh): preparation's peak, every
training process's and refresh worker's memory, and the disk every file of the run takes.
Per refresh: its hours on the hosts (ScaNN) and on the devices (exact) against an epoch's,
and how long training waits with each (refresh_time.py).
astra_jax/plan/estimates.py says what is counted and how.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from astra_jax.plan.estimates import plan_config
from astra_jax.plan.records import GPUS
from astra_jax.plan.report import format_plan
from astra_jax.runtime import cli

DOES_NOT_FIT_EXIT = 3  # --check


def define_flags() -> None:
  """The command line (see the module docstring)."""
  config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
  flags.DEFINE_string("mesh", "", "DATAxMODEL devices (default: the config's mesh)")
  flags.DEFINE_enum("gpu", "v100-32gb", list(GPUS), "GPU memory to plan against")
  flags.DEFINE_integer(
    "num_gpus",
    0,
    "devices in all (default: the mesh's); sets mesh.data "
    "= num_gpus / mesh.model unless --mesh says otherwise",
  )
  flags.DEFINE_integer("gpus_per_node", 0, "GPUs per node (default: all on one node)")
  flags.DEFINE_integer(
    "processes_per_node",
    0,
    "training processes per node (default: one per "
    "GPU, as launch/slurm.sbatch; 1 for launch/single_node.sh)",
  )
  flags.DEFINE_integer(
    "host_cores_per_node",
    0,
    "host cores per node the refresh workers use (default: the GPU kind's usual node)",
  )
  flags.DEFINE_float(
    "train_queries_per_s",
    0.0,
    "training queries per second per GPU, measured (default: estimated from a V100's)",
  )
  flags.DEFINE_bool("json", False, "print the plan as JSON")
  flags.DEFINE_bool(
    "check",
    False,
    f"exit with status {DOES_NOT_FIT_EXIT} when the run does not fit (the launchers stop there)",
  )
  flags.mark_flags_as_required(["config"])


def main(argv) -> int:
  del argv  # cli.run allows none
  F = flags.FLAGS
  path = config_flags.get_config_filename(F["config"])
  config = cli.config_flag()
  label = f"{config.data.get('name', '') or '?'} ({path})"
  p = plan_config(
    config,
    F.gpu,
    F.mesh,
    F.num_gpus,
    label,
    F.gpus_per_node,
    F.processes_per_node,
    F.host_cores_per_node,
    F.train_queries_per_s,
  )  # an InputError ends the run in cli.run
  print(json.dumps(p.to_json(), indent=1) if F.json else format_plan(p))
  return DOES_NOT_FIT_EXIT if F.check and not p.fits else 0


def cli_main() -> None:
  """The console entry point `astra-plan` (and `python -m astra_jax.plan`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
