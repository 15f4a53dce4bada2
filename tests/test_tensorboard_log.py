"""TensorBoard curves: event files read back record by record (the TFRecord framing checked
with tensorboardX's own CRC, the events parsed with its protobuf), against the records they
were written from and against metrics.jsonl of a real run through the command line."""

import glob
import json
import os
import re
import struct
import subprocess
import sys
import time

import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from astra_jax.training.tensorboard_log import EventLog

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_events(logdir) -> list[event_pb2.Event]:
  """Every event of every event file in `logdir`, in file order."""
  events = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):  # u64 length, u32 CRC of it, the event, u32 CRC of the event
      header = data[pos : pos + 8]
      (length,) = struct.unpack("<Q", header)
      assert struct.unpack("<I", data[pos + 8 : pos + 12])[0] == masked_crc32c(header)
      body = data[pos + 12 : pos + 12 + length]
      assert struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])[0] == masked_crc32c(
        body
      )
      events.append(event_pb2.Event.FromString(body))
      pos += 16 + length
  return events


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """tag -> [(step, value), ...] in the order written."""
  out = {}
  for event in read_events(logdir):
    for value in event.summary.value:
      out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out


def test_records_become_scalars_at_their_steps(tmp_path):
  log = EventLog(str(tmp_path), steps_per_epoch=10)
  log.write(
    {
      "kind": "train",
      "epoch": 0,
      "step": 4,
      "loss": 0.25,
      "queries_per_s": 64.0,
      "input_wait": 0.125,
      "lr_encoder": 1e-4,
      "lr_classifier": 0.05,
    }
  )
  log.write(
    {
      "kind": "train",
      "epoch": 0,
      "step": 8,
      "loss": None,
      "queries_per_s": 32.0,
      "input_wait": 0.0,
      "lr_encoder": 2e-4,
      "lr_classifier": 0.1,
      "skipped_steps": 4,
    }
  )
  log.write(
    {
      "kind": "eval",
      "epoch": 2,
      "train_time_s": 3.5,
      "split": "validation",
      "P@1": 50.0,
      "nDCG@5": 42.5,
    }
  )
  log.write(
    {
      "kind": "eval",
      "epoch": 3,
      "train_time_s": 5.0,
      "split": "test",
      "P@1": 48.0,
      "kNN-E P@1": 51.0,
    }
  )
  log.close()
  scalars = read_scalars(tmp_path)
  assert scalars == {
    "train/loss": [(4, 0.25)],  # the non-finite loss at step 8 (None) is no point
    "train/queries_per_s": [(4, 64.0), (8, 32.0)],
    "train/input_wait": [(4, 0.125), (8, 0.0)],
    "train/lr_encoder": [(4, pytest.approx(1e-4)), (8, pytest.approx(2e-4))],
    "train/lr_classifier": [(4, pytest.approx(0.05)), (8, pytest.approx(0.1))],
    "validation/P_at_1": [(20, 50.0)],
    "validation/nDCG_at_5": [(20, 42.5)],  # after epoch 2
    "test/P_at_1": [(30, 48.0)],
    "test/kNN-E_P_at_1": [(30, 51.0)],
  }


def _purge_steps(logdir) -> list[int]:
  # TensorBoard drops the points at steps >= a START's step that were written before it.
  return [
    e.step
    for e in read_events(logdir)
    if e.HasField("session_log") and e.session_log.status == e.session_log.START
  ]


def test_a_resumed_run_purges_the_curves_it_replaces(tmp_path):
  first = EventLog(str(tmp_path), steps_per_epoch=10)
  first.write({"kind": "train", "epoch": 0, "step": 5, "loss": 2.0})
  first.close()
  time.sleep(1.1)  # an event file is named by the second it is opened in
  resumed = EventLog(str(tmp_path), steps_per_epoch=10)
  resumed.write({"kind": "train", "epoch": 0, "step": 5, "loss": 1.0})
  resumed.close()
  assert _purge_steps(tmp_path) == [5, 5]
  assert read_scalars(tmp_path)["train/loss"][-1] == (5, 1.0)


def test_a_rerun_that_only_evaluates_keeps_the_last_progress_line(tmp_path):
  finished = EventLog(str(tmp_path), steps_per_epoch=10)
  finished.write({"kind": "train", "epoch": 0, "step": 10, "loss": 2.0})
  finished.write({"kind": "eval", "epoch": 1, "train_time_s": 1.0, "split": "test", "P@1": 9.0})
  finished.close()
  time.sleep(1.1)  # an event file is named by the second it is opened in
  rerun = EventLog(str(tmp_path), steps_per_epoch=10)
  rerun.write({"kind": "eval", "epoch": 1, "train_time_s": 1.0, "split": "test", "P@1": 9.0})
  rerun.close()
  assert _purge_steps(tmp_path) == [10]  # the first run's only
  assert read_scalars(tmp_path)["train/loss"] == [(10, 2.0)]


@pytest.mark.e2e
def test_training_prints_our_lines_and_writes_curves(tmp_path):
  wd = tmp_path / "wd"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.main",
      "--config=experiments/demo.py",
      f"--workdir={wd}",
      f"--config.data.dir={tmp_path / 'data'}",
      "--config.data.synthetic.num_labels=200",
      "--config.data.synthetic.num_train=1000",
      "--config.data.synthetic.num_test=200",
      "--config.train.epochs=2",
      "--config.train.batch_size=64",
      "--config.train.log_every_steps=8",
      "--config.train.eval_every_epochs=1",
      "--config.train.profile_steps=0",
      "--config.optim.warmup_steps=5",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  # The console: astra_jax's own log lines only (orbax's checkpointing, jax's TPU probe: off).
  ours = {
    os.path.basename(p)
    for p in glob.glob(os.path.join(REPO, "astra_jax", "**", "*.py"), recursive=True)
  }
  logged = re.findall(r"^[IWE]\d{4} [\d:.]+ +\d+ (\S+):\d+\] (.*)$", r.stdout + r.stderr, re.M)
  assert logged and {name for name, _ in logged} <= ours, logged
  assert not [line for _, line in logged if "orbax" in line.lower() or "Metadata" in line]
  assert "label popularity" in r.stdout and f"results: {wd}/results.json" in r.stdout
  # The curves: metrics.jsonl's losses at its steps, and every evaluation.
  records = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
  train = [x for x in records if x["kind"] == "train"]
  scalars = read_scalars(wd)
  assert scalars["train/loss"] == [(x["step"], pytest.approx(x["loss"])) for x in train]
  assert [s for s, _ in scalars["train/lr_encoder"]] == [x["step"] for x in train]
  assert [s for s, _ in scalars["train/input_wait"]] == [x["step"] for x in train]
  final = json.loads((wd / "results.json").read_text())
  after_epoch_1, final_p1 = final["evaluations"][0]["P@1"], final["P@1"]
  steps_per_epoch = final["steps"] // 2
  assert scalars["test/P_at_1"] == [
    (steps_per_epoch, pytest.approx(after_epoch_1)),
    (2 * steps_per_epoch, pytest.approx(final_p1)),
  ]
