"""Training curves as TensorBoard event files, so `tensorboard --logdir=WORKDIR` shows them.

Written with tensorboardX (a small writer of the event-file format; no TensorFlow) from the
records training also writes to metrics.jsonl:

  train/loss, train/lr_encoder, train/lr_classifier, train/input_wait, train/queries_per_s
      every progress line, at its global step;
  <split>/<metric> (e.g. validation/P_at_1, test/PSP_at_5, test/kNN-E_P_at_1)
      every evaluation, at the global step of the epoch it follows (a tag allows no `@` and
      no space: `P@1` is written `P_at_1`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorboardX import SummaryWriter

TRAIN_SCALARS = ("loss", "lr_encoder", "lr_classifier", "input_wait", "queries_per_s")
# Fields of an evaluation record that say when and on what it ran, not how well.
EVAL_CONTEXT = ("epoch", "train_time_s", "split")


def metric_tag(name: str) -> str:
  """A metric's TensorBoard tag: "P@1" -> "P_at_1", "kNN-E P@1" -> "kNN-E_P_at_1"."""
  return name.replace("@", "_at_").replace(" ", "_")


class EventLog:
  """Writes metrics.jsonl records as TensorBoard scalars into one directory.

  The event file is opened at the first record. When that is a progress line, TensorBoard's
  purge step is its step: a resumed run's curves then replace what the interrupted run had
  logged from there on (both log at the same steps of an epoch) instead of doubling back over
  them. A rerun of a finished run only evaluates again: it adds its evaluations and purges
  nothing (the last progress line shares the final evaluation's step).
  """

  def __init__(self, logdir: str, steps_per_epoch: int):
    """Args:
    logdir: where the event file goes (the workdir).
    steps_per_epoch: places an evaluation after epoch e at global step e x this.
    """
    self.logdir, self.steps_per_epoch = logdir, steps_per_epoch
    self._writer = None

  def write(self, record: Mapping[str, Any]) -> None:
    """Writes one record ({"kind": "train" | "eval", ...}, as in metrics.jsonl) and flushes
    it: a line every few hundred steps costs nothing, and a killed run keeps its curves."""
    if record["kind"] == "train":
      step, scalars = record["step"], {f"train/{k}": record.get(k) for k in TRAIN_SCALARS}
    elif record["kind"] == "eval":
      step = record["epoch"] * self.steps_per_epoch
      scalars = {
        f"{record['split']}/{metric_tag(k)}": v
        for k, v in record.items()
        if k not in EVAL_CONTEXT and k != "kind"
      }
    else:
      return
    if self._writer is None:
      self._writer = SummaryWriter(
        self.logdir, purge_step=step if record["kind"] == "train" else None
      )
    for tag, value in scalars.items():
      if isinstance(value, (int, float)):  # a non-finite loss is None: no point
        self._writer.add_scalar(tag, value, step)
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None
