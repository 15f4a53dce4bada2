"""End to end: the main job on a small synthetic set, and xc_text.py on a dataset in the
NGAME raw layout written here with English words (tokenised by all-MiniLM's tokenizer)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from astra_jax.ann import exact_topk
from astra_jax.config import base as config_base
from astra_jax.data import sparse_rows, xc_format
from astra_jax.evaluation import ranking
from astra_jax.negatives.schedule import NegativeSplit
from astra_jax.serving import export
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train, train_log


@pytest.mark.e2e
def test_main_job_on_small_synthetic_data(tmp_path, load_config):
  c = load_config("experiments/demo.py")
  c.data.dir = str(tmp_path / "data")
  c.data.synthetic.num_labels = 300
  c.data.synthetic.num_train = 1500
  c.data.synthetic.num_test = 500
  c.train.epochs = 3
  c.train.batch_size = 64
  c.train.eval_every_epochs = 2
  c.train.profile_steps = 3
  c.optim.warmup_steps = 20
  c.mesh.data, c.mesh.model = -1, 2  # W split in two, the batch over all 8 fake devices
  c.eval.final_max_rows = 400
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  saved = json.loads((tmp_path / "wd" / "results.json").read_text())
  assert saved["num_test_evaluated"] == 400 and saved["degraded"]["evals_on_subset"] == 1
  # The sharded final evaluation against the exported model ranked by the unsharded exact
  # kernel (exact_topk.topk) over the same 400 rows.
  data, _ = train.load_splits(c)
  model = export.load_model(str(tmp_path / "wd"))
  emb = Predictor(model, index="exact").encode(np.asarray(data.test_tokens[:400]))
  ranked = exact_topk.topk(emb, model.classifier, 5)[1]
  dense = ranking.rank_filter_score(
    lambda k: ranked,
    data.test_labels.head(400),
    data.test_filter[data.test_filter[:, 0] < 400],
    None,
    (1, 3, 5),
  )
  for key, value in dense.items():
    assert abs(r[key] - value) < 1e-3, (key, r[key], value)
  for key in (
    "data_dir",
    "train_time_s",
    "epochs",
    "num_labels",
    "num_train",
    "num_test",
    "strategy",
    "config",
    "P@1",
    "nDCG@3",
    "PSP@5",
    "PSnDCG@5",
    "popularity_baseline",
  ):
    assert key in saved, key
  assert saved["num_labels"] == 300 and saved["num_train"] == 1500 and saved["num_test"] == 500
  assert saved["config"]["train"]["epochs"] == 3
  assert r["P@1"] > 2 * r["popularity_baseline"]["P@1"] + 5
  assert len(r["evaluations"]) == 2
  breakup = json.loads((tmp_path / "wd" / "time_breakup.json").read_text())
  for k in (
    "data_prep",
    "host_to_device",
    "encoder_forward",
    "classifier_forward",
    "loss",
    "backward_update",
  ):
    assert breakup[k] is not None and breakup[k] >= 0
  lines = [json.loads(l) for l in (tmp_path / "wd" / "metrics.jsonl").read_text().splitlines()]
  assert any(l["kind"] == "train" for l in lines) and lines[-1]["kind"] == "eval"


@pytest.mark.slow
def test_xc_text_trains_on_a_repository_layout_dataset(tmp_path, ngame_dataset, repo_root):
  d = tmp_path / "ds"
  ngame_dataset(d)
  wd = tmp_path / "wd"
  cmd = [
    sys.executable,
    "-m",
    "astra_jax.main",
    "--config=experiments/xc_text.py:tiny",
    f"--config.data.dir={d}",
    f"--workdir={wd}",
    "--config.train.epochs=6",
    "--config.train.batch_size=64",
    "--config.negatives.k_r=16",
    "--config.negatives.k_h=4",
    "--config.optim.warmup_steps=20",
    "--config.train.eval_every_epochs=0",
    "--config.data.max_len=12",
  ]
  r = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "label popularity" in r.stdout and "P@1" in r.stdout
  res = json.loads((wd / "results.json").read_text())
  assert res["num_labels"] == 48 and res["num_train"] == 1500
  assert res["num_train_with_label_texts"] == 1548  # label texts appended
  assert res["P@1"] > res["popularity_baseline"]["P@1"] + 20


@pytest.mark.slow
def test_xc_text_default_uses_pretrained_minilm(tmp_path, ngame_dataset, load_config):
  d = tmp_path / "ds"
  ngame_dataset(d, n_train=240, n_test=100)
  c = load_config("experiments/xc_text.py")
  c.data.dir = str(d)
  c.data.max_len = 12
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 32, 0
  c.negatives.k_r, c.negatives.k_h = 32, 4
  c.optim.warmup_steps = 5
  # The recipe's stages, shortened: one warm-start epoch of 64 pairs per step (its 10 of
  # 512 are minutes of MiniLM on a CPU), then W from the label texts and the fused score.
  c.warmstart.epochs, c.warmstart.batch_size = 1, 64
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert r["stage_seconds"]["warm_start"] > 0 and r["encoder"]["name"] == "all-MiniLM-L6-v2"
  # 9 steps from the pretrained encoder already beat popularity by far (83 against 1).
  assert r["P@1"] > r["popularity_baseline"]["P@1"] + 20


def test_bad_config_key_and_missing_data_fail_clearly(tmp_path, repo_root):
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.main",
      "--config=experiments/demo.py",
      "--config.train.epochz=3",
    ],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode != 0 and "epochz" in r.stderr
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.main",
      "--config=experiments/xc_text.py",
      f"--config.data.dir={tmp_path}",
      f"--workdir={tmp_path / 'wd'}",
    ],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode != 0 and "no dataset found in" in r.stderr


def test_texts_and_labels_of_different_lengths(tmp_path, ngame_dataset, load_config):
  d = tmp_path / "ds"
  ngame_dataset(d)
  lines = (d / "raw_data" / "test.raw.txt").read_text().splitlines()
  (d / "raw_data" / "test.raw.txt").write_text("\n".join(lines[:-1]) + "\n")
  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir = str(d)
  with pytest.raises(
    sparse_rows.XCFormatError, match=r"test\.raw\.txt: 199 texts but tst_X_Y\.txt has 200"
  ):
    train.train_and_evaluate(c, str(tmp_path / "wd"))


def test_validation_names_the_field():
  c = config_base.base_config()
  c.data.dir = "/x"
  c.data.tokenizer_dir = "/y"
  c.negatives.strategy = "nope"
  with pytest.raises(ValueError, match=r"config.negatives.strategy: unknown strategy 'nope'"):
    config_base.validate(c)
  c.negatives.strategy, c.train.input_threads = "random", 0
  with pytest.raises(ValueError, match=r"config.train.input_threads: must be >= 1, got 0"):
    config_base.validate(c)


@pytest.mark.e2e
def test_hard_negatives_follow_the_schedule_in_training(tmp_path, small_synthetic):
  c = small_synthetic(tau_s=2, tau_r=1)
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  neg = r["negatives"]
  assert neg["strategy"] == "random+w_hard"
  assert [e["source"] for e in neg["per_epoch"]] == [None, None, 2, 3]
  assert [(e["hard"], e["random"]) for e in neg["per_epoch"]] == [
    (0, 272),
    (0, 272),
    (16, 256),
    (16, 256),
  ]
  assert [x["epoch"] for x in neg["refreshes"]] == [2, 3] and all(x["ok"] for x in neg["refreshes"])
  for x in neg["refreshes"]:
    assert {"build_s", "search_s", "recall", "wait_s"} <= set(x)
  # Only the negatives in use remain on disk; the refresh inputs are gone.
  # The positives are the label cache's memmaps, named in train_labels.json, not copied.
  assert sorted(os.listdir(tmp_path / "wd" / "negatives")) == [
    "hard_epoch3.npy",
    "train_labels.json",
  ]
  hard = np.load(tmp_path / "wd" / "negatives" / "hard_epoch3.npy")
  labels = xc_format.read_sparse(tmp_path.parent / "small_synthetic" / "trn_X_Y.txt")
  assert hard.shape == (2300, 16)  # label-text rows included
  for i in range(0, 2000, 7):
    assert not set(hard[i]) & set(labels.row(i))
  assert r["P@1"] > r["popularity_baseline"]["P@1"] + 20


@pytest.mark.e2e
def test_failed_refresh_keeps_training_on_previous_negatives(tmp_path, small_synthetic):
  c = small_synthetic(tau_s=2, tau_r=1, inject_fault="kill")
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  refreshes = r["negatives"]["refreshes"]
  assert not refreshes[0]["ok"] and "killed by signal 9" in refreshes[0]["error"]
  assert refreshes[1]["ok"]  # the next period retried
  assert [e["source"] for e in r["negatives"]["per_epoch"]] == [None, None, None, 3]
  assert r["steps"] == 4 * (2300 // 64)


@pytest.mark.e2e
def test_failed_later_refresh_keeps_the_earlier_negatives(tmp_path, small_synthetic):
  # Refreshes at 1 (synchronous), 2 and 3; the first pipelined one (for epoch 2) is killed.
  c = small_synthetic(tau_s=1, tau_r=1)
  c.train.epochs = 4
  from astra_jax.negatives import manager

  original = manager.HardNegatives._job
  calls = []

  def job(self, epoch):
    j = original(self, epoch)
    calls.append(epoch)
    if epoch == 2:
      j.fault = "raise"
    return j

  manager.HardNegatives._job = job
  try:
    r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  finally:
    manager.HardNegatives._job = original
  ok = {x["epoch"]: x["ok"] for x in r["negatives"]["refreshes"]}
  assert ok == {1: True, 2: False, 3: True}
  assert [e["source"] for e in r["negatives"]["per_epoch"]] == [None, 1, 1, 3]


@pytest.mark.slow
def test_training_on_a_mesh_with_per_shard_negatives(tmp_path, small_synthetic):
  # (1, 8): 300 labels padded to 304 rows, 8 shards of 38, one index per shard; gradient
  # accumulation over 2 micro-batches of 32 queries (4 per device).
  c = small_synthetic(tau_s=2, tau_r=1, k_h=4, k_r=32)
  c.train.epochs = 3
  c.mesh.data, c.mesh.model = 1, 8
  c.train.grad_accum_steps = 2
  r = train.train_and_evaluate(c, str(tmp_path / "mesh"))
  assert r["mesh"] == {"data": 1, "model": 8} and r["grad_accum_steps"] == 2
  assert [(e["hard"], e["random"]) for e in r["negatives"]["per_epoch"]][-1] == (4, 32)
  assert all(x["ok"] for x in r["negatives"]["refreshes"])
  hard = np.load(tmp_path / "mesh" / "negatives" / "hard_epoch2.npy")
  assert hard.shape == (2300, 8 * 4)
  blocks = hard.reshape(-1, 8, 4)
  for s in range(8):  # block s holds shard s's rows only
    assert ((blocks[:, s] >= 38 * s) & (blocks[:, s] < min(38 * (s + 1), 300))).all()
  # The per-step equivalence with the single-device step is in test_sharding.py; here the
  # model must learn (popularity P@1 on this data is ~10).
  assert r["P@1"] > 40, r["P@1"]


def test_train_log_lines_and_a_non_finite_loss(tmp_path, monkeypatch):
  from types import SimpleNamespace

  c = config_base.base_config()
  c.train.log_every_steps, c.train.batch_size = 4, 32
  c.optim.warmup_steps = 0
  batches = SimpleNamespace(steps_per_epoch=10, wait_seconds=0.0)
  now = [100.0]
  monkeypatch.setattr(train_log.time, "time", lambda: now[0])
  log = train_log.TrainLog(str(tmp_path / "metrics.jsonl"), c, batches, total_steps=20)
  log.start(0)
  assert [s for s in range(10) if log.due(s)] == [3, 7, 9]  # every 4 steps and the last
  now[0] += 2.0
  batches.wait_seconds = 0.5
  negatives = NegativeSplit(num_hard=8, num_random=64, random_columns=64)
  log.report(epoch=0, step=3, global_step=4, loss_value=0.25, negatives=negatives)
  line = json.loads((tmp_path / "metrics.jsonl").read_text())
  # No warmup, cosine decay over 20 steps: at step 4, 0.5 (1 + cos(pi 4 / 20)) of the peak.
  decayed = 0.5 * (1 + math.cos(math.pi * 4 / 20))
  assert line.pop("lr_encoder") == pytest.approx(c.optim.encoder_lr * decayed, rel=1e-6)
  assert line.pop("lr_classifier") == pytest.approx(c.optim.classifier_lr * decayed, rel=1e-6)
  # 4 steps x 32 queries in 2 s; 0.5 s of them waiting for input
  assert line == {
    "kind": "train",
    "epoch": 0,
    "step": 4,
    "loss": 0.25,
    "queries_per_s": 64.0,
    "input_wait": 0.25,
  }
  now[0] += 4.0  # the next window: steps 4-7, 4 s, no waiting
  log.report(epoch=0, step=7, global_step=8, loss_value=0.5, negatives=negatives)
  second = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
  assert (second["queries_per_s"], second["input_wait"]) == (32.0, 0.0)
  with pytest.raises(FloatingPointError, match="loss is nan at epoch 0 step 10"):
    log.report(epoch=0, step=9, global_step=10, loss_value=float("nan"), negatives=negatives)
