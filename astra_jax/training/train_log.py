"""The training loop's progress output: console lines and metrics.jsonl records."""

from __future__ import annotations

import json
import time

import ml_collections
import numpy as np
from absl import logging

from astra_jax.negatives.schedule import NegativeSplit
from astra_jax.training import optim
from astra_jax.training.pipeline import TrainBatches
from astra_jax.training.tensorboard_log import EventLog


class TrainLog:
  """Progress output: a line every `train.log_every_steps` steps and at each epoch's end
  (loss; queries/s and the share of the time the loop waited for input since the last line;
  learning rates; ETA), each also a JSON line in `path` (metrics.jsonl), as are evaluations.

  Steps that dynamic loss scaling skipped (non-finite gradients or loss: float16 overflow;
  the step changed nothing but the scale) are counted per line. A non-finite loss stops the
  run only where nothing skipped it (no dynamic scaling), and skipped steps only when every
  step of a line's window was skipped: then the scale is not recovering."""

  def __init__(
    self,
    path: str,
    config: ml_collections.ConfigDict,
    batches: TrainBatches,
    total_steps: int,
    tensorboard_dir: str | None = None,
  ):
    self.f = open(path, "a")
    # The same records as TensorBoard curves (tensorboard_log.py), where given.
    self.events = EventLog(tensorboard_dir, batches.steps_per_epoch) if tensorboard_dir else None
    self.config, self.batches, self.total_steps = config, batches, total_steps
    self.every = config.train.log_every_steps  # read every step: not through ConfigDict

  def start(self, step: int, skipped_total: int = 0) -> None:
    """The next line's window opens at `step` (of the epoch), `skipped_total` steps of the
    run skipped so far."""
    self.window_step, self.t, self.waited = step, time.time(), self.batches.wait_seconds
    self.skipped_before = skipped_total

  def due(self, step: int) -> bool:
    return (step + 1) % self.every == 0 or step + 1 == self.batches.steps_per_epoch

  def report(
    self,
    epoch: int,
    step: int,
    global_step: int,
    loss_value: float,
    negatives: NegativeSplit,
    skipped_total: int = 0,
  ) -> None:
    """The line for the window that ends after `step`; `skipped_total`: the run's steps
    skipped by dynamic loss scaling so far. Raises FloatingPointError as the class says."""
    dt = max(time.time() - self.t, 1e-9)
    n = step + 1 - self.window_step
    skipped = skipped_total - self.skipped_before
    qps = n * self.config.train.batch_size / dt
    eta = (self.total_steps - global_step) * dt / max(n, 1)
    lr_e, lr_c = optim.learning_rates(self.config.optim, self.total_steps, global_step)
    input_wait = (self.batches.wait_seconds - self.waited) / dt  # the device idle
    logging.info(
      "epoch %d step %d/%d loss %.4f | %.0f queries/s | input wait %.1f%% | "
      "lr %.2e/%.2e | negatives %d hard + %d random | ETA %s%s",
      epoch,
      step + 1,
      self.batches.steps_per_epoch,
      loss_value,
      qps,
      100 * input_wait,
      lr_e,
      lr_c,
      negatives.num_hard,
      negatives.num_random,
      time.strftime("%H:%M:%S", time.gmtime(eta)),
      f" | {skipped} of {n} steps skipped (non-finite float16 gradients; loss scale lowered)"
      if skipped
      else "",
    )
    if skipped >= n:
      raise FloatingPointError(
        f"all {n} steps up to epoch {epoch} step {step + 1} were skipped for non-finite "
        "gradients: dynamic loss scaling is not recovering (try encoder.dtype=float32 or "
        "bfloat16, or a lower learning rate)"
      )
    if not np.isfinite(loss_value) and not skipped:
      raise FloatingPointError(f"loss is {loss_value} at epoch {epoch} step {step + 1}")
    record = dict(
      kind="train",
      epoch=epoch,
      step=global_step,
      loss=loss_value if np.isfinite(loss_value) else None,
      queries_per_s=qps,
      input_wait=round(input_wait, 4),
      lr_encoder=lr_e,
      lr_classifier=lr_c,
    )
    if skipped:
      record["skipped_steps"] = skipped
    self.write(**record)
    self.start(step + 1, skipped_total)

  def write(self, **record) -> None:
    self.f.write(json.dumps(record) + "\n")
    self.f.flush()
    if self.events is not None:
      self.events.write(record)
