"""What a run's numbers rest on when the trainer fell back from the configured computation.

Each fallback is a warning line when it happens and a count here; the record travels in the
checkpoint's progress record (so it survives resume) and ends in results.json as
"degraded". All zeros: the run did what its config says. (No checkpoint is ever skipped:
a save that cannot be written stops the run, see faults.py.)
"""

from __future__ import annotations

import dataclasses

from absl import logging

from astra_jax.runtime import faults
from astra_jax.runtime.errors import InputError

# A pipelined refresh is launched an epoch ahead; the loop waiting longer than this for it at
# the epoch's start means it was late (its wait otherwise is the load of the file, ms).
LATE_REFRESH_S = 1.0


@dataclasses.dataclass
class Degraded:
  """Counts of fallbacks; every field an int, a new field defaults to 0 for old records."""

  refreshes_failed: int = 0  # the epoch kept the previous (or random) negatives
  refreshes_late: int = 0  # training waited over LATE_REFRESH_S for a refresh
  epochs_random_for_hard: int = 0  # the schedule wanted hard negatives, none existed
  epochs_without_their_refresh: int = 0  # the newest refresh due had failed: the epoch
  # trained on older (or random) negatives
  evals_on_subset: int = 0  # evaluations on the first test rows only (eval.max_test_rows,
  # eval.final_max_rows)
  checkpoints_set_aside: int = 0  # damaged at resume: moved to checkpoints/damaged/
  # refreshes whose ScaNN index was an exact search: ScaNN is not installed (ann/index.py)
  refreshes_exact_without_scann: int = 0

  def note(self, field: str, message: str, *args) -> None:
    """Counts one fallback of kind `field` and logs `message % args` as a warning."""
    setattr(self, field, getattr(self, field) + 1)
    logging.warning(message, *args)

  def to_json(self) -> dict[str, int]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, record: dict | None) -> Degraded:
    """A saved record (None: a checkpoint written before there was one)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: int(v) for k, v in (record or {}).items() if k in known})


class RefreshFailedStop(InputError):
  """A refresh failed and `negatives.on_refresh_failure=fail`: the run stops in one line
  (the checkpoint before the epoch still lists the refresh, so a rerun retries it)."""


def note_epoch_start(
  degraded: Degraded,
  hard_negatives,
  refreshes_before: int,
  epoch: int,
  pipelined: bool,
  split: dict,
  on_failure: str = "continue",
) -> None:
  """After HardNegatives.start_epoch: counts a failed or late refresh among the refreshes it
  added (from index `refreshes_before`), and hard negatives the schedule wanted but the
  epoch trains without (random ones in their place).

  The refresh manager already warns of a failure in its own line. A refresh whose output
  could not be written for lack of space stops the run instead (faults.DiskFull): resuming
  reruns it from its inputs. pipelined: the refresh ran beside the previous epoch (a
  synchronous one always waits). on_failure: `negatives.on_refresh_failure`; "fail" raises
  RefreshFailedStop at a failed refresh instead of training on.

  Every epoch whose newest scheduled refresh is missing says so in a warning line and is
  counted (epochs_without_their_refresh): a failure is never one line scrolled away."""
  for stats in hard_negatives.refreshes[refreshes_before:]:
    code = faults.disk_error_in_text(stats.get("error", ""))
    if not stats.get("ok") and code is not None:
      k = len(hard_negatives.shards) * hard_negatives.schedule.mined_k()
      lo, hi = hard_negatives.query_rows
      raise faults.DiskFull(hard_negatives.dir, 4 * (hi - lo) * k, code)
    if not stats.get("ok"):
      if on_failure == "fail":
        raise RefreshFailedStop(
          f"negatives: the refresh for epoch {stats.get('epoch')} failed "
          f"({stats.get('error')}); negatives.on_refresh_failure=fail stops the run. Rerun "
          "the same command to retry it from the last checkpoint, or pass "
          "--config.negatives.on_refresh_failure=continue to train on with the previous "
          "negatives"
        )
      degraded.refreshes_failed += 1
    elif stats.get("exact_without_scann"):
      # Counted only: the run said once, as it started, that it searches exactly.
      degraded.refreshes_exact_without_scann += 1
    # An in-process refresh (negatives.refresh_backend=device) runs while training waits.
    late = pipelined and not stats.get("in_process") and stats.get("wait_s", 0.0) > LATE_REFRESH_S
    if stats.get("ok") and late:
      degraded.note(
        "refreshes_late",
        "negatives: the refresh for epoch %d was late: training waited %.1fs for it",
        epoch,
        stats["wait_s"],
      )
  due = [r for r in hard_negatives.schedule.refresh_epochs if r <= epoch]
  if due and hard_negatives.current_epoch != due[-1]:
    degraded.note(
      "epochs_without_their_refresh",
      "negatives: epoch %d trains with %s: the refresh for epoch %d failed",
      epoch,
      "random negatives"
      if hard_negatives.current_epoch is None
      else f"the negatives of the refresh for epoch {hard_negatives.current_epoch}",
      due[-1],
    )
  wanted, _ = hard_negatives.schedule.split(epoch, True)
  if wanted and not split.num_hard:
    degraded.note(
      "epochs_random_for_hard",
      "negatives: epoch %d trains with random negatives "
      "in place of its %d hard ones (no hard negatives yet)",
      epoch,
      wanted,
    )
