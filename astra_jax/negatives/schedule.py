"""Which negatives each epoch trains with: the paper's Algorithm 1 and the ablation
strategies of its negative-sampling table, as pure functions of the epoch.

Every strategy (strategies.py: one record each) uses the same number of negatives per
query, T = k_h + k_r, divided by the record's `hard_share`:
  NONE        T random (`random`; `full` ignores sampled negatives: the full-L BCE)
  FIXED       k_h hard + k_r random (`random+w_hard`, ASTRA; `random+e_hard`; `uptodate`,
              whose k_h are re-mined inside every step with the current W and E(x))
  ALL         T hard, no random (`w_hard`, `e_hard`)
  CURRICULUM  the hard share rises linearly from k_h/T at tau_s to
              `curriculum_final_hard_fraction` at the last epoch, the rest random
              (`curriculum`, `curriculum+e_hard`)
The hard negatives come from an index over W or over the label-text embeddings E(z_l)
(the record's `index_over`), or from mining in the step.
Before tau_s every strategy trains with T random negatives.
k_r = 0 is allowed for the strategies whose hard negatives stand alone (`allows_hard_only`):
`uptodate` with k_r = 0 is the paper's Figure 1 oracle (the k_h hardest up-to-date negatives
only), `w_hard` with k_r = 0 its stale strategy (T = k_h hardest stale ones). With no random
draws the estimator's random term is absent: the loss is the positives' terms plus the hard
negatives' at weight 1, the biased hard-only objective the figure compares, not an
unbiased estimate of the full-L BCE. Index strategies refresh where
Algorithm 1 writes it, at every epoch t >= tau_s with t mod tau_r = 0, and also at tau_s
itself: from tau_s on the algorithm trains with "the most recent sample" of hard negatives,
which a tau_s that is not a multiple of tau_r would otherwise not have. (tau_s = 5: tau_r =
5 refreshes at 5, 10, 15, ...; tau_r = 10 at 5, 10, 20, ...; tau_s = 10, tau_r = 20 at 10,
20, 40, ....) The refresh for epoch e collects query embeddings during epoch e-2, snapshots
W at its end, and mines during epoch e-1.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from astra_jax.negatives import strategies
from astra_jax.negatives.strategies import HardShare, IndexOver, Strategy


class NegativeSplit(NamedTuple):
  """An epoch's negatives per W shard, as the sampler draws them.

  num_hard: hard negatives that train (h); the batch's hard columns past h are masked.
  num_random: uniform random draws (r).
  random_columns: random columns in the batch (>= r; the extra ones masked), so that the
    batches of every epoch of a curriculum share one shape.
  """

  num_hard: int
  num_random: int
  random_columns: int


@dataclasses.dataclass(frozen=True)
class NegativeSchedule:
  """The epochs' hard/random split and refresh epochs of one strategy's record."""

  strategy: Strategy
  k_h: int
  k_r: int
  tau_s: int
  tau_r: int
  epochs: int
  curriculum_final_hard_fraction: float = 0.5

  @classmethod
  def from_config(cls, config) -> NegativeSchedule:
    """The schedule of `config.negatives` over `config.train.epochs` epochs.

    Raises:
      InputError: `negatives.strategy` names no registered strategy.
    """
    nc = config.negatives
    return cls(
      strategies.get(nc.strategy),
      nc.k_h,
      nc.k_r,
      nc.tau_s,
      nc.tau_r,
      config.train.epochs,
      nc.curriculum_final_hard_fraction,
    )

  @property
  def total(self) -> int:
    return self.k_h + self.k_r

  @property
  def uses_index(self) -> bool:
    return self.strategy.uses_index

  @property
  def is_curriculum(self) -> bool:
    return self.strategy.hard_share is HardShare.CURRICULUM

  @property
  def index_over(self) -> IndexOver:
    """What the refreshed index holds (the record's field)."""
    return self.strategy.index_over

  @property
  def refresh_epochs(self) -> list[int]:
    if not self.uses_index:
      return []
    every = max(self.tau_r, 1)
    return [t for t in range(self.tau_s, self.epochs) if t == self.tau_s or t % every == 0]

  def collect_epoch(self, refresh_epoch: int) -> int | None:
    """The epoch whose forward passes provide the refresh's query embeddings (None: the
    refresh has no earlier epoch to pipeline from and runs synchronously)."""
    e = refresh_epoch - 2
    return e if e >= 0 else None

  def refresh_collected_in(self, epoch: int) -> int | None:
    """The refresh epoch whose inputs are collected during `epoch`, if any."""
    r = epoch + 2
    return r if r in self.refresh_epochs else None

  def source(self, epoch: int) -> int | None:
    """The refresh whose negatives `epoch` trains with (None: random only)."""
    past = [r for r in self.refresh_epochs if r <= epoch]
    return past[-1] if past else None

  def columns(self, epoch: int, have_hard: bool) -> tuple[int, int]:
    """(hard, random) columns per query and shard in `epoch`'s batches: the split, except
    for the curricula, whose batches keep one shape from tau_s on (mined_k hard, T - k_h
    random, the columns beyond the epoch's split masked) so that their step compiles once,
    not once per epoch."""
    h, r = self.split(epoch, have_hard)
    if self.is_curriculum and h:
      return self.mined_k(), self.total - self.k_h
    return h, r

  def mined_k(self) -> int:
    """Columns each refresh mines."""
    if self.strategy.hard_share is HardShare.ALL:
      return self.total
    if self.is_curriculum:
      return max(self.k_h, round(self.curriculum_final_hard_fraction * self.total))
    return self.k_h

  def split(self, epoch: int, have_hard: bool) -> tuple[int, int]:
    """(hard, random) negatives per query in `epoch`."""
    share = self.strategy.hard_share
    if share is HardShare.NONE or epoch < self.tau_s:
      return 0, self.total
    if self.strategy.mined_in_step:  # its hard negatives exist in every step
      return self.k_h, self.k_r
    if not have_hard:
      return 0, self.total
    if share is HardShare.ALL:
      return self.total, 0
    if self.is_curriculum:
      last = max(self.epochs - 1, self.tau_s + 1)
      f0 = self.k_h / self.total
      f = f0 + (self.curriculum_final_hard_fraction - f0) * (epoch - self.tau_s) / (
        last - self.tau_s
      )
      h = min(self.mined_k(), max(0, round(f * self.total)))
      return h, self.total - h
    return self.k_h, self.k_r
