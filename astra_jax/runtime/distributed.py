"""Multi-process runs: one process per GPU (or per host), joined by jax.distributed.

`initialize` must run before anything touches a jax backend. Detection (mesh.distributed =
auto): a SLURM job step with more than one task (jax reads the rest from SLURM's variables),
or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set (any launcher; how the
tests start two local CPU processes). CPU processes exchange collectives through gloo.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from astra_jax.runtime.errors import InputError

_EXPLICIT = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def requested(mode: str, environ=os.environ) -> bool:
  if mode not in ("auto", "on", "off"):
    raise InputError(f"config.mesh.distributed: use auto, on or off, got {mode!r}")
  if mode == "auto":
    return int(environ.get("SLURM_NTASKS", "1")) > 1 or any(k in environ for k in _EXPLICIT)
  return mode == "on"


def initialize_kwargs(environ=os.environ) -> dict:
  """jax.distributed.initialize's arguments: the three JAX_* variables (all or none), else
  what jax detects (SLURM). Under SLURM jax binds local process i to GPU i, which does not
  exist when the task sees one GPU (srun --gpus-per-task=1: CUDA_VISIBLE_DEVICES=<one>):
  then the process takes the one it sees."""
  given = [k for k in _EXPLICIT if k in environ]
  if given and len(given) < len(_EXPLICIT):
    missing = ", ".join(k for k in _EXPLICIT if k not in environ)
    raise InputError(
      f"{', '.join(given)} set without {missing}: a multi-process run needs "
      "all three (or none, under SLURM)"
    )
  kwargs = {}
  if given:
    kwargs = dict(
      coordinator_address=environ["JAX_COORDINATOR_ADDRESS"],
      num_processes=int(environ["JAX_NUM_PROCESSES"]),
      process_id=int(environ["JAX_PROCESS_ID"]),
    )
  visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
  if "SLURM_LOCALID" in environ and len(visible) == 1:
    kwargs["local_device_ids"] = [0]
  return kwargs


def initialize(mode: str) -> bool:
  """Joins the other processes when asked; returns whether this is a multi-process run."""
  if not requested(mode):
    return False
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**initialize_kwargs())
  return jax.process_count() > 1


def is_leader() -> bool:
  """Process 0 writes the run's shared files (results, logs, generated data)."""
  return jax.process_index() == 0


def process_dir(workdir: str) -> str:
  """Where this process keeps files of its own: the workdir itself in a one-process run,
  else WORKDIR/process<i>."""
  if jax.process_count() == 1:
    return workdir
  return os.path.join(workdir, f"process{jax.process_index()}")


def barrier(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def all_true(flag: bool) -> bool:
  """True on every process iff it is true on every process (agreement on a decision)."""
  return not any_true([not flag])[0]


def any_true(flags: list[bool]) -> list[bool]:
  """Each flag true on every process iff it is true on some process."""
  if jax.process_count() == 1:
    return [bool(f) for f in flags]
  got = multihost_utils.process_allgather(np.asarray(flags, np.int32))
  return [bool(x) for x in np.asarray(got).reshape(-1, len(flags)).any(0)]


def sum_over_processes(sums: dict[str, float]) -> dict[str, float]:
  """Each value added over every process (the same keys on each)."""
  if jax.process_count() == 1:
    return sums
  keys = sorted(sums)
  x = np.asarray([sums[k] for k in keys], np.float64)
  # jax moves float32 (without x64): each value travels as a float32 and its remainder, so
  # counts past 2**24 (P@5 hits of millions of test rows) stay exact.
  high = x.astype(np.float32)
  low = (x - high).astype(np.float32)
  got = np.asarray(multihost_utils.process_allgather(np.stack([high, low])), np.float64)
  total = got.reshape(-1, 2, len(keys)).sum(axis=(0, 1))
  return {k: float(v) for k, v in zip(keys, total)}


def gather_rows(x: jax.Array) -> np.ndarray:
  """A batch-sharded global array as one host array on every process."""
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def local_row_shards(w: jax.Array) -> list[tuple[int, np.ndarray]]:
  """(first global row, rows) of each distinct row block of W held on this process."""
  seen = {}
  for shard in w.addressable_shards:
    start = shard.index[0].start or 0
    if start not in seen:
      seen[start] = np.asarray(shard.data)
  return sorted(seen.items())
