"""The lexical terms' indexes of a trained model (xc/lexical.py), built after training from
the dataset's texts.

Like the neighbour vote's memories (neighbour_memory.py), the choice of the weights and the
validation split read an index over the training rows alone; the final evaluation and the
export read one over the training rows and then the validation rows. The choice's index is
built in a background thread while the vote's memory is embedded and the model's weights
are read: it is host work (scikit-learn's analysers, scipy's products) that the device's
work leaves room for.
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import Future, ThreadPoolExecutor

from absl import logging

from astra_jax.data import validation
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.evaluation import baselines
from astra_jax.runtime.errors import InputError
from astra_jax.training.trainer import Trainer
from astra_jax.xc import lexical


def wanted(scoring) -> bool:
  """Whether a `scoring` section's score may hold a lexical term: a weight or a choice
  above 0."""
  return any(
    scoring.get(f"lexical_{term}_weight", 0.0)
    or any(scoring.get(f"lexical_{term}_weight_choices", ()))
    for term in ("label_text", "neighbour")
  )


@dataclasses.dataclass(frozen=True)
class LexicalIndexes:
  """Attributes:
  pending_choice: the terms of the validation rows from the training rows, being taken in
    a background thread (None without a validation split); `choice` waits for them.
  row_texts, row_labels: the rows the final index votes with: the training rows, then the
    validation rows.
  label_texts: every label's text.
  test_texts: the test split's texts, in its row order.
  k, temperature: the row vote's settings.
  """

  pending_choice: Future | None
  row_texts: list[str]
  row_labels: SparseRows | StackedRows
  label_texts: list[str]
  test_texts: list[str]
  k: int
  temperature: float

  @property
  def choice(self) -> lexical.TermVotes | None:
    """The validation rows' terms, once taken (an error in taking them is raised here)."""
    return None if self.pending_choice is None else self.pending_choice.result()

  @functools.cached_property
  def final(self) -> lexical.LexicalIndex:
    """The index the test split and the export read, built on first use (a choice of
    weights 0 never builds it)."""
    return lexical.LexicalIndex.build(self.row_texts, self.label_texts, self.row_labels)

  @functools.cached_property
  def test(self) -> lexical.TermVotes:
    """The terms of the test rows from `final`, taken on first use."""
    return self.final.votes(self.test_texts, self.k, self.temperature)


def lexical_indexes(trainer: Trainer) -> LexicalIndexes | None:
  """The indexes, or None when the config's score never holds a lexical term.

  Args:
    trainer: the finished trainer.
  Returns:
    The indexes.
  Raises:
    InputError: the dataset has no label texts, or its texts do not match the rows the
      trainer read.
  """
  p = trainer.parts
  cfg = p.config
  if not wanted(cfg.scoring):
    return None
  everything = baselines.load_texts(
    cfg.data.dir, cfg.data.layout, cfg.data.get("use_content", False)
  )
  if everything.label_texts is None:
    raise InputError(f"{cfg.data.dir}: scoring.lexical_* needs the labels' texts")
  if len(everything.test_texts) != p.data.test_labels.num_rows:
    raise InputError(
      f"{cfg.data.dir}: {len(everything.test_texts)} test texts for "
      f"{p.data.test_labels.num_rows} test rows"
    )
  k, tau = int(cfg.scoring.neighbours), float(cfg.scoring.neighbour_temperature)
  pending = None
  rows, labels = everything.train_texts, everything.train_labels
  if p.eval_data is not p.data:
    # The rows data.validation_fraction holds out, as the trainer's split takes them.
    keep, val = validation.split_rows(
      len(everything.train_texts), validation.SplitSpec.from_config(cfg.data)
    )
    train_texts = [everything.train_texts[i] for i in keep]
    val_texts = [everything.train_texts[i] for i in val]
    train_labels = validation.take_rows(everything.train_labels, keep)
    val_labels = validation.take_rows(everything.train_labels, val)

    def choice_terms() -> lexical.TermVotes:
      index = lexical.LexicalIndex.build(train_texts, everything.label_texts, train_labels)
      terms = index.votes(val_texts, k, tau)
      logging.info(
        "lexical terms: %d training rows vote for %d validation rows",
        len(train_texts),
        len(val_texts),
      )
      return terms

    pool = ThreadPoolExecutor(1, thread_name_prefix="lexical")
    pending = pool.submit(choice_terms)
    pool.shutdown(wait=False)
    # Then the training rows, then the validation rows, as the vote's final memory.
    rows = train_texts + val_texts
    labels = StackedRows(train_labels, val_labels)
  return LexicalIndexes(
    pending, rows, labels, everything.label_texts, everything.test_texts, k, tau
  )
