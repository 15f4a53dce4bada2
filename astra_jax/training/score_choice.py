"""The score's weights, chosen after training on the validation split: the label-text
term's shape and weight (xc/score_fusion.py), then the neighbour vote's
(xc/neighbour_vote.py), then the lexical terms' (xc/lexical.py).

How much the label texts should weigh in the score is a property of the dataset, not of
the method: on debian-recommends-20k, where items recommend items whose texts they
resemble, the texts alone rank at validation P@1 45 and the mix at beta 0.5 reads 52
against W's 45; on debian-builddeps-33k, where a package's build-dependencies are rarely
like it, the texts alone rank at 16 and beta 0.5 costs 4 points against W alone
(docs/results/builddeps.md). The neighbour vote is the other way round: it lifts
debian-builddeps, where W cannot draw a head label's boundary, and costs P@1 on
debian-recommends at any weight. With `scoring.label_text_weight_choices`, the trained
model is scored on the validation split (`data.validation_fraction`) once per candidate
weight, and the one with the highest P@1 (the first listed on a tie; `scoring.choose_by`
names other metrics, summed) is the model's score from then on; then, with that weight,
likewise for `scoring.neighbour_weight_choices`, the vote's memory holding the training
rows only. With `scoring.choose_jointly`, every
pair of the two lists is read instead, and the first best pair is taken: the two terms
interact (where W is weak, the vote wants a larger label-text weight than W alone does,
docs/results/pypi.md), which one weight at a time cannot see. Then, with those fixed, every
(g, h) pair of `scoring.lexical_label_text_weight_choices` and
`scoring.lexical_neighbour_weight_choices` (g + h < 1) is read, and the first best taken:
reading them with the model's weights fixed, 12 pairs instead of 25 x 12 quadruples, costs
about 1.5 P@1 on pypi-keywords' validation split and keeps the choice's time within the
issue's bar (docs/results/lexical.md). The final evaluation on the test split, the export
and the Predictor use every chosen weight. Nothing is retrained, and the test split is
never read to choose.

Before any weight, with `scoring.label_text_shape_choices`, the label-text term's shape
(scale s, shift theta: sigmoid(s (cos - theta))) is chosen: each shape is read at every
label-text weight above 0 without the vote, and the shape whose best read is highest is
kept for the reads after. With theta = 0 the term gives every label whose text points the
query's way at least half its weight, which on debian-depends crowds head labels out of
the top 5; a shifted term keeps only close texts (docs/results/depends.md). The shape is
read with the weights, as two more columns of each kernel row, so every (shape, weight)
pair comes from one pass over W.

Cost: one pass of the encoder over the label texts (shared by the candidates), one over
the training rows (the vote's memory, shared likewise), and one evaluation of the
validation split per list of candidates read together (the label-text weights, the
neighbour weights, their pairs, the lexical pairs), exact over all L as the periodic
evaluations: for the small real datasets these scores are for. In one evaluation the
encoder's pass over the validation rows and W's and the label texts' products are taken
once, and each candidate adds its mix and top-k (evaluation/weight_reads.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from astra_jax.config import choice_reads
from astra_jax.evaluation import ranking, weight_reads
from astra_jax.training.lexical_terms import LexicalIndexes
from astra_jax.training.neighbour_memory import VoteMemories
from astra_jax.training.trainer import Trainer

DEFAULT_CHOOSE_BY = ("P@1",)


@dataclasses.dataclass(frozen=True)
class ScoreChoice:
  """What the choice read and chose.

  Attributes:
    by: the validation metric it maximised (a sum of metrics is named by them joined by +).
    candidates: ((label-text weight, that metric on the validation split), ...) in the
      config's order; () when the config lists none.
    chosen: the label-text weight the model now ranks by.
    neighbour_candidates: ((neighbour weight, that metric), ...), read with `chosen`;
      () when the config lists none.
    neighbour_weight: the neighbour weight the model now ranks by.
    pairs: ((label-text weight, neighbour weight, that metric), ...) when chosen jointly,
      the label-text weights outer; () otherwise.
    lexical_pairs: ((lexical label-text weight, lexical neighbour weight, that metric),
      ...), read with the weights above; () when the config lists none.
    lexical: the lexical weights (g, h) the model now ranks by.
    shapes: ((label-text scale, shift, that metric), ...): each shape's best read over the
      label-text weights above 0 without the vote; () when the config lists none.
    shape: the (scale, shift) the model now ranks by, when shapes were read.
  """

  by: str
  candidates: tuple[tuple[float, float], ...]
  chosen: float
  neighbour_candidates: tuple[tuple[float, float], ...] = ()
  neighbour_weight: float = 0.0
  pairs: tuple[tuple[float, float, float], ...] = ()
  lexical_pairs: tuple[tuple[float, float, float], ...] = ()
  lexical: tuple[float, float] = (0.0, 0.0)
  shapes: tuple[tuple[float, float, float], ...] = ()
  shape: tuple[float, float] | None = None

  def to_json(self) -> dict:
    out = {
      "split": "validation",
      "by": self.by,
      "candidates": [{"label_text_weight": w, self.by: m} for w, m in self.candidates],
      "label_text_weight": self.chosen,
    }
    if self.neighbour_candidates:
      out["neighbour_candidates"] = [
        {"neighbour_weight": w, self.by: m} for w, m in self.neighbour_candidates
      ]
    if self.pairs:
      out["pairs"] = [
        {"label_text_weight": t, "neighbour_weight": v, self.by: m} for t, v, m in self.pairs
      ]
    if self.neighbour_candidates or self.pairs:
      out["neighbour_weight"] = self.neighbour_weight
    if self.lexical_pairs:
      out["lexical_pairs"] = [
        {"lexical_label_text_weight": g, "lexical_neighbour_weight": h, self.by: m}
        for g, h, m in self.lexical_pairs
      ]
      out["lexical_label_text_weight"], out["lexical_neighbour_weight"] = self.lexical
    if self.shapes:
      out["shapes"] = [
        {"label_text_scale": x, "label_text_shift": t, self.by: m} for x, t, m in self.shapes
      ]
      out["label_text_scale"], out["label_text_shift"] = self.shape
    return out


def _first_best(read: list[tuple]) -> tuple | float:
  """The candidate of the first (candidate, metric) with the highest metric."""
  best = max(m for _, m in read)
  return next(w for w, m in read if m == best)


def choose_weights(
  trainer: Trainer,
  memories: VoteMemories | None = None,
  lexical_indexes: LexicalIndexes | None = None,
) -> ScoreChoice | None:
  """Scores the trained model on the validation split with each candidate weight and sets
  `config.scoring.label_text_weight`, then `config.scoring.neighbour_weight`, then the
  lexical weights (in memory), to the best ones.

  Args:
    trainer: the finished trainer (its parts' config, validation data and state).
    memories: the neighbour vote's memories (neighbour_memory.py), needed when the config
      lists neighbour weights: the validation rows' votes from the training rows.
    lexical_indexes: the lexical terms' (lexical_terms.py), needed when the config lists
      lexical weights: the validation rows' terms from the training rows.
  Returns:
    The choice, or None when the config lists no candidates.
  """
  sc = trainer.parts.config.scoring
  lexical_weights = choice_reads.lexical_candidates(sc)
  if not lexical_weights and not (
    sc.get("label_text_weight_choices")
    or sc.get("neighbour_weight_choices")
    or sc.get("label_text_shape_choices")
  ):
    return None
  # E(z_l) depends on the encoder only: embedded once for every candidate.
  texts = _label_texts(trainer)
  shapes = _choose_text_shape(trainer, texts)
  choice = _choose_model_weights(trainer, memories, texts)
  if choice is None and (shapes or lexical_weights):
    choice = ScoreChoice("+".join(_by(sc)), (), float(sc.label_text_weight))
  if shapes:
    shape = (float(sc.label_text_scale), float(sc.label_text_shift))
    choice = dataclasses.replace(choice, shapes=shapes, shape=shape)
  if not lexical_weights:
    return choice
  return _choose_lexical(trainer, memories, texts, lexical_indexes, choice, lexical_weights)


def _by(sc) -> tuple[str, ...]:
  return tuple(sc.get("choose_by", DEFAULT_CHOOSE_BY))


def _logged(by: tuple[str, ...], named: list[tuple], read: list[dict]) -> list[float]:
  """The sum of the `by` metrics of each read, logged beside its named weights
  (((name, weight), ...) per read)."""
  values = [float(sum(m[x] for x in by)) for m in read]
  for weights, value in zip(named, values):
    names = ", ".join(f"{k} {v:.2f}" for k, v in weights)
    logging.info("%s: validation %s %.2f", names, "+".join(by), value)
  return values


def _weight_reads(
  trainer: Trainer, memories: VoteMemories | None, texts: np.ndarray | None, votes: bool
) -> weight_reads.WeightReads:
  """The trained model's reads of the validation split at many weights (`texts`: E(z_l);
  with `votes`, the choice's memory votes and the validation rows' votes are taken once
  and kept for the reads after)."""
  p = trainer.parts
  return weight_reads.WeightReads(
    p.mesh,
    p.embed_fn,
    trainer.state.params,
    p.eval_data,
    p.config,
    p.inv_prop,
    texts,
    memories.choice if votes else None,
    memories.validation_cache if votes else None,
  )


def _read_model(
  trainer: Trainer,
  memories: VoteMemories | None,
  texts: np.ndarray | None,
  rows: list[tuple[float, float]],
  named: list[tuple],
) -> list[float]:
  """The validation metric of each (label-text weight, neighbour weight) row, all from one
  pass over W (weight_reads.py), each logged by its `named` weights."""
  reads = _weight_reads(trainer, memories, texts, any(v for _, v in rows))
  return _logged(_by(trainer.parts.config.scoring), named, reads.model_at(np.asarray(rows)))


def _choose_text_shape(
  trainer: Trainer, texts: np.ndarray | None
) -> tuple[tuple[float, float, float], ...]:
  """Reads each (scale, shift) of `scoring.label_text_shape_choices` at every label-text
  weight above 0 (the config's weight when it lists none), without the vote, and sets the
  shape of the first best read; returns ((scale, shift, its best metric), ...), or () when
  nothing is read (no shapes, or no weight above 0)."""
  p = trainer.parts
  sc = p.config.scoring
  shapes, betas = choice_reads.text_shapes(sc), choice_reads.shape_weights(sc)
  if not shapes or not betas:
    return ()
  # Every (shape, weight) row from one pass over W, without the vote: the kernel takes
  # each row's scale and shift beside its weights (sharded_topk.ShardedSearch.text_shapes).
  grid = [(s, b) for s in shapes for b in betas]
  rows = np.asarray([(b, 0.0, x, t) for (x, t), b in grid], np.float32)
  named = [
    (("label_text_scale", x), ("label_text_shift", t), ("label_text_weight", b))
    for (x, t), b in grid
  ]
  values = _logged(_by(sc), named, _weight_reads(trainer, None, texts, False).model_at(rows))
  read = [(s, max(values[i * len(betas) : (i + 1) * len(betas)])) for i, s in enumerate(shapes)]
  sc.label_text_scale, sc.label_text_shift = _first_best(read)
  logging.info(
    "scoring.label_text_scale=%.2f, scoring.label_text_shift=%.2f chosen on validation",
    sc.label_text_scale,
    sc.label_text_shift,
  )
  return tuple((x, t, m) for (x, t), m in read)


def _label_texts(trainer: Trainer) -> np.ndarray | None:
  """E(z_l), embedded once for every candidate, when the score may read it."""
  p = trainer.parts
  sc = p.config.scoring
  if any(sc.get("label_text_weight_choices", ())) or sc.label_text_weight:
    return ranking.embed_label_texts(
      p.mesh, p.embed_fn, trainer.state.params, p.eval_data, p.config
    )
  return None


def _choose_lexical(
  trainer: Trainer,
  memories: VoteMemories | None,
  texts: np.ndarray | None,
  indexes: LexicalIndexes | None,
  choice: ScoreChoice,
  candidates: list[tuple[float, float]],
) -> ScoreChoice:
  """Reads every (g, h) with the model's weights chosen, and sets the first best."""
  sc = trainer.parts.config.scoring
  if indexes is None or indexes.choice is None:
    raise ValueError("choosing the lexical weights needs the validation rows' lexical terms")
  votes = bool(sc.get("neighbour_weight", 0.0))
  if votes:
    _require_validation_memory(memories)
  # Every pair from one pass over W, the model's weights fixed (weight_reads.py).
  reads = _weight_reads(trainer, memories, texts, votes)
  read = reads.lexical_at(candidates, indexes.choice)
  named = [
    (("lexical_label_text_weight", g), ("lexical_neighbour_weight", h)) for g, h in candidates
  ]
  values = _logged(_by(sc), named, read)
  pairs = [(g, h, m) for (g, h), m in zip(candidates, values)]
  g, h = _first_best([((g, h), m) for g, h, m in pairs])
  sc.lexical_label_text_weight, sc.lexical_neighbour_weight = g, h
  logging.info(
    "scoring.lexical_label_text_weight=%.2f, scoring.lexical_neighbour_weight=%.2f chosen on "
    "validation",
    g,
    h,
  )
  return dataclasses.replace(choice, lexical_pairs=tuple(pairs), lexical=(float(g), float(h)))


def _choose_model_weights(
  trainer: Trainer, memories: VoteMemories | None, texts: np.ndarray | None
) -> ScoreChoice | None:
  """The label-text and neighbour weights (module docstring), or None when the config
  lists neither."""
  p = trainer.parts
  sc = p.config.scoring
  text_weights = tuple(float(w) for w in sc.get("label_text_weight_choices", ()))
  vote_weights = tuple(float(w) for w in sc.get("neighbour_weight_choices", ()))
  if not text_weights and not vote_weights:
    return None
  by_name = "+".join(_by(sc))

  if sc.get("choose_jointly", False) and text_weights and vote_weights:
    _require_validation_memory(memories)
    grid = [(t, v) for t in text_weights for v in vote_weights]
    named = [(("label_text_weight", t), ("neighbour_weight", v)) for t, v in grid]
    values = _read_model(trainer, memories, texts, grid, named)
    return _choose_pairs(sc, by_name, [(t, v, m) for (t, v), m in zip(grid, values)])
  text_read = []
  if text_weights:  # without the vote, whose memory is read after
    rows = [(w, 0.0) for w in text_weights]
    named = [(("label_text_weight", w),) for w in text_weights]
    text_read = list(zip(text_weights, _read_model(trainer, memories, texts, rows, named)))
    sc.label_text_weight = _first_best(text_read)
    logging.info("scoring.label_text_weight=%.2f chosen on validation", sc.label_text_weight)
  vote_read = []
  if vote_weights:
    _require_validation_memory(memories)
    rows = [(float(sc.label_text_weight), w) for w in vote_weights]
    named = [(("neighbour_weight", w),) for w in vote_weights]
    vote_read = list(zip(vote_weights, _read_model(trainer, memories, texts, rows, named)))
    sc.neighbour_weight = _first_best(vote_read)
    logging.info("scoring.neighbour_weight=%.2f chosen on validation", sc.neighbour_weight)
  return ScoreChoice(
    by_name,
    tuple(text_read),
    float(sc.label_text_weight),
    tuple(vote_read),
    float(sc.get("neighbour_weight", 0.0)),
  )


def _require_validation_memory(memories: VoteMemories | None) -> None:
  if memories is None or not memories.has_validation:
    raise ValueError("choosing scoring.neighbour_weight needs the validation rows' memory")


def _choose_pairs(sc, by_name: str, pairs: list[tuple[float, float, float]]) -> ScoreChoice:
  """Sets the first best of the read (label-text weight, neighbour weight, metric) pairs."""
  sc.label_text_weight, sc.neighbour_weight = _first_best([((t, v), m) for t, v, m in pairs])
  logging.info(
    "scoring.label_text_weight=%.2f, scoring.neighbour_weight=%.2f chosen jointly on validation",
    sc.label_text_weight,
    sc.neighbour_weight,
  )
  return ScoreChoice(
    by_name,
    (),
    float(sc.label_text_weight),
    (),
    float(sc.neighbour_weight),
    tuple(pairs),
  )
