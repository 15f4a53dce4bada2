"""The final evaluation, resumable: it records its progress so a preempted run goes on
from there instead of starting over (at SS-120M's scale it takes hours).

The test set is evaluated `eval.progress_rows` rows at a time (embed, exact top-k, filter,
metrics.row_sums); after each block the rows done and the metrics' partial sums are written
atomically to `<workdir>/final_eval_progress.json`, tagged with the global step of the
trained state they belong to (a record of another state is ignored). A stop request
(SIGTERM) is honoured after a block, and the rerun starts after the last block recorded;
the blocks, and so the sums, are the same as an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from absl import logging

from astra_jax.data import xc_format
from astra_jax.evaluation import metrics
from astra_jax.runtime import distributed

PROGRESS_FILE = "final_eval_progress.json"


@dataclasses.dataclass
class EvalProgress:
  """How far the final evaluation of one trained state got."""

  global_step: int  # the trained state evaluated
  rows_done: int  # test rows [0, rows_done) are in `sums`
  sums: dict[str, float]  # metrics.row_sums over those rows

  def save(self, path: str) -> None:
    with xc_format.atomic_text_writer(path) as f:
      json.dump(dataclasses.asdict(self), f)

  @classmethod
  def load(cls, path: str, global_step: int) -> EvalProgress:
    """The record at `path` if it belongs to `global_step`, else a fresh start."""
    try:
      with open(path) as f:
        saved = cls(**json.load(f))
    except (OSError, ValueError, TypeError):
      saved = None
    if saved is None or saved.global_step != global_step:
      return cls(global_step, 0, {})
    return saved


class EvalInterrupted(Exception):
  """A stop was requested during the final evaluation; its progress is recorded."""


def evaluate(
  block_sums: Callable[[int, int], dict[str, float]],
  num_rows: int,
  ks: tuple[int, ...],
  progress_rows: int,
  workdir: str,
  global_step: int,
  stop_requested: Callable[[], bool],
) -> dict[str, float]:
  """The test set's metrics (x100), resumed from `workdir`'s progress record.

  Args:
    block_sums: (lo, hi) -> metrics.row_sums of test rows [lo, hi), summed over every
      process (evaluation.ModelEvaluator.block_sums).
    num_rows: the test rows.
    ks: the metrics' cut-offs.
    progress_rows: test rows per recorded block (config.eval.progress_rows).
    workdir: where the progress record lives (written by the leader).
    global_step: the trained state's step, which the record must match.
    stop_requested: polled after each block (compared across processes: all stop alike).
  Returns:
    metrics.as_percent of the whole test set.
  Raises:
    EvalInterrupted: after recording the progress, when a stop was requested.
  """
  path = os.path.join(workdir, PROGRESS_FILE)
  progress = EvalProgress.load(path, global_step)
  n = num_rows
  if progress.rows_done > n:  # recorded under a larger eval.final_max_rows: start over
    progress = EvalProgress(global_step, 0, {})
  if progress.rows_done:
    logging.info("final evaluation: resuming after %d of %d test rows", progress.rows_done, n)
  while progress.rows_done < n:
    hi = min(progress.rows_done + progress_rows, n)
    sums = block_sums(progress.rows_done, hi)
    progress = EvalProgress(global_step, hi, metrics.add_sums(progress.sums, sums))
    if distributed.is_leader():
      progress.save(path)
    if hi < n and distributed.any_true([stop_requested()])[0]:
      raise EvalInterrupted(
        f"final evaluation stopped after {hi} of {n} test rows (progress recorded)"
      )
  return metrics.as_percent(metrics.from_sums(progress.sums, n, ks))


def clear(workdir: str) -> None:
  """Removes the progress record (the results are written: a rerun evaluates anew)."""
  path = os.path.join(workdir, PROGRESS_FILE)
  if distributed.is_leader() and os.path.exists(path):
    os.remove(path)
