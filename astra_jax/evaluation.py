"""Evaluation: every ranking in the repository is scored by one function, rank -> filter ->
score, so that training's evaluations, the final one, the baselines and the standalone
evaluator (evaluate.py) agree on what a metric is.

A ranker is asked for k labels per test row, k = max(ks) + the most filtered pairs of a
row, so that max(ks) remain after the filter removes its (row, label) pairs; then
metrics.py scores the top max(ks).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from astra_jax import knn, metrics, score_fusion
from astra_jax.data import dataset
from astra_jax.data.xc_format import SparseRows
from astra_jax.embedding import EmbedFn, embed, host_params

Ranker = Callable[[int], np.ndarray]  # k -> (n, >= k) label ids, best first (-1: none)


def rank_filter_sums(rank: Ranker, truth: SparseRows, filter_pairs: np.ndarray,
                     inv_prop: np.ndarray | None, ks: tuple[int, ...]) -> dict[str, float]:
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


def rank_filter_score(rank: Ranker, truth: SparseRows, filter_pairs: np.ndarray,
                      inv_prop: np.ndarray | None, ks: tuple[int, ...]) -> dict[str, float]:
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


def classifier_ranker(embeddings: np.ndarray, classifier, batch_size: int, label_block: int,
                      fusion: score_fusion.LabelTextFusion | None = None,
                      label_texts: np.ndarray | None = None) -> Ranker:
  """Labels by exact top-k of E(x) W^T (predict.topk, blocked over queries and labels), or
  of the label-text fused score (score_fusion.py; `label_texts` = E(z_l))."""
  return lambda k: score_fusion.topk(embeddings, classifier, k, batch_size, label_block, fusion,
                                     label_texts)[1]


# ----------------------------------------------------------------- training's evaluations
def evaluate_model(embed_fn: EmbedFn, params: dict, data: dataset.XCData, config,
                   inv_prop: np.ndarray, max_rows: int = 0) -> dict[str, float]:
  """The trained model's metrics on `data`'s test rows (the first `max_rows` when > 0)."""
  params = host_params(params)
  n = data.test_labels.num_rows if not max_rows else min(max_rows, data.test_labels.num_rows)
  emb = embed(embed_fn, params["encoder"], data.test_tokens[:n], config.eval.batch_size)
  fusion = score_fusion.from_config(config, emb.shape[1])
  texts = None if fusion is None else embed(embed_fn, params["encoder"], data.label_tokens,
                                            config.eval.batch_size)
  rank = classifier_ranker(emb, params["classifier"][:data.num_labels], config.eval.batch_size,
                           config.eval.label_block, fusion, texts)
  return rank_filter_score(rank, data.test_labels.head(n),
                           data.test_filter[data.test_filter[:, 0] < n], inv_prop,
                           tuple(config.eval.ks))


def popularity_baseline(data: dataset.XCData, config, inv_prop: np.ndarray) -> dict[str, float]:
  """Every test row gets the most frequent training labels (filter applied)."""
  return rank_filter_score(popularity_ranker(data.train_labels, data.test_labels.num_rows),
                           data.test_labels, data.test_filter, inv_prop, tuple(config.eval.ks))


def knn_diagnostic(embed_fn: EmbedFn, params: dict, train_data: dataset.XCData,
                   eval_data: dataset.XCData, config) -> dict[str, float]:
  """`eval.knn_diagnostic` > 0: {"kNN-E P@k": ...}, the vote of that many nearest original
  training rows under the encoder's own embeddings (knn.py); {} when off."""
  k = config.eval.knn_diagnostic
  if not k:
    return {}
  enc = host_params(params)["encoder"]
  bs = config.eval.batch_size
  n_train = train_data.num_train_original
  keys = embed(embed_fn, enc, train_data.train_tokens[np.arange(n_train)], bs)
  queries = embed(embed_fn, enc, eval_data.test_tokens[np.arange(len(eval_data.test_tokens))],
                  bs)
  neighbors, sims = knn.embedding_neighbors(queries, keys, k)
  train_labels = train_data.train_labels.head(n_train)

  def rank(k_out: int) -> np.ndarray:
    return knn.vote(neighbors, sims, train_labels, k_out)
  m = rank_filter_score(rank, eval_data.test_labels, eval_data.test_filter, None,
                        tuple(config.eval.ks))
  return {f"kNN-E {name}": v for name, v in m.items() if name.startswith("P@")}

