"""How many CPU threads a process of this task may run, and the settings that hold the
thread pools of its libraries to that.

On a GPU node a SLURM task gets `--cpus-per-task` of the node's cores; ScaNN, OpenBLAS and
OpenMP size their pools from every core of the machine unless told otherwise, so 8 refresh
workers of an 8-GPU node would each start one thread per core beside the input pipelines.
The budget is the task's share: SLURM_CPUS_PER_TASK where SLURM sets it, and never more than
the CPUs this process may run on (`os.sched_getaffinity`, which cgroups and taskset narrow).
"""

from __future__ import annotations

import os

# The variables the BLAS / OpenMP runtimes numpy and ScaNN load read once, at start-up.
THREAD_VARIABLES = (
  "OMP_NUM_THREADS",
  "OPENBLAS_NUM_THREADS",
  "MKL_NUM_THREADS",
  "BLIS_NUM_THREADS",
  "NUMEXPR_NUM_THREADS",
)


def task_cpus(environ=os.environ) -> int:
  """The CPUs this task may use (at least 1).

  Args:
    environ: the environment to read SLURM_CPUS_PER_TASK from.
  Returns:
    min(SLURM_CPUS_PER_TASK, CPUs in this process's affinity mask), or the mask's size
    outside SLURM.
  """
  cpus = len(os.sched_getaffinity(0))
  given = environ.get("SLURM_CPUS_PER_TASK", "")
  if given.isdigit() and int(given) > 0:
    cpus = min(cpus, int(given))
  return max(1, cpus)


def refresh_threads(configured: int, input_threads: int, environ=os.environ) -> int:
  """Threads for a hard-negative refresh worker.

  Args:
    configured: negatives.refresh_threads (> 0: that many; 0: derived).
    input_threads: train.input_threads, the input pipeline's threads, which run beside it.
    environ: the environment (SLURM_CPUS_PER_TASK).
  Returns:
    `configured` if > 0, else the task's CPUs less the input threads, at least 1.
  """
  if configured > 0:
    return configured
  return max(1, task_cpus(environ) - input_threads)


def thread_environment(threads: int, environ=os.environ) -> dict[str, str]:
  """`environ` with every thread-pool variable set to `threads`: for a child process, whose
  libraries read them when they load."""
  return {**environ, **{name: str(threads) for name in THREAD_VARIABLES}}
