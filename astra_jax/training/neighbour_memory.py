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
import os

import numpy as np

from astra_jax.ann.mesh_memory import MemorySource
from astra_jax.ann.vote_cache import VoteCache
from astra_jax.ann.vote_memory import VoteMemory
from astra_jax.data.sparse_rows import StackedRows
from astra_jax.evaluation import ranking
from astra_jax.runtime import distributed
from astra_jax.training.trainer import Trainer

# The validation rows' votes, in each process's directory until the last evaluation of them.
VOTE_CACHE_DIR = "vote_cache"


@dataclasses.dataclass(frozen=True)
class VoteMemories:
  """Attributes:
  final: the training rows, then the validation rows: what the test split and the export
    read; split over the mesh's devices (ann/mesh_memory.py), or over the processes'
    hosts where the devices have no room for it (ann/process_memory.py,
    evaluation/ranking.vote_memory).
  train_rows: how many of its rows are the original training rows.
  validation_cache: each process's votes from `choice` for the validation rows it ranks,
    taken by the first evaluation of them and read by the next (the same for every weight:
    the choice's candidates and the validation split's evaluation share them); written to
    the process's directory (`vote_cache/`) and removed once the last evaluation has read
    them (results.evaluate_and_export).
  """

  final: VoteMemory
  train_rows: int
  validation_cache: VoteCache = dataclasses.field(default_factory=VoteCache)

  @property
  def has_validation(self) -> bool:
    return self.final.num_rows > self.train_rows

  @functools.cached_property
  def choice(self) -> VoteMemory:
    """The original training rows (what the choice and the validation split read): the
    same keys, the validation rows left out."""
    return self.final.head(self.train_rows)


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
  n = p.data.num_train_original
  sources = [MemorySource(p.data.train_tokens, np.arange(n))]
  labels = p.data.train_labels.head(n)
  if p.eval_data is not p.data:  # without a validation split the test rows are never memory
    sources.append(MemorySource(p.eval_data.test_tokens))
    labels = StackedRows(labels, p.eval_data.test_labels)  # views: the data holds both
  memory = ranking.vote_memory(p.mesh, p.embed_fn, trainer.state.params, sources, labels, p.config)
  cache = VoteCache(os.path.join(distributed.process_dir(p.workdir), VOTE_CACHE_DIR))
  cache.clear()  # a crashed run's blocks
  return VoteMemories(memory, n, cache)
