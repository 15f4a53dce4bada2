"""Evaluation: every ranking in the repository is scored by one function, rank -> filter ->
score, so that training's evaluations, the final one, the baselines and the standalone
evaluator (evaluate.py) agree on what a metric is.

A ranker is asked for k labels per test row, k = max(ks) + the most filtered pairs of a
row, so that max(ks) remain after the filter removes its (row, label) pairs; then
metrics.py scores the top max(ks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging

from astra_jax.ann import memory_search, mesh_memory, process_memory, sharded_topk
from astra_jax.ann.vote_cache import VoteCache
from astra_jax.ann.vote_memory import Memory, VoteMemory, nearest, searches_with_scann
from astra_jax.data import dataset
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.evaluation import knn, metrics
from astra_jax.model.embedding import EmbedFn
from astra_jax.parallel.mesh_embedding import embed_on_mesh
from astra_jax.runtime import distributed
from astra_jax.xc import lexical, neighbour_vote, score_fusion
from astra_jax.xc.neighbour_vote import Votes

Ranker = Callable[[int], np.ndarray]  # k -> (n, >= k) label ids, best first (-1: none)


def rank_filter_sums(
  rank: Ranker,
  truth: SparseRows,
  filter_pairs: np.ndarray,
  inv_prop: np.ndarray | None,
  ks: tuple[int, ...],
) -> dict[str, float]:
  """metrics.row_sums of a ranking after the filter: the one scoring path.

  Args:
    rank: k -> ranked label ids of the test rows.
    truth: the test rows' labels (n rows).
    filter_pairs: (m, 2) (row, label) pairs to drop from the ranking, rows in [0, n).
    inv_prop: inverse propensities (None: no PS metrics).
    ks: the cut-offs.
  Returns:
    The rows' metric sums (metrics.from_sums turns sums of any blocks into metrics).
  """
  ranked = rank(max(ks) + metrics.max_filtered_per_row(filter_pairs))
  ranked = metrics.remove_filtered(ranked, filter_pairs, max(ks))
  return metrics.row_sums(ranked, truth, inv_prop, ks)


def zero_sums(
  truth: SparseRows, inv_prop: np.ndarray | None, ks: tuple[int, ...]
) -> dict[str, float]:
  """metrics.row_sums of no rows: every key the metrics have, each zero."""
  return metrics.row_sums(np.zeros((0, max(ks)), np.int64), truth.row_range(0, 0), inv_prop, ks)


def ranked_rows_sums(
  ids: np.ndarray,
  first: int,
  truth: SparseRows,
  filter_pairs: np.ndarray,
  inv_prop: np.ndarray | None,
  ks: tuple[int, ...],
) -> dict[str, float]:
  """`rank_filter_sums` of test rows [first, first + len(ids)) already ranked as `ids`
  (at least max(ks) + their most filtered pairs labels each); `filter_pairs` may hold other
  rows' pairs too (global row ids)."""
  last = first + len(ids)
  rows = filter_pairs[:, 0]
  mine = filter_pairs[(rows >= first) & (rows < last)] - np.array([first, 0])
  return rank_filter_sums(lambda _: ids, truth.row_range(first, last), mine, inv_prop, ks)


def rank_filter_score(
  rank: Ranker,
  truth: SparseRows,
  filter_pairs: np.ndarray,
  inv_prop: np.ndarray | None,
  ks: tuple[int, ...],
) -> dict[str, float]:
  """`rank_filter_sums` as metrics x100 (P@k, nDCG@k and, with inv_prop, PSP@k, PSnDCG@k)."""
  sums = rank_filter_sums(rank, truth, filter_pairs, inv_prop, ks)
  return metrics.as_percent(metrics.from_sums(sums, truth.num_rows, ks))


def popularity_ranker(train_labels: SparseRows, num_rows: int) -> Ranker:
  """Every one of `num_rows` test rows gets the most frequent training labels."""
  counts = train_labels.column_counts()

  def rank(k: int) -> np.ndarray:
    top = np.argsort(-counts, kind="stable")[:k]
    return np.broadcast_to(top, (num_rows, len(top)))

  return rank


# ----------------------------------------------------------------- the trained model
@dataclasses.dataclass(frozen=True)
class ModelEvaluator:
  """The trained model's metrics on a test set, ranked where W lives (sharded_topk.py):
  each process encodes and ranks only the rows its devices hold, and the metric sums are
  added across processes. Training's evaluations and the final one (final_eval.py) use it.

  Attributes:
    search: the sharded exact top-k (mesh, L, tile size, fusion).
    embed_fn: the inference-mode encoder.
    encoder: its parameters (replicated on the mesh).
    label_parts: what the kernel scores, split over 'model' (ShardedSearch.label_parts).
    tokens: (n, T) the test rows' tokens.
    truth: the test rows' labels.
    filter_pairs: (m, 2) (row, label) pairs removed from the ranking.
    inv_prop: inverse propensities (None: no PS metrics).
    ks: the cut-offs.
    batch_size: query rows per compiled call.
    memory: the training rows that vote (neighbour_vote.py) when `search.vote` is set.
    vote_cache: where this process's votes from `memory` are kept for another evaluation
      of the same rows (they depend on the encoder, the memory and the vote's k and tau,
      not on its weight); None: taken anew.
    lexical_votes: the lexical terms' entries of every test row (xc/lexical.py),
      unweighted (the search's vote factors weigh them): beside the memory's votes, or the
      rows' only votes without one.
  """

  search: sharded_topk.ShardedSearch
  embed_fn: EmbedFn
  encoder: Any
  label_parts: tuple
  tokens: np.ndarray
  truth: SparseRows
  filter_pairs: np.ndarray
  inv_prop: np.ndarray | None
  ks: tuple[int, ...]
  batch_size: int
  memory: VoteMemory | None = None
  vote_cache: VoteCache | None = None
  lexical_votes: Votes | None = None

  @classmethod
  def for_model(
    cls,
    mesh: jax.sharding.Mesh,
    embed_fn: EmbedFn,
    params: dict,
    data: dataset.XCData,
    config,
    inv_prop: np.ndarray | None,
    fused: bool = True,
    label_text_embeddings: np.ndarray | None = None,
    memory: VoteMemory | None = None,
    vote_cache: VoteCache | None = None,
    lexical_terms: lexical.TermVotes | None = None,
    text_shapes: bool = False,
  ) -> ModelEvaluator:
    """The evaluator of `params` ({"encoder", "classifier"}, W of L' >= L rows laid out on
    `mesh` or on one device) on `data`'s test rows, scored as `config.scoring` says (by W
    alone when `fused` is False). The fused score embeds every label's text with the
    encoder unless `label_text_embeddings` (L, d) already holds them. The neighbour vote
    (`scoring.neighbour_weight`) is in the score only with a `memory` to vote from: the
    periodic evaluations have none and score without it; `vote_cache`: where the votes
    from it are kept between evaluations of the same rows. The lexical terms
    (`scoring.lexical_*`) are in the score only with `lexical_terms`, the test rows'. With
    `text_shapes` the weight rows `score_at` takes end in the label-text term's scale and
    shift (sharded_topk.ShardedSearch.text_shapes)."""
    w = sharded_topk.on_mesh(params["classifier"], mesh)
    fusion = score_fusion.from_config(config, w.shape[1]) if fused else None
    vote = neighbour_vote.from_config(config) if fused and memory is not None else None
    weights = lexical.from_scoring(config.scoring)
    lexical_votes, parts, factors = None, (), ()
    if fused and lexical_terms is not None and weights.total:
      model_weight = vote.weight if vote is not None else 0.0
      # t's and u's entries enter unweighted beside the memory's votes (kept as they come,
      # so that they may come from its cache); the search scales each part (`fold`).
      lexical_votes = lexical_terms.beside()
      parts = (lexical_terms.label_text.ids.shape[1],) * 2
      factors = lexical.vote_factors(model_weight, weights)
      vote = lexical.fold(vote, weights, neighbour_vote.search_settings(config.scoring))
      if not model_weight:  # the model does not vote: the lexical entries are all
        memory = None
    search = sharded_topk.ShardedSearch(
      mesh,
      data.num_labels,
      config.eval.label_block,
      fusion,
      vote,
      parts,
      factors,
      text_shapes,
    )
    return cls.on_search(
      search,
      embed_fn,
      params,
      data,
      config,
      inv_prop,
      label_text_embeddings,
      memory if vote is not None else None,
      vote_cache if vote is not None else None,
      lexical_votes,
    )

  @classmethod
  def on_search(
    cls,
    search: sharded_topk.ShardedSearch,
    embed_fn: EmbedFn,
    params: dict,
    data: dataset.XCData,
    config,
    inv_prop: np.ndarray | None,
    label_text_embeddings: np.ndarray | None = None,
    memory: VoteMemory | None = None,
    vote_cache: VoteCache | None = None,
    lexical_votes: Votes | None = None,
  ) -> ModelEvaluator:
    """The evaluator of `params` on `data`'s test rows through `search` as it is built
    (its fusion embeds every label's text unless `label_text_embeddings` holds them;
    `memory`, `vote_cache`, `lexical_votes`: the attributes)."""
    texts = None
    if search.fusion is not None:  # E(z_l) of every label: small real datasets only
      texts = label_text_embeddings
      if texts is None:
        texts = embed_label_texts(search.mesh, embed_fn, params, data, config)
    w = sharded_topk.on_mesh(params["classifier"], search.mesh)
    return cls(
      search,
      embed_fn,
      params["encoder"],
      search.label_parts(w, texts),
      data.test_tokens,
      data.test_labels,
      data.test_filter,
      inv_prop,
      tuple(config.eval.ks),
      config.eval.batch_size,
      memory,
      vote_cache,
      lexical_votes,
    )

  def block_sums(self, lo: int, hi: int) -> dict[str, float]:
    """metrics.row_sums of test rows [lo, hi), summed over every process."""
    return self.block_sums_at(lo, hi)[0]

  def block_sums_at(
    self, lo: int, hi: int, weights: np.ndarray | None = None
  ) -> list[dict[str, float]]:
    """`block_sums` by each row of `weights` ((G, 2) label-text and neighbour weights,
    ranked from one pass over W: ShardedSearch.kernel); None: by the search's own."""
    rows = self.filter_pairs[:, 0]
    block_filter = self.filter_pairs[(rows >= lo) & (rows < hi)]
    k = max(self.ks) + metrics.max_filtered_per_row(block_filter)
    count = 1 if weights is None else len(weights)
    # A process may hold none of the rows.
    sums = [zero_sums(self.truth, self.inv_prop, self.ks) for _ in range(count)]
    for first, ids in self.search.search_rows(
      self.embed_fn,
      self.encoder,
      self.tokens,
      lo,
      hi,
      k,
      self.label_parts,
      self.batch_size,
      memory=self.memory,
      vote_cache=self.vote_cache,
      weights=weights,
      **self._lexical_rows(lo, hi),
    ):
      by_weight = [ids] if weights is None else [ids[:, g] for g in range(count)]
      sums = [
        metrics.add_sums(
          total, ranked_rows_sums(x, first, self.truth, block_filter, self.inv_prop, self.ks)
        )
        for total, x in zip(sums, by_weight)
      ]
    return [distributed.sum_over_processes(x) for x in sums]

  def _lexical_rows(self, lo: int, hi: int) -> dict:
    """search_rows' arguments for the lexical entries of rows [lo, hi): beside the
    memory's votes, or the rows' only votes."""
    if self.lexical_votes is None:
      return {}
    rows = Votes(self.lexical_votes.ids[lo:hi], self.lexical_votes.values[lo:hi])
    return {"extra_votes": rows} if self.memory is not None else {"votes": rows}

  def score(self, num_rows: int | None = None) -> dict[str, float]:
    """Metrics x100 of the first `num_rows` test rows (all of them by default)."""
    n = self.truth.num_rows if num_rows is None else num_rows
    return metrics.as_percent(metrics.from_sums(self.block_sums(0, n), n, self.ks))

  def score_at(self, weights: np.ndarray) -> list[dict[str, float]]:
    """`score` of every test row by each row of `weights` (`block_sums_at`)."""
    n = self.truth.num_rows
    return [
      metrics.as_percent(metrics.from_sums(x, n, self.ks))
      for x in self.block_sums_at(0, n, np.asarray(weights, np.float32))
    ]


def embed_label_texts(
  mesh: jax.sharding.Mesh, embed_fn: EmbedFn, params: dict, data: dataset.XCData, config
) -> np.ndarray:
  """(L, d) E(z_l) of every label's text under `params`' encoder (the fused score's rows),
  encoded over `mesh`'s devices, on every process."""
  return embed_on_mesh(mesh, embed_fn, params["encoder"], data.label_tokens, config.eval.batch_size)


def vote_memory(
  mesh: jax.sharding.Mesh,
  embed_fn: EmbedFn,
  params: dict,
  sources: list[mesh_memory.MemorySource],
  labels: SparseRows | StackedRows,
  config,
) -> VoteMemory:
  """The neighbour vote's memory of `sources`' rows, one after another, and their `labels`,
  under `params`' encoder, encoded over `mesh`'s devices: gathered whole onto every process
  where the vote searches it through a ScaNN index (ann/vote_memory.Memory: the index is
  built over every row), else left where `scoring.neighbour_memory` says
  (memory_search.LAYOUTS): on the devices (ann/mesh_memory.py), by default where their share
  fits every device's free memory, else each process's rows on its host
  (ann/process_memory.py)."""
  enc, bs, sc = params["encoder"], config.eval.batch_size, config.scoring
  rows, d, devices = labels.num_rows, params["classifier"].shape[1], mesh.devices.size
  # The search's settings alone decide; the vote's weight may be chosen later.
  search = neighbour_vote.search_settings(sc)
  if searches_with_scann(rows, search):
    keys = [embed_on_mesh(mesh, embed_fn, enc, s.tokens, bs, s.rows) for s in sources]
    return Memory.from_embeddings(np.concatenate(keys), labels)
  layout = memory_search.LAYOUTS[sc.get("neighbour_memory", "auto")]
  room = mesh_memory.device_room(mesh)
  if distributed.all_true(layout.on_devices(rows, d, devices, room)):
    return mesh_memory.embed_memory(mesh, embed_fn, enc, sources, labels, bs)
  share = memory_search.device_share_bytes(rows, d, devices) / 2**30
  logging.warning(
    "neighbour vote: %d memory rows (%.2f GiB a device%s, scoring.neighbour_memory=%s): "
    "held on the processes' hosts, each its own rows",
    rows,
    share,
    "" if room is None else f" against {room / 2**30:.2f} GiB free",
    layout.name,
  )
  return process_memory.embed_process_memory(mesh, embed_fn, enc, sources, labels, bs)


# ----------------------------------------------------------------- training's evaluations
def evaluate_model(
  mesh: jax.sharding.Mesh,
  embed_fn: EmbedFn,
  params: dict,
  data: dataset.XCData,
  config,
  inv_prop: np.ndarray,
  max_rows: int = 0,
  fused: bool = True,
  label_text_embeddings: np.ndarray | None = None,
  memory: VoteMemory | None = None,
  vote_cache: VoteCache | None = None,
  lexical_terms: lexical.TermVotes | None = None,
) -> dict[str, float]:
  """The trained model's metrics on `data`'s test rows (the first `max_rows` when > 0), by
  the config's score (by W alone when `fused` is False; `label_text_embeddings`, `memory`,
  `vote_cache`, `lexical_terms`: as `ModelEvaluator.for_model`)."""
  n = data.test_labels.num_rows if not max_rows else min(max_rows, data.test_labels.num_rows)
  evaluator = ModelEvaluator.for_model(
    mesh,
    embed_fn,
    params,
    data,
    config,
    inv_prop,
    fused,
    label_text_embeddings,
    memory,
    vote_cache,
    lexical_terms,
  )
  return evaluator.score(n)


def popularity_baseline(
  data: dataset.XCData, config, inv_prop: np.ndarray, num_rows: int | None = None
) -> dict[str, float]:
  """Every test row (the first `num_rows`) gets the most frequent training labels (filter
  applied)."""
  n = data.test_labels.num_rows if num_rows is None else num_rows
  filt = data.test_filter[data.test_filter[:, 0] < n]
  return rank_filter_score(
    popularity_ranker(data.train_labels, n),
    data.test_labels.head(n),
    filt,
    inv_prop,
    tuple(config.eval.ks),
  )


def diagnostics(
  mesh: jax.sharding.Mesh,
  embed_fn: EmbedFn,
  params: dict,
  train_data: dataset.XCData,
  eval_data: dataset.XCData,
  config,
  inv_prop: np.ndarray,
  max_rows: int = 0,
) -> dict[str, float]:
  """What each evaluation reports beside the model's metrics, as the config asks: the kNN
  vote over the encoder's own embeddings (`eval.knn_diagnostic`) and the ranking by W alone
  when the score mixes in the label texts (`eval.classifier_alone`).

  Returns:
    {"kNN-E P@k": ..., "W-alone P@k": ...}, each part only when asked for.
  """
  out = knn_diagnostic(mesh, embed_fn, params, train_data, eval_data, config)
  fusion = score_fusion.from_config(config, params["classifier"].shape[1])
  if config.eval.classifier_alone and fusion is not None:
    # The negative-sampling strategies change W, not the text term; the fused score dilutes
    # their differences (docs/real_data.md).
    alone = evaluate_model(
      mesh, embed_fn, params, eval_data, config, inv_prop, max_rows, fused=False
    )
    out.update({f"W-alone {k}": v for k, v in alone.items() if k.startswith("P@")})
  return out


def knn_diagnostic(
  mesh: jax.sharding.Mesh,
  embed_fn: EmbedFn,
  params: dict,
  train_data: dataset.XCData,
  eval_data: dataset.XCData,
  config,
) -> dict[str, float]:
  """`eval.knn_diagnostic` > 0: {"kNN-E P@k": ...}, the vote of that many nearest original
  training rows under the encoder's own embeddings (knn.py); {} when off."""
  k = config.eval.knn_diagnostic
  if not k:
    return {}
  enc, bs = params["encoder"], config.eval.batch_size
  n_train = train_data.num_train_original
  keys = embed_on_mesh(mesh, embed_fn, enc, train_data.train_tokens, bs, np.arange(n_train))
  queries = embed_on_mesh(mesh, embed_fn, enc, eval_data.test_tokens, bs)
  neighbors, sims = nearest(queries, keys, k)
  train_labels = train_data.train_labels.head(n_train)

  def rank(k_out: int) -> np.ndarray:
    return knn.vote(neighbors, sims, train_labels, k_out)

  m = rank_filter_score(
    rank, eval_data.test_labels, eval_data.test_filter, None, tuple(config.eval.ks)
  )
  return {f"kNN-E {name}": v for name, v in m.items() if name.startswith("P@")}
