"""float16 with dynamic loss scaling: a step the scaling skips (non-finite loss or
gradients) is counted and logged, and stops the run only when a whole log window is
skipped; encoder.matmul_precision is applied and recorded."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from astra_jax.config import base as config_base
from astra_jax.negatives.schedule import NegativeSplit
from astra_jax.parallel import sharding
from astra_jax.training import train, train_log


def _fp16_config(small_synthetic):
  c = small_synthetic()
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 64, 0
  c.train.log_every_steps = 5
  c.optim.warmup_steps = 20
  c.negatives.strategy = "random"
  c.encoder.dtype = "float16"  # dynamic loss scaling (optim.loss_scale = 0)
  c.checkpoint.enabled = False
  return c


def _overflow_at(monkeypatch, steps):
  """The batches of the given (0-based) steps get an infinite random-negative weight, so
  their loss and gradients are not finite: what a float16 overflow does to a step."""
  original, calls = sharding.shard_batch, [0]

  def shard_batch(batch, mesh):
    if calls[0] in steps:
      labels = batch.labels
      batch = batch._replace(
        labels=labels._replace(rand_weight=np.full_like(labels.rand_weight, np.inf))
      )
    calls[0] += 1
    return original(batch, mesh)

  monkeypatch.setattr(sharding, "shard_batch", shard_batch)


@pytest.mark.e2e
def test_a_skipped_step_on_a_log_step_is_logged_not_fatal(tmp_path, monkeypatch, small_synthetic):
  c = _fp16_config(small_synthetic)
  _overflow_at(monkeypatch, {9})  # step 10 is a log step (every 5)
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert r["steps"] == 2300 // 64
  assert r["matmul_precision"] == "default"
  lines = [json.loads(x) for x in (tmp_path / "wd" / "metrics.jsonl").read_text().splitlines()]
  train_lines = [x for x in lines if x["kind"] == "train"]
  tenth = next(x for x in train_lines if x["step"] == 10)
  assert tenth["loss"] is None and tenth["skipped_steps"] == 1
  # Real float16 overflows may skip a few more (the scale starts at 2^15 and halves on
  # each); every line's loss is finite unless the line's last step was skipped.
  assert r["skipped_steps"] == sum(x.get("skipped_steps", 0) for x in train_lines)
  assert all(x["loss"] is None or np.isfinite(x["loss"]) for x in train_lines)
  assert r["P@1"] > r["popularity_baseline"]["P@1"]


@pytest.mark.e2e
def test_a_log_window_of_skipped_steps_stops_the_run(tmp_path, monkeypatch, small_synthetic):
  c = _fp16_config(small_synthetic)
  _overflow_at(monkeypatch, {5, 6, 7, 8, 9})  # the whole second window (steps 6-10)
  with pytest.raises(FloatingPointError, match="all 5 steps up to epoch 0 step 10 were skipped"):
    train.train_and_evaluate(c, str(tmp_path / "wd"))


def test_train_log_counts_skipped_steps_per_window(tmp_path):
  c = config_base.base_config()
  c.train.log_every_steps, c.train.batch_size = 4, 32
  batches = SimpleNamespace(steps_per_epoch=12, wait_seconds=0.0)
  log = train_log.TrainLog(str(tmp_path / "metrics.jsonl"), c, batches, total_steps=12)
  negatives = NegativeSplit(num_hard=0, num_random=8, random_columns=8)
  log.start(0, skipped_total=2)  # two skipped before this epoch (a resumed run)
  log.report(
    epoch=0, step=3, global_step=4, loss_value=float("inf"), negatives=negatives, skipped_total=3
  )
  log.report(epoch=0, step=7, global_step=8, loss_value=0.5, negatives=negatives, skipped_total=3)
  first, second = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert (first["loss"], first["skipped_steps"]) == (None, 1)
  assert second["loss"] == 0.5 and "skipped_steps" not in second
  with pytest.raises(FloatingPointError, match="all 4 steps"):
    log.report(
      epoch=0,
      step=11,
      global_step=12,
      loss_value=float("nan"),
      negatives=negatives,
      skipped_total=7,
    )


def test_matmul_precision_is_validated_and_kept_by_old_workdirs():
  from astra_jax.training import run_config

  c = config_base.base_config()
  c.data.dir, c.data.tokenizer_dir = "/x", "/y"
  c.encoder.matmul_precision = "tf32"
  with pytest.raises(
    ValueError,
    match=r"config.encoder.matmul_precision: use one of default, "
    r"high, highest, got 'tf32'",
  ):
    config_base.validate(c)
  # A workdir recorded before the key existed resumes with its default.
  now = json.loads(config_base.base_config().to_json())
  saved = json.loads(config_base.base_config().to_json())
  del saved["encoder"]["matmul_precision"], saved["train"]["hang_timeout_s"]
  del saved["negatives"]["refresh_threads"], saved["eval"]["progress_rows"]
  assert run_config.config_diff(saved, now) == []
