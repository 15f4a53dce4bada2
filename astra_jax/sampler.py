"""Label side of a training batch: padded positives, hard negatives, shared random negatives.

A batch always has the same array shapes, whatever the phase of training:
  pos_ids, pos_mask   (B, k_p)  positives, padded with a False mask (more than k_p: a fresh
                                random subset of k_p each time the row is drawn)
  hard_ids, hard_mask (B, k_h)  stale hard negatives from the index (-1 = none); False
                                where missing or a positive
  rand_ids            (k_r,)    uniform draws over [L] shared by the whole batch
  rand_mask           (B, k_r)  False where the draw is a positive (any of the row's
                                positives, not only the k_p kept) or one of its hard negatives
  rand_weight         ()        L / k_r, the estimator's weight (see loss.py)
Before hard negatives exist (epoch < tau_s), the k_h hard slots are filled with random draws
instead (k_r + k_h shared draws, weight L/(k_r + k_h)): same negatives per query, same
weights in the estimator, and `hard_ids` is (B, 0).
"""
from __future__ import annotations

import numpy as np

from astra_jax import rowsets
from astra_jax.data.xc_format import SparseRows


class NegativeSampler:
  """Builds the label arrays of a batch (numpy, on the host)."""

  def __init__(self, labels: SparseRows, k_p: int, k_h: int, k_r: int):
    self.labels, self.num_labels = labels, labels.num_cols
    self.k_p, self.k_h, self.k_r = k_p, k_h, k_r

  def __call__(self, rows: np.ndarray, rng: np.random.Generator,
               hard_negatives: np.ndarray | None = None,
               num_random: int | None = None) -> dict[str, np.ndarray]:
    """rows: (B,) training row ids; hard_negatives: (B, h) label ids (-1: none) or None;
    num_random: shared random draws (default k_r, or k_r + k_h without hard negatives)."""
    b, L = len(rows), self.num_labels
    indptr, indices = self.labels.indptr, self.labels.indices
    starts, ends = indptr[rows], indptr[rows + 1]
    pos_ids = np.zeros((b, self.k_p), np.int32)
    pos_mask = np.zeros((b, self.k_p), bool)
    for i in range(b):
      row = indices[starts[i]:ends[i]]
      if len(row) > self.k_p:
        row = rng.choice(row, self.k_p, replace=False)
      pos_ids[i, :len(row)] = row
      pos_mask[i, :len(row)] = True
    all_pos_row, all_pos_ids = rowsets.rows_of(self.labels, rows)

    if hard_negatives is None:
      k_r = self.k_r + self.k_h if num_random is None else num_random
      hard_ids = np.zeros((b, 0), np.int32)
      hard_mask = np.zeros((b, 0), bool)
    else:
      k_r = self.k_r if num_random is None else num_random
      hard_ids = np.asarray(hard_negatives, np.int32).reshape(b, -1)
      hard_mask = (hard_ids >= 0) & ~rowsets.member(hard_ids, all_pos_row, all_pos_ids)
      hard_ids = np.where(hard_ids >= 0, hard_ids, 0)
    rand_ids = rng.integers(0, L, size=k_r, dtype=np.int64)
    rand_full = np.broadcast_to(rand_ids, (b, k_r))
    excluded_rows = np.concatenate([all_pos_row, np.nonzero(hard_mask)[0]])
    excluded_ids = np.concatenate([all_pos_ids, hard_ids[hard_mask].astype(np.int64)])
    rand_mask = ~rowsets.member(rand_full, excluded_rows, excluded_ids)
    return {"pos_ids": pos_ids, "pos_mask": pos_mask, "hard_ids": hard_ids,
            "hard_mask": hard_mask, "rand_ids": rand_ids.astype(np.int32),
            "rand_mask": rand_mask, "rand_weight": np.float32(L / k_r if k_r else 0.0)}
