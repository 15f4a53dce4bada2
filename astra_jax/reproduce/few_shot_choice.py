"""The few-shot update's setting, chosen on a validation split (`reproduce --table=grow`).

A grown model is trained on for one short run with every training pair, the new labels'
included (`train.init_from`). What that run trains, and how fast, is a choice: only the new
rows (the encoder and every old row frozen: the old labels' predictions cannot move), the
whole classifier, or everything, at the config's learning rates or a multiple of them. The
protocol trains each candidate on the training rows less a validation share, scores P@5 on
the validation rows that have a held-out label (the rows the update is for), and the best
candidate (the first listed on a tie) is the one trained on every row and scored on the test
split. The test split plays no part in the choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from astra_jax.data import validation
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import metrics
from astra_jax.serving.predictor import Predictor
from astra_jax.training.few_shot import UPDATES, FewShot

VALIDATION_FRACTION = 0.1


# `extend --update`'s settings (training/few_shot.py), and two at other learning rates.
_NEW_ROWS, _CLASSIFIER, _ALL = (UPDATES[n] for n in ("new_rows", "classifier", "all"))
CANDIDATES = (
  _NEW_ROWS,
  dataclasses.replace(_NEW_ROWS, name="new_rows_lr3", lr_scale=3.0),
  _CLASSIFIER,
  _ALL,
  dataclasses.replace(_ALL, name="all_lr0.3", lr_scale=0.3),
)


class ValidationRows(NamedTuple):
  """The validation rows a choice is scored on: their texts and labels (the dataset's ids),
  those with a held-out label only."""

  texts: list[str]
  truth: SparseRows


def validation_rows(
  train_texts: list[str],
  train_labels: SparseRows,
  is_held: np.ndarray,
  split: validation.SplitSpec,
) -> ValidationRows:
  """The rows `split` (`data.validation_*`) holds out of the training rows
  (data/validation.py), kept where one of a row's labels is held out (`is_held`, (L,)
  bool)."""
  _, rows = validation.split_rows(len(train_texts), split)
  rows = [int(r) for r in rows if is_held[train_labels.row(int(r))].any()]
  truth = SparseRows.from_lists([train_labels.row(r).tolist() for r in rows], len(is_held))
  return ValidationRows([train_texts[r] for r in rows], truth)


def validation_p5(workdir: str, rows: ValidationRows) -> float:
  """P@5 (percent) of WORKDIR's exported model on `rows` (exact search; a row's own item
  left out as the training run did)."""
  pred = Predictor.from_workdir(workdir, index="exact").predict(rows.texts, k=5).ids
  return round(metrics.as_percent(metrics.compute(pred, rows.truth, None, (5,)))["P@5"], 2)


def choose(
  candidates: tuple[FewShot, ...],
  train_candidate: Callable[[FewShot], str],
  rows: ValidationRows,
  log: Callable[[str], None] = print,
) -> tuple[FewShot, dict[str, float]]:
  """The candidate with the best validation P@5 (the first listed on a tie).

  Args:
    candidates: the settings to compare.
    train_candidate: trains one on the training rows less the validation share, returning
      its workdir.
    rows: the validation rows with a held-out label.
    log: progress lines.
  Returns:
    (the chosen setting, {name: validation P@5} of every candidate).
  """
  p5 = {}
  for c in candidates:
    p5[c.name] = validation_p5(train_candidate(c), rows)
    log(f"few-shot setting {c.name}: validation P@5 {p5[c.name]:.2f} on {len(rows.texts)} rows")
  best = max(candidates, key=lambda c: p5[c.name])  # max keeps the first of equals
  return best, p5
