"""The negative-sampling strategies: one frozen record per strategy, in one registry.

A strategy is data. Every module that behaves differently per strategy (the schedule, the
config's validation, the trainer's choice of step and sampler, the memory planner) reads
the fields of the strategy's record; none compares strategy names. A new strategy is one
`register(Strategy(...))` call, here or in the code that needs it (tests do so).

The built-in records are the paper's Algorithm 1 (`random+w_hard`) and the ablations of
its negative-sampling table; schedule.py says what each does epoch by epoch.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

from astra_jax.runtime.errors import InputError


class IndexOver(enum.Enum):
  """What a strategy's ANN index holds, refreshed on Algorithm 1's schedule."""

  NOTHING = "nothing"  # no index: no hard negatives, or mined inside the step
  CLASSIFIER = "W"  # the classifier rows w_l
  LABEL_TEXT = "E"  # the encoder's embeddings of the label texts, E(z_l)


class HardShare(enum.Enum):
  """How an epoch from tau_s on divides its T = k_h + k_r negatives per query."""

  NONE = "none"  # T random
  FIXED = "fixed"  # k_h hard + k_r random
  ALL = "all"  # T hard, no random
  CURRICULUM = "curriculum"  # the hard share rises from k_h / T to a final fraction


@dataclasses.dataclass(frozen=True)
class Strategy:
  """What a negative-sampling strategy is, as the trainer needs to know it.

  Attributes:
    name: the value of `config.negatives.strategy`.
    description: what the strategy trains with, in one line (its documentation).
    index_over: what the refreshed ANN index holds (NOTHING: no refreshes).
    hard_share: how the negatives per query divide into hard and random from tau_s on.
    mined_in_step: hard negatives are the exact top-k_h under the current W and E(x),
      re-mined inside every step (the `uptodate` oracle; O(B L) per step).
    full_loss: the full-L BCE over every label replaces the sampled estimator.
    dense_update_only: trains only with the dense single-device step (autodiff w.r.t.
      all of W), whatever `optim.classifier_update` says.
    needs_all_positives: batches carry every positive of a query (`all_pos_ids`), not only
      the k_p sampled: the full loss and in-step mining must not treat one as a negative.
    allows_hard_only: k_r = 0 is accepted (hard negatives alone: the biased hard-only
      objective of the paper's Figure 1, not an unbiased estimate of the full-L BCE).
  """

  name: str
  description: str
  index_over: IndexOver = IndexOver.NOTHING
  hard_share: HardShare = HardShare.NONE
  mined_in_step: bool = False
  full_loss: bool = False
  dense_update_only: bool = False
  needs_all_positives: bool = False
  allows_hard_only: bool = False

  def __post_init__(self):
    refreshed = self.index_over is not IndexOver.NOTHING
    sourced, hard = refreshed or self.mined_in_step, self.hard_share is not HardShare.NONE
    problems = [
      (refreshed and self.mined_in_step, "mines in the step and from an index"),
      (hard and not sourced, "has hard negatives but no source (index_over or mined_in_step)"),
      (sourced and not hard, "has a hard-negative source but no hard negatives (hard_share)"),
      (
        self.mined_in_step and self.hard_share is not HardShare.FIXED,
        "mines in the step, which trains a fixed k_h hard + k_r random split",
      ),
      (
        (self.mined_in_step or self.full_loss) and not self.dense_update_only,
        "mines in the step or trains the full loss, which only the dense step does",
      ),
      (
        (self.mined_in_step or self.full_loss) and not self.needs_all_positives,
        "mines in the step or trains the full loss without every positive",
      ),
      (
        self.full_loss and self.hard_share is not HardShare.NONE,
        "trains the full loss, which ignores sampled negatives",
      ),
      (
        self.allows_hard_only and self.hard_share is HardShare.NONE,
        "allows k_r = 0 without hard negatives",
      ),
    ]
    for broken, what in problems:
      if broken:
        raise ValueError(f"strategy {self.name!r} {what}")

  @property
  def uses_index(self) -> bool:
    """Whether the strategy refreshes an ANN index on Algorithm 1's schedule."""
    return self.index_over is not IndexOver.NOTHING


_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
  """Adds a strategy under its name.

  Args:
    strategy: the record; its name must be new.
  Returns:
    The record.
  Raises:
    ValueError: the name is taken.
  """
  if strategy.name in _REGISTRY:
    raise ValueError(f"strategy {strategy.name!r} is already registered")
  _REGISTRY[strategy.name] = strategy
  return strategy


def unregister(name: str) -> None:
  """Removes a registered strategy (tests that register their own clean up with it)."""
  del _REGISTRY[name]


def names(where: Callable[[Strategy], bool] | None = None) -> tuple[str, ...]:
  """The registered strategies' names, in registration order.

  Args:
    where: keeps only the strategies whose record it accepts (None: all).
  Returns:
    The names.
  """
  return tuple(n for n, s in _REGISTRY.items() if where is None or where(s))


def get(name: str) -> Strategy:
  """The record of `config.negatives.strategy`.

  Args:
    name: a registered strategy's name.
  Returns:
    Its record.
  Raises:
    InputError: no strategy has that name (the message lists the registered ones).
  """
  try:
    return _REGISTRY[name]
  except KeyError:
    raise InputError(
      f"config.negatives.strategy: unknown strategy {name!r}; choose from {', '.join(_REGISTRY)}"
    ) from None


_W, _E = IndexOver.CLASSIFIER, IndexOver.LABEL_TEXT
for _strategy in (
  Strategy("random", "T uniform random negatives per query"),
  Strategy(
    "random+w_hard",
    "ASTRA: k_h hard from an index over W + k_r random",
    index_over=_W,
    hard_share=HardShare.FIXED,
  ),
  Strategy(
    "random+e_hard",
    "k_h hard from an index over label-text embeddings + k_r random",
    index_over=_E,
    hard_share=HardShare.FIXED,
  ),
  Strategy(
    "w_hard",
    "T hard from an index over W (k_r = 0: the paper's stale strategy)",
    index_over=_W,
    hard_share=HardShare.ALL,
    allows_hard_only=True,
  ),
  Strategy(
    "e_hard",
    "T hard from an index over label-text embeddings",
    index_over=_E,
    hard_share=HardShare.ALL,
    allows_hard_only=True,
  ),
  Strategy(
    "curriculum",
    "hard from an index over W, their share rising to a final fraction",
    index_over=_W,
    hard_share=HardShare.CURRICULUM,
  ),
  Strategy(
    "curriculum+e_hard",
    "the curriculum over hard negatives from label-text embeddings",
    index_over=_E,
    hard_share=HardShare.CURRICULUM,
  ),
  Strategy(
    "uptodate",
    "k_h hard re-mined in every step with the current W and E(x), exact "
    "(small L only) + k_r random",
    hard_share=HardShare.FIXED,
    mined_in_step=True,
    dense_update_only=True,
    needs_all_positives=True,
    allows_hard_only=True,
  ),
  Strategy(
    "full",
    "no sampling: the full-L BCE over every label (Renee-style, O(L) per step)",
    full_loss=True,
    dense_update_only=True,
    needs_all_positives=True,
  ),
):
  register(_strategy)
del _strategy
