"""The neighbour vote's memories of a trained model (xc/neighbour_vote.py), embedded once
after training.

The score's choice (score_choice.py) and the evaluation of the validation split vote with
the training rows alone, so that no validation row finds itself; once the choice is made,
the validation rows are labelled data like any other, and the final evaluation and the
export vote with both (the held-out 10% of the recipe's rows then count for the test set).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from astra_jax.evaluation import ranking
from astra_jax.training.trainer import Trainer
from astra_jax.xc.neighbour_vote import Memory


@dataclasses.dataclass(frozen=True)
class VoteMemories:
  """Attributes:
  choice: the original training rows (what the choice and the validation split read).
  final: those and the validation rows (what the test split and the export read).
  """

  choice: Memory
  final: Memory


def vote_memories(trainer: Trainer) -> VoteMemories | None:
  """The memories of the trained state, or None when the config's score never votes
  (`scoring.neighbour_weight` 0 and no candidate above it).

  Args:
    trainer: the finished trainer.
  Returns:
    The memories (`final` is `choice` without a validation split).
  """
  p = trainer.parts
  sc = p.config.scoring
  if not sc.get("neighbour_weight", 0.0) and not any(sc.get("neighbour_weight_choices", ())):
    return None
  params = trainer.state.params
  n = p.data.num_train_original
  choice = ranking.vote_memory(
    p.embed_fn, params, p.data.train_tokens[np.arange(n)], p.data.train_labels.head(n), p.config
  )
  if p.eval_data is p.data:  # no validation split: the test rows are never memory
    return VoteMemories(choice, choice)
  held = ranking.vote_memory(
    p.embed_fn, params, p.eval_data.test_tokens, p.eval_data.test_labels, p.config
  )
  return VoteMemories(choice, choice.plus(held))
