"""Preemption end to end: SIGTERM reaches the trainer and its refresh worker together (as
SLURM signals every process of a job), while the trainer waits for the refresh, or during
the final evaluation; the rerun resumes to the metrics of an uninterrupted run. And the
hang watchdog."""

import io
import os
import signal
import time

import pytest

from astra_jax.config import base as config_base
from astra_jax.evaluation import final_eval, ranking
from astra_jax.negatives import manager, refresh
from astra_jax.runtime.watchdog import HANG_EXIT_CODE, HangWatchdog
from astra_jax.training import checkpoint, train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = ("P@1", "P@3", "P@5", "nDCG@5", "PSP@1", "PSP@5")


def _config(tmp_path):
  c = config_base.load_config(os.path.join(REPO, "experiments/demo.py"))
  c.data.dir = str(tmp_path.parent / "preemption_synthetic")  # generated once per session
  c.data.synthetic.num_labels = 300
  c.data.synthetic.num_train = 1200
  c.data.synthetic.num_test = 300
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 3, 64, 0
  c.optim.warmup_steps = 20
  c.negatives.update(tau_s=2, tau_r=1, k_h=8, k_r=64)
  c.eval.progress_rows = 120  # the final evaluation in 3 blocks (300 test rows)
  return c


def _same_run(got, want):
  assert {m: got[m] for m in METRICS} == {m: want[m] for m in METRICS}
  assert all(r["ok"] for r in got["negatives"]["refreshes"])
  assert [r["epoch"] for r in got["negatives"]["refreshes"]] == [2]
  assert (
    [e["source"] for e in got["negatives"]["per_epoch"]]
    == [e["source"] for e in want["negatives"]["per_epoch"]]
    == [None, None, 2]
  )
  assert got["steps"] == want["steps"]


@pytest.mark.slow
def test_sigterm_during_a_refresh_and_the_final_evaluation_resume_to_the_same_run(
  tmp_path, monkeypatch
):
  c = _config(tmp_path)
  want = train.train_and_evaluate(c, str(tmp_path / "uninterrupted"))
  wd = str(tmp_path / "wd")

  # 1. The refresh for epoch 2 is launched at the end of epoch 0 and held (SIGSTOP), so
  # that it still runs when the trainer waits for it at the start of epoch 2. Then the
  # job's SIGTERM reaches both processes, and the worker goes on.
  workers = []
  start, start_epoch = refresh.RefreshWorker.start, manager.HardNegatives.start_epoch

  def held_start(self, job, job_path):
    start(self, job, job_path)
    os.kill(self.proc.pid, signal.SIGSTOP)
    workers.append(self.proc)

  def signalled_start_epoch(self, epoch, *args, **kwargs):
    if epoch == 2 and workers:
      proc = workers.pop()
      os.kill(proc.pid, signal.SIGTERM)
      os.kill(os.getpid(), signal.SIGTERM)
      os.kill(proc.pid, signal.SIGCONT)
    return start_epoch(self, epoch, *args, **kwargs)

  monkeypatch.setattr(refresh.RefreshWorker, "start", held_start)
  monkeypatch.setattr(manager.HardNegatives, "start_epoch", signalled_start_epoch)
  with pytest.raises(checkpoint.Preempted, match="stopped by signal 15 at the start of epoch 2"):
    train.train_and_evaluate(c, wd)
  monkeypatch.undo()

  # 2. The rerun resumes the refresh; SIGTERM comes after 2 of the final evaluation's 3
  # blocks of test rows.
  blocks = []
  block_sums = ranking.ModelEvaluator.block_sums

  def signalled_block_sums(self, lo, hi):
    blocks.append((lo, hi))
    if len(blocks) == 2:
      os.kill(os.getpid(), signal.SIGTERM)
    return block_sums(self, lo, hi)

  monkeypatch.setattr(ranking.ModelEvaluator, "block_sums", signalled_block_sums)
  with pytest.raises(checkpoint.Preempted, match="final evaluation stopped after 240 of 300"):
    train.train_and_evaluate(c, wd)
  assert blocks == [(0, 120), (120, 240)]

  # 3. The next rerun evaluates the block left only, to the uninterrupted run's metrics.
  got = train.train_and_evaluate(c, wd)
  assert blocks[2:] == [(240, 300)]
  _same_run(got, want)
  assert not os.path.exists(os.path.join(wd, final_eval.PROGRESS_FILE))


def test_progress_of_another_trained_state_is_not_used(tmp_path):
  path = str(tmp_path / final_eval.PROGRESS_FILE)
  final_eval.EvalProgress(120, 400, {"P@1": 3.0}).save(path)
  assert final_eval.EvalProgress.load(path, 120).rows_done == 400
  assert final_eval.EvalProgress.load(path, 180) == final_eval.EvalProgress(180, 0, {})


def test_the_hang_watchdog_names_the_hang_and_dumps_every_thread():
  out, exits = io.StringIO(), []
  with HangWatchdog(0.3, rank=3, stream=out, exit_fn=exits.append) as dog:
    dog.kick("in epoch 0 step 1")
    for _ in range(4):  # steps that keep coming in time
      time.sleep(0.1)
      dog.kick("in epoch 0 step 2")
    assert not exits
    dog.disarm()  # between steps: no clock
    time.sleep(0.5)
    assert not exits
    dog.kick("in epoch 0 step 3")
    time.sleep(0.8)  # the step hangs
  assert exits == [HANG_EXIT_CODE]
  text = out.getvalue()
  assert text.startswith(
    "error: process 3 made no progress for 0 s while in epoch 0 step 3 (train.hang_timeout_s=0.3)"
  )
  assert "test_the_hang_watchdog_names_the_hang_and_dumps_every_thread" in text  # the stack
