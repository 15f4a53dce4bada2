"""The one rank -> filter -> score path every evaluation goes through, on a hand-computed
case."""

import numpy as np
import pytest

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import metrics, ranking


def test_popularity_ranking_filtered_and_scored_by_hand():
  # Training counts: label 2 three times, label 0 twice, label 1 once -> ranking [2, 0, 1].
  train = SparseRows.from_lists([[2], [2, 0], [2, 0, 1]], 3)
  truth = SparseRows.from_lists([[0], [1, 2]], 3)
  filter_pairs = np.array([[0, 2]])  # row 0 may not be predicted label 2
  asked = []
  rank = ranking.popularity_ranker(train, 2)

  def spy(k):
    asked.append(k)
    return rank(k)

  m = ranking.rank_filter_score(spy, truth, filter_pairs, None, (1, 2))
  # One filtered pair per row at most: 2 + 1 labels asked for, so 2 remain after the filter.
  assert asked == [3]
  # Row 0: [0, 1] (2 filtered out), hits at 1; row 1: [2, 0], hits at 1.
  assert m["P@1"] == pytest.approx(100.0)
  assert m["P@2"] == pytest.approx(50.0)
  # nDCG@2: row 0 has 1 label (ideal 1): 1; row 1 has 2 (ideal 1 + 1/log2 3): 1 / that.
  assert m["nDCG@2"] == pytest.approx(100 * (1 + 1 / (1 + 1 / np.log2(3))) / 2, abs=1e-3)


def test_sums_of_blocks_are_the_scores_of_the_whole():
  rng = np.random.default_rng(0)
  truth = SparseRows.from_lists([list(rng.choice(20, 3, replace=False)) for _ in range(10)], 20)
  ranked = np.stack([rng.permutation(20)[:8] for _ in range(10)])
  filter_pairs = np.array([[1, ranked[1, 0]], [7, ranked[7, 2]]])
  inv_prop = 1 + rng.random(20)
  whole = ranking.rank_filter_score(
    lambda k: ranked[:, :k], truth, filter_pairs, inv_prop, (1, 3, 5)
  )
  sums = {}
  for lo, hi in ((0, 4), (4, 10)):
    in_block = filter_pairs[(filter_pairs[:, 0] >= lo) & (filter_pairs[:, 0] < hi)]
    block = ranking.rank_filter_sums(
      lambda k, lo=lo, hi=hi: ranked[lo:hi, :k],
      truth.row_range(lo, hi),
      in_block - [lo, 0],
      inv_prop,
      (1, 3, 5),
    )
    sums = {key: sums.get(key, 0.0) + v for key, v in block.items()}

  assert metrics.as_percent(metrics.from_sums(sums, 10, (1, 3, 5))) == pytest.approx(whole)
