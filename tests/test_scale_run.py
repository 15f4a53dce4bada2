"""benchmarks/scale_run.py end to end at a tiny size: its JSON record, the mid-epoch kill
and resume, and the resumed run's metrics against an uninterrupted run's."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_scale_run_records_every_phase_and_a_resume_equal_to_an_uninterrupted_run(tmp_path):
  out = tmp_path / "scale.json"
  r = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "benchmarks", "scale_run.py"),
      "--num_labels=2000",
      "--num_train=1024",
      "--num_test=300",
      "--predict_queries=2",
      "--set=train.batch_size=256",
      f"--work_dir={tmp_path / 'work'}",
      f"--out={out}",
    ],
    cwd=REPO,
    env={**os.environ, "PYTHONPATH": REPO},
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  record = json.loads(out.read_text())
  assert record["num_labels"] == 2000 and record["num_train"] == 1024
  assert record["num_test"] == 300 and record["epochs"] == 3
  phases = record["phases"]
  for name in (
    "prepare",
    "train_killed",
    "train_resumed",
    "final_evaluation",
    "export",
    "train_reference",
    "predict",
  ):
    assert phases[name]["seconds"] >= 0 and phases[name]["peak_rss_bytes"] > 0, name
  # The refresh ran (and was sampled) in the killed run, which reached epoch tau_s = 2.
  assert phases["train_killed"]["refresh_worker_peak_rss_bytes"] > 0
  assert len(record["refreshes"]) == 1
  refresh = record["refreshes"][0]
  assert refresh["ok"] and refresh["epoch"] == 2 and refresh["num_queries"] == 1024
  assert 0.0 <= refresh["recall"] <= 1.0 and refresh["build_s"] >= 0
  # 1024 // 256 = 4 steps per epoch: killed after the checkpoint at step 2 * 4 + 2, inside
  # epoch 2, and resumed from it.
  assert record["steps_per_epoch"] == 4
  assert record["kill_after_checkpoint_step"] == 10
  assert record["resumed_from_step"] == 10
  assert record["steps"] == 12
  assert record["resume_metrics_equal"] is True
  assert record["metrics"] == record["reference_metrics"]
  assert set(record["metrics"]) >= {"P@1", "P@5"}
  assert set(record["popularity_baseline"]) >= {"P@1", "P@5"}
  assert len(record["predictions"][0]["ids"]) == 5
