"""A table's runs as parallel processes (`reproduce --jobs=N`), for a machine with room for
several at once: one GPU runs many small stand-in or real-data runs side by side far faster
than one after another (rq3_real's runs use a few percent of an H200 each).

Each run is `load_or_run` in a child process (`python -m astra_jax.reproduce.parallel RUN
ROOT`), logging to ROOT/logs/. A run that starts from another run's warm
start (`Run.warmstart_from`) waits until that stage is saved, or until its donor ends. The
children keep one training checkpoint (`checkpoint.keep=1`, which changes nothing a run
computes) so that N runs in flight hold N checkpoints, not 3N, and each drops its
checkpoints when it finishes (`runs.discard_training_state`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Protocol

from astra_jax.reproduce.runs import Run, load_or_run, run_dir, stale

# A child's JAX shares the device: it allocates what it uses instead of most of the memory.
CHILD_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
POLL_S = 1.0


class Handle(Protocol):
  def poll(self) -> int | None: ...


def to_json(run: Run) -> str:
  """A run as one JSON string (its fields; tuples as lists)."""
  return json.dumps(dataclasses.asdict(run))


def from_json(text: str) -> Run:
  """The run `to_json` wrote."""
  d = json.loads(text)
  d["overrides"] = tuple((k, v) for k, v in d["overrides"])
  d["bench"] = None if d["bench"] is None else tuple(d["bench"])
  return Run(**d)


def for_child(run: Run) -> Run:
  """The run as a child runs it: one training checkpoint kept (a free key: see above)."""
  if run.bench is not None:
    return run
  return dataclasses.replace(run, overrides=run.overrides + (("checkpoint.keep", 1),))


def warmstart_saved(run: Run, root: str) -> bool:
  """Whether `run`'s finished warm start is on disk (orbax renames a step's directory into
  place when it is complete)."""
  epochs = run.config().warmstart.epochs
  return os.path.isdir(os.path.join(run_dir(root, run), "warmstart", str(epochs)))


def log_path(run: Run, root: str) -> str:
  """Where a child's output goes: ROOT/logs/, outside the workdir that a stale run's rerun
  removes."""
  return os.path.join(root, "logs", run_dir("", run).replace(os.sep, "_") + ".log")


def launch(run: Run, root: str) -> subprocess.Popen:
  """Starts `run` in a child process, its output in `log_path`."""
  os.makedirs(os.path.join(root, "logs"), exist_ok=True)
  with open(log_path(run, root), "a") as log:  # the child holds its own copy
    return subprocess.Popen(
      [sys.executable, "-m", "astra_jax.reproduce.parallel", to_json(for_child(run)), root],
      stdout=log,
      stderr=subprocess.STDOUT,
      env={**os.environ, **CHILD_ENV},
    )


def schedule(
  runs: list[Run],
  root: str,
  jobs: int,
  start: Callable[[Run, str], Handle] = launch,
  ready: Callable[[Run, str], bool] = warmstart_saved,
  log: Callable[[str], None] = print,
  poll_s: float = POLL_S,
) -> dict[str, int]:
  """Runs `runs` with at most `jobs` at a time, in order, each once its warm-start donor
  (if any) has saved its stage or ended; returns each run's exit code by key.

  Args:
    runs: the table's runs (donors before the runs that copy them).
    root: the table's workdir root.
    jobs: processes at once.
    start: starts a run (the child process; tests pass a fake).
    ready: whether a donor's warm start is saved.
    log: progress lines.
    poll_s: seconds between checks.
  """
  by_name_seed = {(r.group, r.seed, r.name): r for r in runs}
  waiting, running, codes = list(runs), {}, {}

  def donor_done(run: Run) -> bool:
    donor = by_name_seed.get((run.group, run.seed, run.warmstart_from))
    if not run.warmstart_from or donor is None or donor.key in codes:
      return True
    return donor.key in running and ready(donor, root)

  t0 = time.time()
  while waiting or running:
    for key, handle in list(running.items()):
      code = handle.poll()
      if code is not None:
        codes[key] = code
        del running[key]
        log(f"{key}: {'done' if code == 0 else f'failed (exit {code})'} at {time.time() - t0:.0f}s")
    for run in list(waiting):
      if len(running) >= jobs:
        break
      if donor_done(run):
        waiting.remove(run)
        running[run.key] = start(run, root)
        log(f"{run.key}: started in {run_dir(root, run)} ({len(running)} running)")
    if waiting or running:
      time.sleep(poll_s)
  return codes


def run_all(runs: list[Run], root: str, jobs: int, log: Callable[[str], None] = print) -> dict:
  """Every run's results: finished ones reused, the rest run `jobs` at a time.

  Raises:
    RuntimeError: a run failed (its log is named).
  """
  todo = [r for r in runs if not _reusable(r, root)]
  codes = schedule(todo, root, jobs, log=log) if todo else {}
  failed = [r for r in todo if codes.get(r.key)]
  if failed:
    logs = ", ".join(log_path(r, root) for r in failed)
    raise RuntimeError(f"{len(failed)} of {len(todo)} runs failed; see {logs}")
  return {r.key: load_or_run(r, root, log) for r in runs}


def _reusable(run: Run, root: str) -> bool:
  path = os.path.join(run_dir(root, run), "results.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return not stale(run, json.load(f))


if __name__ == "__main__":
  from astra_jax.runtime import host_memory

  host_memory.keep_freed_memory()  # before jax starts, as the command line does
  load_or_run(from_json(sys.argv[1]), sys.argv[2])
