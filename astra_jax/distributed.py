"""Multi-process runs: one process per GPU (or per host), joined by jax.distributed.

`initialize` must run before anything touches a jax backend. Detection (mesh.distributed =
auto): a SLURM job step with more than one task (jax reads the rest from SLURM's variables),
or JAX_COORDINATOR_ADDRESS with JAX_NUM_PROCESSES and JAX_PROCESS_ID set (any launcher; how
the tests start two local CPU processes). CPU processes exchange collectives through gloo.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from astra_jax.errors import InputError


def requested(mode: str, environ=os.environ) -> bool:
  if mode not in ("auto", "on", "off"):
    raise InputError(f"config.mesh.distributed: use auto, on or off, got {mode!r}")
  if mode == "auto":
    return (int(environ.get("SLURM_NTASKS", "1")) > 1 or
            "JAX_COORDINATOR_ADDRESS" in environ)
  return mode == "on"


def initialize(mode: str) -> bool:
  """Joins the other processes when asked; returns whether this is a multi-process run."""
  if not requested(mode):
    return False
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  env = os.environ
  kwargs = {}
  if "JAX_COORDINATOR_ADDRESS" in env and "JAX_NUM_PROCESSES" in env:
    kwargs = dict(coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
                  num_processes=int(env["JAX_NUM_PROCESSES"]),
                  process_id=int(env["JAX_PROCESS_ID"]))
  jax.distributed.initialize(**kwargs)
  return jax.process_count() > 1


def is_leader() -> bool:
  """Process 0 writes the run's shared files (results, logs, generated data)."""
  return jax.process_index() == 0


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
