"""XC metrics as the field computes them (pyxclib conventions), from top-k predictions.

P@k, nDCG@k (normaliser: DCG of min(k, |y|) ones), PSP@k and PSnDCG@k with inverse
propensity w_l = 1 + C (n_l + B)^-A, C = (ln N - 1)(B + 1)^A. PS metrics are normalised by
the best possible ranking as a ratio of test-set means (not a mean of ratios). PSnDCG@k, as
pyxclib's `psndcg` computes it, first divides each row's propensity-weighted DCG@k and its
best possible one by that row's own nDCG normaliser min(DCG of |y_i| ones, DCG of k ones),
so a row with many labels does not outweigh one with few; without it the two agree only
when every row has the same |y|. Test rows without labels stay in every denominator (their
PS terms are 0 over 0: they change no PS ratio); a missing prediction (-1) is a miss.
Values are fractions; `as_percent` reports x100 as papers do.
"""

from __future__ import annotations

import numpy as np

from astra_jax.data import rowsets
from astra_jax.data.sparse_rows import SparseRows


def inverse_propensity(train_labels: SparseRows, A: float, B: float) -> np.ndarray:
  n = train_labels.column_counts().astype(np.float64)
  N = train_labels.num_rows
  C = (np.log(N) - 1.0) * (B + 1.0) ** A
  return 1.0 + C * (n + B) ** (-A)


def _hits(pred: np.ndarray, truth: SparseRows) -> np.ndarray:
  """hits[i, r] = pred[i, r] is a true label of row i."""
  rows, labels = rowsets.rows_of(truth, np.arange(truth.num_rows))
  return rowsets.member(pred, rows, labels)


def compute(
  pred: np.ndarray,
  truth: SparseRows,
  inv_prop: np.ndarray | None = None,
  ks: tuple[int, ...] = (1, 3, 5),
) -> dict[str, float]:
  """pred: (n, >= max(ks)) label ids ranked best first (-1 = no prediction)."""
  return from_sums(row_sums(pred, truth, inv_prop, ks), truth.num_rows, ks)


def row_sums(
  pred: np.ndarray,
  truth: SparseRows,
  inv_prop: np.ndarray | None = None,
  ks: tuple[int, ...] = (1, 3, 5),
) -> dict[str, float]:
  """The sums over rows that every metric is made of, for these rows: so that the metrics
  of a test set can be computed a block of rows at a time (`from_sums` of their sums).

  Returns {"P@k": hits in the top k, "nDCG@k": per-row nDCG, "PSP@k", "PSnDCG@k": the
  propensity-weighted gains, "PSP@k/best", "PSnDCG@k/best": the best possible ones}."""
  pred = np.asarray(pred, np.int64)
  if pred.shape[0] != truth.num_rows:
    raise ValueError(f"{pred.shape[0]} prediction rows but {truth.num_rows} truth rows")
  kmax = max(ks)
  if pred.shape[1] < kmax:
    pred = np.pad(pred, ((0, 0), (0, kmax - pred.shape[1])), constant_values=-1)
  pred = pred[:, :kmax]
  hits = _hits(pred, truth).astype(np.float64)
  discount = 1.0 / np.log2(np.arange(2, kmax + 2))
  num_true = truth.row_lengths()
  out = {}
  if inv_prop is not None:
    w_pred = np.where(pred >= 0, inv_prop[np.maximum(pred, 0)], 0.0) * hits
    # Best possible ranking: each row's true labels sorted by propensity weight.
    best = np.zeros((truth.num_rows, kmax))
    for i in range(truth.num_rows):
      w = np.sort(inv_prop[truth.row(i)])[::-1][:kmax]
      best[i, : len(w)] = w
  for k in ks:
    out[f"P@{k}"] = float(hits[:, :k].sum(1).sum())
    # DCG of min(|y_i|, k) ones; a row without labels gets k's (pyxclib's choice: its DCGs
    # are 0 either way, so any positive normaliser leaves every metric unchanged).
    ideal = np.cumsum(discount)[np.where(num_true > 0, np.minimum(num_true, k), k) - 1]
    dcg = (hits[:, :k] * discount[:k]).sum(1)
    out[f"nDCG@{k}"] = float((dcg / ideal).sum())
    if inv_prop is not None:
      out[f"PSP@{k}"] = float(w_pred[:, :k].sum(1).sum())
      out[f"PSP@{k}/best"] = float(best[:, :k].sum(1).sum())
      # Each row's DCGs over its own nDCG normaliser, as pyxclib's psndcg.
      out[f"PSnDCG@{k}"] = float(((w_pred[:, :k] * discount[:k]).sum(1) / ideal).sum())
      out[f"PSnDCG@{k}/best"] = float(((best[:, :k] * discount[:k]).sum(1) / ideal).sum())
  return out


def add_sums(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
  """The sums of two blocks of rows together."""
  return {key: a.get(key, 0.0) + b[key] for key in b}


def from_sums(
  sums: dict[str, float], num_rows: int, ks: tuple[int, ...] = (1, 3, 5)
) -> dict[str, float]:
  """The metrics (fractions) of `num_rows` rows from their `row_sums`."""
  n = max(num_rows, 1)
  out = {}
  for k in ks:
    out[f"P@{k}"] = sums[f"P@{k}"] / n / k
    out[f"nDCG@{k}"] = sums[f"nDCG@{k}"] / n
    if f"PSP@{k}" in sums:
      out[f"PSP@{k}"] = (sums[f"PSP@{k}"] / n) / (sums[f"PSP@{k}/best"] / n)
      out[f"PSnDCG@{k}"] = (sums[f"PSnDCG@{k}"] / n) / (sums[f"PSnDCG@{k}/best"] / n)
  return out


def as_percent(metrics: dict[str, float]) -> dict[str, float]:
  return {k: round(100.0 * v, 4) for k, v in metrics.items()}


def remove_filtered(pred: np.ndarray, filter_pairs: np.ndarray, k: int) -> np.ndarray:
  """Drops (row, label) pairs of the filter file from ranked predictions, keeps the top k."""
  pred = np.asarray(pred, np.int64)
  drop = rowsets.member(pred, filter_pairs[:, 0], filter_pairs[:, 1])
  return rowsets.drop_and_compact(pred, drop, k)


def max_filtered_per_row(filter_pairs: np.ndarray) -> int:
  return int(np.bincount(filter_pairs[:, 0]).max()) if len(filter_pairs) else 0
