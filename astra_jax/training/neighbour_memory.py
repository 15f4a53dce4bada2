"""The neighbour vote's memories of a trained model (xc/neighbour_vote.py), embedded once
after training.

The score's choice (score_choice.py) and the evaluation of the validation split vote with
the training rows alone, so that no validation row finds itself; once the choice is made,
the validation rows are labelled data like any other, and the final evaluation and the
export vote with both (the held-out 10% of the recipe's rows then count for the test set).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from astra_jax.ann.sharded_topk import VoteCache
from astra_jax.ann.vote_memory import Memory
from astra_jax.evaluation import ranking
from astra_jax.training.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class VoteMemories:
  """Attributes:
  choice: the original training rows (what the choice and the validation split read).
  validation: the validation rows, None without a validation split.
  validation_cache: each process's votes from `choice` for the validation rows it ranks,
    taken by the first evaluation of them and read by the next (the same for every weight:
    the choice's candidates and the validation split's evaluation share them).
  """

  choice: Memory
  validation: Memory | None = None
  validation_cache: VoteCache = dataclasses.field(default_factory=VoteCache)

  @functools.cached_property
  def final(self) -> Memory:
    """The training rows, then the validation rows: what the test split and the export
    read."""
    return self.choice if self.validation is None else self.choice.plus(self.validation)


def vote_memories(trainer: Trainer) -> VoteMemories | None:
  """The memories of the trained state, or None when the config's score never votes
  (`scoring.neighbour_weight` 0 and no candidate above it). Each row is embedded once.

  Args:
    trainer: the finished trainer.
  Returns:
    The memories.
  """
  p = trainer.parts
  sc = p.config.scoring
  if not sc.get("neighbour_weight", 0.0) and not any(sc.get("neighbour_weight_choices", ())):
    return None
  params = trainer.state.params
  n = p.data.num_train_original
  choice = ranking.vote_memory(
    p.mesh,
    p.embed_fn,
    params,
    p.data.train_tokens,
    np.arange(n),
    p.data.train_labels.head(n),
    p.config,
  )
  if p.eval_data is p.data:  # no validation split: the test rows are never memory
    return VoteMemories(choice)
  val = p.eval_data
  held = ranking.vote_memory(
    p.mesh,
    p.embed_fn,
    params,
    val.test_tokens,
    np.arange(len(val.test_tokens)),
    val.test_labels,
    p.config,
  )
  return VoteMemories(choice, held)
