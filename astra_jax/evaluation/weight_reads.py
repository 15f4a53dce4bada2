"""A trained model's metrics at many weights of its score, all read from one pass of the
encoder and one over W: the score choice's reads (training/score_choice.py).

`ShardedSearch.kernel` takes a (G, 2 + parts) array of weights: each tile's products
(W's and the label texts') are taken once, and each row of weights mixes them, with the
votes scaled part by part, into its own running top-k. The model's (beta, a) pairs need
only the first two columns. The lexical pairs (g, h) are read with the model's weights
fixed: their terms t and u enter as two vote parts beside the memory's votes, and each
row carries the fold of `xc/lexical.fold` as factors (`xc/lexical.vote_factors`), as the
final evaluation's single read carries its own: (1 - g - h) a / a' on the memory's votes
and g / a', h / a' on t's and u's entries.
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np

from astra_jax.ann import sharded_topk
from astra_jax.ann.vote_cache import VoteCache
from astra_jax.ann.vote_memory import VoteMemory
from astra_jax.data import dataset
from astra_jax.evaluation.ranking import ModelEvaluator
from astra_jax.model.embedding import EmbedFn
from astra_jax.xc import lexical, neighbour_vote, score_fusion


@dataclasses.dataclass(frozen=True)
class WeightReads:
  """A trained model's metrics on `data`'s test rows (the choice's validation rows) at
  many weights of its score, each set of reads from one pass over W.

  Attributes:
    mesh, embed_fn, params, data, config, inv_prop: as `ranking.evaluate_model`.
    label_text_embeddings: E(z_l) when a read weighs the label texts (embedded if None).
    memory: the voting rows, when a read weighs the model's vote.
    vote_cache: where the votes from `memory` are kept between reads.
  """

  mesh: jax.sharding.Mesh
  embed_fn: EmbedFn
  params: dict
  data: dataset.XCData
  config: object
  inv_prop: np.ndarray
  label_text_embeddings: np.ndarray | None = None
  memory: VoteMemory | None = None
  vote_cache: VoteCache | None = None

  def model_at(self, weights: np.ndarray) -> list[dict[str, float]]:
    """The metrics (x100) by each row of `weights` ((G, 2) label-text weight and neighbour
    weight, in place of the config's, or (G, 4) with the label-text term's scale and shift
    after them; no lexical terms), in order."""
    weights = np.atleast_2d(np.asarray(weights, np.float32))
    if weights.shape[1] not in (2, 4):
      raise ValueError(f"weight rows of 2 or 4 columns, got {weights.shape}")
    cfg = copy.deepcopy(self.config)
    # The largest weights put each term that some row weighs into the search.
    cfg.scoring.label_text_weight = float(weights[:, 0].max())
    cfg.scoring.neighbour_weight = float(weights[:, 1].max())
    evaluator = ModelEvaluator.for_model(
      self.mesh,
      self.embed_fn,
      self.params,
      self.data,
      cfg,
      self.inv_prop,
      True,
      self.label_text_embeddings,
      self.memory,
      self.vote_cache,
      text_shapes=weights.shape[1] == 4,
    )
    return evaluator.score_at(weights)

  def lexical_at(
    self, pairs: list[tuple[float, float]], terms: lexical.TermVotes
  ) -> list[dict[str, float]]:
    """The metrics (x100) by the config's model weights (beta, a) and each lexical pair
    (g, h) of `pairs` (g + h < 1) in place of the config's, in order; `terms`: the test
    rows' lexical terms, unweighted."""
    sc = self.config.scoring
    beta, a = float(sc.label_text_weight), float(sc.get("neighbour_weight", 0.0))
    if a and self.memory is None:
      raise ValueError("reading lexical weights beside the model's vote needs its memory")
    rows = lexical_rows(beta, a, pairs)
    dim = self.params["classifier"].shape[1]
    # a' > 0 for some pair: the search mixes in votes, the lexical entries at least.
    vote = neighbour_vote.search_settings(sc) if rows[:, 1].any() else None
    top = terms.label_text.ids.shape[1]
    search = sharded_topk.ShardedSearch(
      self.mesh,
      self.data.num_labels,
      self.config.eval.label_block,
      score_fusion.from_config(self.config, dim),
      vote,
      vote_parts=(top, top),
    )
    voting = self.memory if a and vote is not None else None
    evaluator = ModelEvaluator.on_search(
      search,
      self.embed_fn,
      self.params,
      self.data,
      self.config,
      self.inv_prop,
      self.label_text_embeddings,
      voting,
      self.vote_cache if voting is not None else None,
      terms.beside() if vote is not None else None,
    )
    return evaluator.score_at(rows)


def lexical_rows(beta: float, model_weight: float, pairs: list[tuple[float, float]]) -> np.ndarray:
  """(G, 5) kernel weights of each lexical pair (g, h) at the model's (beta, a): beta, a',
  then the factors on the memory's votes, t's and u's entries (module docstring)."""
  rows = []
  for g, h in pairs:
    w = lexical.LexicalWeights(g, h)
    rows.append(
      [beta, lexical.folded_weight(model_weight, w), *lexical.vote_factors(model_weight, w)]
    )
  return np.asarray(rows, np.float32)
