"""What the launcher planned for against what jax sees, before any long work.

launch/single_node.sh and launch/slurm.sbatch export ASTRA_EXPECT_GPUS (the GPUs of the whole
run, all nodes). A jax that finds fewer, e.g. one without its CUDA plugin, whose CUDA
libraries a `module load cuda` path shadowed, or a task confined to one GPU, falls back to
fewer devices or to the CPU with only a warning; and a mesh of fewer devices than the run
has (mesh.data=1) leaves GPUs idle. Both are one `error:` line here instead.
"""

from __future__ import annotations

import os

from astra_jax.runtime.errors import InputError

EXPECT_VARIABLE = "ASTRA_EXPECT_GPUS"


def expected_gpus(environ=os.environ) -> int | None:
  """The run's GPU count as the launcher planned it, or None outside the launchers."""
  value = environ.get(EXPECT_VARIABLE, "")
  return int(value) if value.isdigit() and int(value) > 0 else None


def check_devices(devices, environ=os.environ) -> None:
  """Raises InputError unless `devices` (jax.devices(): every process's) are the planned
  number of GPUs.

  Args:
    devices: the run's devices.
    environ: where ASTRA_EXPECT_GPUS is read.
  """
  want = expected_gpus(environ)
  if want is None:
    return
  gpus = [d for d in devices if d.platform == "gpu"]
  if len(gpus) != want:
    seen = f"{len(devices)} {devices[0].platform} device(s)" if devices else "no devices"
    raise InputError(
      f"{EXPECT_VARIABLE}={want}: the launcher planned for {want} GPUs, jax sees {seen} "
      f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): install "
      "jax with CUDA (pip install -e '.[cuda12]'), keep `module load cuda` paths out of "
      "LD_LIBRARY_PATH, and do not confine a task to one GPU (launch/README.md)"
    )


def check_mesh(mesh_size: int, environ=os.environ) -> None:
  """Raises InputError when the launcher planned for more GPUs than the mesh uses."""
  want = expected_gpus(environ)
  if want is not None and mesh_size != want:
    raise InputError(
      f"config.mesh: the mesh uses {mesh_size} of the run's {want} GPUs; "
      "--config.mesh.data=-1 uses all of them"
    )
