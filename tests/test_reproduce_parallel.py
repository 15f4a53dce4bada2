"""`reproduce --jobs=N`: the scheduler (warm-start donors first, at most N at once), the
run's round trip to a child process, and one real child."""

import json
import os

import pytest

from astra_jax import reproduce
from astra_jax.reproduce import parallel


class FakeProcess:
  """A child that ends after `steps` polls with `code`; records how many ran at once."""

  def __init__(self, clock, run, steps=3, code=0):
    self.clock, self.run, self.left, self.code = clock, run, steps, code
    clock["running"] += 1
    clock["peak"] = max(clock["peak"], clock["running"])
    clock["order"].append(run.key)

  def poll(self):
    self.left -= 1
    if self.left > 0:
      return None
    if self.left == 0:
      self.clock["running"] -= 1
    return self.code


def _clock():
  return {"running": 0, "peak": 0, "order": []}


def test_runs_wait_for_their_warm_start_donor_and_respect_jobs(tmp_path):
  runs = reproduce.real_ablation_runs(str(tmp_path / "data"), seeds=2)
  clock = _clock()

  def start(run, root):
    return FakeProcess(clock, run)

  def ready(donor, root):  # a donor's stage is saved as soon as it runs
    return donor.key in clock["order"]

  codes = parallel.schedule(
    runs, str(tmp_path), jobs=3, start=start, ready=ready, log=lambda m: None, poll_s=0
  )
  assert set(codes) == {r.key for r in runs} and set(codes.values()) == {0}
  assert clock["peak"] == 3
  # Each seed's ASTRA run starts before any run of its seed that copies its warm start.
  for seed in (0, 1):
    keys = [r.key for r in runs if r.seed == seed]
    first = clock["order"].index(keys[0])
    assert all(clock["order"].index(k) > first for k in keys[1:])


def test_a_run_waits_while_its_donor_has_not_saved_and_goes_when_it_fails(tmp_path):
  runs = reproduce.real_ablation_runs(str(tmp_path / "data"), seeds=1)[:2]
  clock = _clock()
  procs = {}

  def start(run, root):
    procs[run.key] = FakeProcess(clock, run, steps=5, code=1 if run.key == runs[0].key else 0)
    return procs[run.key]

  logs = []
  codes = parallel.schedule(
    runs, str(tmp_path), jobs=4, start=start, ready=lambda d, r: False, log=logs.append, poll_s=0
  )
  # Never "saved": the second run starts only after the donor ended (here: failed).
  assert clock["order"] == [runs[0].key, runs[1].key] and clock["peak"] == 1
  assert codes == {runs[0].key: 1, runs[1].key: 0}
  assert any("failed (exit 1)" in m for m in logs)


def test_run_round_trips_through_json_with_a_checkpoint_kept_for_children():
  run = reproduce.real_ablation_runs("/data/x", seeds=2)[9]
  assert parallel.from_json(parallel.to_json(run)) == run
  child = parallel.for_child(run)
  assert dict(child.overrides)["checkpoint.keep"] == 1 and child.key == run.key
  bench = reproduce.Run("bench_astra_L10", bench=("astra", 10))
  assert parallel.from_json(parallel.to_json(bench)) == bench == parallel.for_child(bench)


@pytest.mark.e2e
def test_a_child_process_runs_and_its_results_are_tabulated(tmp_path):
  """One real child: a classifier benchmark run through `python -m astra_jax.reproduce.parallel`."""
  run = reproduce.Run("bench_astra_L1000", bench=("astra", 1000))
  codes = parallel.schedule([run], str(tmp_path), jobs=2, log=lambda m: None, poll_s=0.2)
  log = parallel.log_path(run, str(tmp_path))
  assert codes == {run.key: 0}, open(log).read()
  with open(tmp_path / run.name / "results.json") as f:
    assert json.load(f)["step_ms"] > 0
  assert log == str(tmp_path / "logs" / "bench_astra_L1000.log") and os.path.exists(log)
