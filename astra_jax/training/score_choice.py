"""The fused score's label-text weight, chosen after training on the validation split.

How much the label texts should weigh in the score (`xc/score_fusion.py`) is a property of
the dataset, not of the method: on debian-recommends-20k, where items recommend items whose
texts they resemble, the texts alone rank at validation P@1 45 and the mix at beta 0.5
reads 52 against W's 45; on debian-builddeps-33k, where a package's build-dependencies
are rarely like it, the texts alone rank at 16 and beta 0.5 costs 4 points against W alone
(docs/results/builddeps.md). With `scoring.label_text_weight_choices`, the trained model is
scored on the validation split (`data.validation_fraction`) once per candidate weight, and
the one with the highest P@1 (the first listed on a tie) is the model's score from then on:
the final evaluation on the test split, the export and the Predictor use it. Nothing is
retrained, and the test split is never read to choose.

Cost: one pass of the encoder over the label texts (shared by the candidates) and one
evaluation of the validation split per candidate, exact over all L as the periodic
evaluations: for the small real datasets the fused score is for.
"""

from __future__ import annotations

import copy
import dataclasses

from absl import logging

from astra_jax.evaluation import ranking
from astra_jax.training.trainer import Trainer

CHOSEN_BY = "P@1"


@dataclasses.dataclass(frozen=True)
class ScoreChoice:
  """What the choice read and chose.

  Attributes:
    by: the validation metric it maximised.
    candidates: ((weight, that metric on the validation split), ...) in the config's order.
    chosen: the weight the model now ranks by.
  """

  by: str
  candidates: tuple[tuple[float, float], ...]
  chosen: float

  def to_json(self) -> dict:
    return {
      "split": "validation",
      "by": self.by,
      "candidates": [{"label_text_weight": w, self.by: m} for w, m in self.candidates],
      "label_text_weight": self.chosen,
    }


def choose_label_text_weight(trainer: Trainer) -> ScoreChoice | None:
  """Scores the trained model on the validation split with each candidate weight and sets
  `config.scoring.label_text_weight` (in memory) to the best one.

  Args:
    trainer: the finished trainer (its parts' config, validation data and state).
  Returns:
    The choice, or None when the config lists no candidates.
  """
  p = trainer.parts
  weights = tuple(float(w) for w in p.config.scoring.get("label_text_weight_choices", ()))
  if not weights:
    return None
  params = trainer.state.params
  # E(z_l) depends on the encoder only: embedded once for every candidate above 0.
  texts = None
  if any(weights):
    texts = ranking.embed_label_texts(p.embed_fn, params, p.eval_data, p.config)
  read = []
  for weight in weights:
    cfg = copy.deepcopy(p.config)
    cfg.scoring.label_text_weight = weight
    metrics = ranking.evaluate_model(
      p.mesh, p.embed_fn, params, p.eval_data, cfg, p.inv_prop, label_text_embeddings=texts
    )
    read.append((weight, float(metrics[CHOSEN_BY])))
    logging.info("label-text weight %.2f: validation %s %.2f", weight, CHOSEN_BY, read[-1][1])
  best = max(m for _, m in read)
  chosen = next(w for w, m in read if m == best)
  p.config.scoring.label_text_weight = chosen
  logging.info("scoring.label_text_weight=%.2f chosen on the validation split", chosen)
  return ScoreChoice(CHOSEN_BY, tuple(read), chosen)
