"""k-nearest-neighbour label votes: the classic XC baseline and the encoder diagnostic.

A query's score for label l is the sum of its k nearest training points' similarities over
those that carry l; labels are ranked by it. Over TF-IDF vectors this is the baseline
(`astra_jax.baselines`); over the trained encoder's own normalised embeddings it shows what
the encoder knows, beside what its classifiers W make of the same embeddings
(`eval.knn_diagnostic`): a large gap says W, not E, is what is under-trained. The vote the
model itself can score with (`scoring.neighbour_weight`) is xc/neighbour_vote.py, whose
search and tally these are.
"""

from __future__ import annotations

import numpy as np

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.xc import neighbour_vote


def vote(
  neighbors: np.ndarray, sims: np.ndarray, train_labels: SparseRows, k_out: int
) -> np.ndarray:
  """Ranked labels from similarity-weighted votes of neighbours.

  Args:
    neighbors: (n, k) training-row ids (-1: none).
    sims: (n, k) their similarities (the votes' weights).
    train_labels: the training rows' labels.
    k_out: labels to return per query.
  Returns:
    (n, k_out) int64 label ids, best first, -1 where fewer labels got votes. Ties go to the
    smaller label id.
  """
  return neighbour_vote.label_votes(neighbors, sims, train_labels, k_out).ids.astype(np.int64)
