"""benchmarks/scale_run.py end to end at a tiny size: its JSON record, the mid-epoch kill
and resume, and the resumed run's metrics against an uninterrupted run's."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from benchmark_import import benchmark_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark(script: str, *args: str) -> None:
  """Runs benchmarks/<script> with args from the repository root; fails with its output."""
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "benchmarks", script), *args],
    cwd=REPO,
    env={**os.environ, "PYTHONPATH": REPO},
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_scale_run_records_every_phase_and_a_resume_equal_to_an_uninterrupted_run(tmp_path):
  out = tmp_path / "scale.json"
  _benchmark(
    "scale_run.py",
    "--num_labels=2000",
    "--num_train=1024",
    "--num_test=300",
    "--predict_queries=2",
    "--set=train.batch_size=256",
    # At the default 0.5 s, on an idle machine, the kill meant for just after checkpoint 10
    # landed after checkpoint 12 in half the runs (this tiny run's steps take ~0.1 s and its
    # checkpoints complete asynchronously); sampling /proc every 0.1 s slows it enough that
    # 4 runs of 4 passed. A kill the trainer itself makes at a step would not race; not built.
    "--poll_s=0.1",
    f"--work_dir={tmp_path / 'work'}",
    f"--out={out}",
  )
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
  # The same work directory read by benchmarks/near_ties.py: every slot of the exact top k
  # gets a class, and a trained query's top 8 holds some of its positives.
  ties = tmp_path / "ties.jsonl"
  _benchmark(
    "near_ties.py", f"--work_dir={tmp_path / 'work'}", "--k=8", "--num_queries=50", f"--out={ties}"
  )
  row = json.loads(ties.read_text())
  shares = [row[c] for c in ("positive", "group", "topic", "shares_word", "collision", "other")]
  assert sum(shares) == pytest.approx(1.0, abs=1e-3) and row["positive"] > 0


def test_near_ties_classes_by_hand():
  near_ties = benchmark_module("near_ties")
  # Groups of 2 labels, topics of 4. The query's positives 0, 1 (group 0, topic 0); its
  # tokens {10, 11}. Label 1 positive, 0 positive, 3 topic, 8 shares token 11, 9 shares
  # bucket 7 (token 13 -> 7 = token 10's bucket), 12 neither.
  counts = near_ties.classify(
    top=np.array([[1, 0, 3, 8, 9, 12]]),
    positives=[np.array([0, 1])],
    query_tokens=[{10, 11}],
    label_tokens={1: {10}, 0: {11}, 3: {12}, 8: {11, 20}, 9: {13}, 12: {21}},
    bucket_of={10: 7, 11: 8, 12: 9, 13: 7, 20: 1, 21: 2},
    group_size=2,
    topic_size=4,
  )
  assert counts == {
    "positive": 2,
    "group": 0,
    "topic": 1,
    "shares_word": 1,
    "collision": 1,
    "other": 1,
  }
  counts = near_ties.classify(
    top=np.array([[2, 5]]),
    positives=[np.array([4])],
    query_tokens=[{10}],
    label_tokens={2: {10}, 5: {30}},
    bucket_of={10: 7, 30: 3},
    group_size=2,
    topic_size=4,
  )
  assert counts == {  # 5 is in 4's group; 2 is outside its topic and shares token 10
    "positive": 0,
    "group": 1,
    "topic": 0,
    "shares_word": 1,
    "collision": 0,
    "other": 0,
  }
