"""A machine without ScaNN (it has no macOS wheels): training, its refreshes, the evaluation
through the serving index and the export all run, searching exactly, and say so once."""

import json
import os
import subprocess

import numpy as np
import pytest
from child_env import REPO, cpu_child_env, demo_command_line

from astra_jax.ann import index
from astra_jax.negatives import mining

# The demo run made smaller still: the path matters here, not what it learns.
SMALLER = ("--config.data.synthetic.num_train=500", "--config.data.synthetic.num_test=100")


def _hidden_scann(tmp_path) -> str:
  """A directory that, first on PYTHONPATH, makes `import scann` fail as if not installed."""
  hide = tmp_path / "hide"
  (hide / "scann").mkdir(parents=True)
  (hide / "scann" / "__init__.py").write_text('raise ImportError("scann is hidden by the test")\n')
  return str(hide)


def test_a_missing_scann_builds_an_exact_index(monkeypatch):
  monkeypatch.setattr(index, "scann_available", lambda: False)
  rows = np.random.default_rng(0).normal(size=(60_000, 8)).astype(np.float32)
  assert mining.exact_without_scann("auto", len(rows))  # auto means ScaNN at 60k rows
  assert not mining.exact_without_scann("auto", 50_000)  # and exact by choice at 50k
  assert not mining.exact_without_scann("exact", len(rows))
  built = mining.build_index(rows[:500], 5, "scann")
  assert isinstance(built, index.ExactIndex)
  q = rows[:3]
  np.testing.assert_array_equal(built.search(q, 5), np.argsort(-(q @ rows[:500].T), 1)[:, :5])


@pytest.mark.e2e
def test_the_demo_path_runs_without_scann_and_says_so_once(tmp_path):
  wd = tmp_path / "wd"
  cmd = demo_command_line(wd, tmp_path / "data") + [
    *SMALLER,
    "--config.negatives.index.kind=scann",  # asks for ScaNN where it is missing
    "--config.eval.search=scann",  # and evaluates through the serving index
  ]
  env = cpu_child_env(1)
  env["PYTHONPATH"] = f"{_hidden_scann(tmp_path)}{os.pathsep}{REPO}"
  r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
  log = r.stdout + r.stderr
  assert r.returncode == 0, log[-3000:]
  assert log.count(index.SCANN_MISSING) == 1, log[-3000:]
  with open(wd / "results.json") as f:
    results = json.load(f)
  refreshes = results["negatives"]["refreshes"]
  assert refreshes and all(s["ok"] and s["recall"] == 1.0 for s in refreshes)
  assert results["degraded"]["refreshes_exact_without_scann"] == len(refreshes)
  assert results["ann_eval"]["index"] == "exact"
  assert os.path.exists(wd / "model" / "classifier.npy")


@pytest.mark.e2e
def test_the_device_backend_refreshes_between_epochs_without_scann(tmp_path):
  wd = tmp_path / "wd"
  cmd = demo_command_line(wd, tmp_path / "data") + [
    *SMALLER,
    "--config.negatives.refresh_backend=device",
  ]
  env = cpu_child_env(1)
  env["PYTHONPATH"] = f"{_hidden_scann(tmp_path)}{os.pathsep}{REPO}"
  r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
  log = r.stdout + r.stderr
  assert r.returncode == 0, log[-3000:]
  assert index.SCANN_MISSING not in log  # the device backend needs no ScaNN
  with open(wd / "results.json") as f:
    results = json.load(f)
  refreshes = results["negatives"]["refreshes"]
  assert refreshes and all(s["ok"] and s["in_process"] and s["recall"] == 1.0 for s in refreshes)
  # Training waits for an in-process refresh by design: that is not a late refresh.
  assert not any(results["degraded"].values()), results["degraded"]
