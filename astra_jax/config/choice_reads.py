"""What the score choice reads (training/score_choice.py), from `config.scoring`'s lists:
its passes over W in order, and the weight rows each pass mixes. The choice reads them and
the planner prices them (plan/choice_time.py), so both count from here.

  shapes   one pass of every `label_text_shape_choices` entry at every label-text weight
           above 0, without the vote (the kernel takes each row's scale and shift);
  model    the label-text and neighbour weights: one pass of every pair with
           `choose_jointly` (and both lists), else one pass per list that has candidates;
  lexical  one pass of every lexical pair (g, h) with g + h < 1, the model's weights fixed.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ChoicePass:
  """One read of the validation split: one pass of the encoder over its rows and one over W.

  Attributes:
    name: what it chooses, in words.
    weight_rows: the weight rows it mixes and ranks by (each its own top-k).
    label_texts: whether some row weighs the label texts (the pass takes E(z_l)'s product).
    votes: whether some row weighs the neighbour vote.
    lexical: whether the rows weigh the lexical terms (their TF-IDF products on the host).
  """

  name: str
  weight_rows: int
  label_texts: bool
  votes: bool = False
  lexical: bool = False


def text_shapes(sc) -> list[tuple[float, float]]:
  """The (scale, shift) candidates of `label_text_shape_choices`."""
  return [(float(x), float(t)) for x, t in sc.get("label_text_shape_choices", ())]


def shape_weights(sc) -> list[float]:
  """The label-text weights a shape is read at: the listed ones above 0, else the config's
  own weight when above 0; none: the shapes are not read."""
  betas = [float(w) for w in sc.get("label_text_weight_choices", ()) if w > 0]
  weight = float(sc.get("label_text_weight", 0.0))
  return betas or ([weight] if weight else [])


def lexical_candidates(sc) -> list[tuple[float, float]]:
  """Every (g, h) of the config's lexical choices (a list left empty: its weight alone)
  that leaves the model a share, g + h < 1; none when neither list has candidates."""
  gs = tuple(float(w) for w in sc.get("lexical_label_text_weight_choices", ()))
  hs = tuple(float(w) for w in sc.get("lexical_neighbour_weight_choices", ()))
  if not gs and not hs:
    return []
  gs = gs or (float(sc.get("lexical_label_text_weight", 0.0)),)
  hs = hs or (float(sc.get("lexical_neighbour_weight", 0.0)),)
  return [(g, h) for g in gs for h in hs if g + h < 1]


def choice_passes(sc) -> list[ChoicePass]:
  """The score choice's passes, in the order it reads them (module docstring).

  Args:
    sc: `config.scoring`.
  Returns:
    The passes; none when the config lists no candidates.
  """
  passes = []
  betas, shapes = shape_weights(sc), text_shapes(sc)
  if betas and shapes:
    passes.append(ChoicePass("label-text shapes x weights", len(shapes) * len(betas), True))
  texts = tuple(sc.get("label_text_weight_choices", ()))
  votes = tuple(sc.get("neighbour_weight_choices", ()))
  # After a choice, a weight is one of its candidates: the largest bounds what later
  # passes weigh.
  weighs_texts = bool(max(texts, default=0.0) or (not texts and sc.get("label_text_weight", 0.0)))
  if sc.get("choose_jointly", False) and texts and votes:
    passes.append(
      ChoicePass("label-text x neighbour weights", len(texts) * len(votes), weighs_texts, True)
    )
  else:
    if texts:
      passes.append(ChoicePass("label-text weights", len(texts), weighs_texts))
    if votes:
      passes.append(ChoicePass("neighbour weights", len(votes), weighs_texts, True))
  weighs_votes = bool(max(votes, default=0.0) or (not votes and sc.get("neighbour_weight", 0.0)))
  if pairs := lexical_candidates(sc):
    passes.append(ChoicePass("lexical weights", len(pairs), weighs_texts, weighs_votes, True))
  return passes
