"""Label side of a training batch: padded positives, hard negatives, random negatives.

The widths of the hard and random blocks follow the epoch's split of the negatives (they
change at tau_s: the step compiles once per width; the curricula, whose split changes every
epoch, keep their widest blocks and mask the columns the epoch does not use). With W's rows
split into S shards (S = the mesh's 'model' axis; shard s owns rows [s R, (s+1) R) of the
padded matrix, R = ceil(L / S)) the estimator is applied per shard (docs/DESIGN.md, section 1):
  pos_ids, pos_mask   (B, k_p)     positives, padded with a False mask (more than k_p: a
                                   fresh uniform random subset of k_p each time the row is
                                   drawn)
  pos_weight          (B,)         |P| / k_p for a row with |P| > k_p positives, else 1: each
                                   positive is kept with probability k_p / |P|, so the kept
                                   ones' terms, weighted so, sum to the full positive term in
                                   expectation (the estimator stays unbiased)
  hard_ids, hard_mask (B, S k_h)   stale hard negatives, block s from shard s's own index
                                   (-1 = none); False where missing or a positive
  rand_ids            (B, S k_r)   block s: each query's k_r uniform draws over shard s's
                                   rows (per_query_random, the paper's Algorithm 1), or
                      (S k_r,)     one draw of k_r per shard shared by the whole batch
  rand_mask           (B, S k_r)   False where the draw is a positive of that query (any of
                                   its positives, not only the k_p kept) or one of its hard
                                   negatives
  rand_weight         (S k_r,)     L_s / k_r for the draws of shard s (L_s = its real rows)
  all_pos_ids         (B, P)       only with all_positives = P: every positive of each query,
                                   padded with -1 (the uptodate oracle masks them all)
With S = 1 this is one draw over [L] with weight L / k_r. Before hard negatives exist
(epoch < tau_s) the k_h hard slots are filled with random draws instead (k_r + k_h per
shard, weight L_s/(k_r + k_h)): same negatives per query, and `hard_ids` is (B, 0).
"""

from __future__ import annotations

import numpy as np

from astra_jax.data import rowsets
from astra_jax.data.batch import LabelBatch
from astra_jax.data.sparse_rows import SparseRows


class NegativeSampler:
  """Builds the label arrays of a batch (numpy, on the host)."""

  def __init__(
    self,
    labels: SparseRows,
    k_p: int,
    k_h: int,
    k_r: int,
    num_shards: int = 1,
    per_query_random: bool = False,
    all_positives: int = 0,
  ):
    """A sampler over the rows of `labels` for a W split into `num_shards` row shards.

    Args:
      labels: every training row's positives (L = labels.num_cols).
      k_p: positive slots per row.
      k_h: hard negatives per row and W shard (their slots hold random draws before hard
        negatives exist).
      k_r: random draws per W shard (per row with `per_query_random`).
      num_shards: S, the W shards (the mesh's 'model' axis).
      per_query_random: each row draws its own k_r per shard (the paper's Algorithm 1);
        else one draw per shard serves the batch.
      all_positives: if > 0, also return every positive of each row, padded to this width.
    Raises:
      ValueError: L is too small to give every shard a real row.
    """
    self.labels, self.num_labels = labels, labels.num_cols
    self.all_positives = all_positives
    self.k_p, self.k_h, self.k_r = k_p, k_h, k_r
    self.per_query_random = per_query_random
    self.num_shards = num_shards
    self.shard_rows = -(-self.num_labels // num_shards)
    starts = np.arange(num_shards) * self.shard_rows
    self.shard_bounds = np.stack([starts, np.minimum(starts + self.shard_rows, self.num_labels)], 1)
    if (self.shard_bounds[:, 1] <= self.shard_bounds[:, 0]).any():
      raise ValueError(
        f"{self.num_labels} labels cannot fill {num_shards} classifier shards "
        f"of {self.shard_rows} rows"
      )

  def __call__(
    self,
    rows: np.ndarray,
    rng: np.random.Generator,
    hard_negatives: np.ndarray | None = None,
    num_random: int | None = None,
    random_columns: int | None = None,
    num_hard: int | None = None,
  ) -> LabelBatch:
    """The label side of one batch.

    Columns past num_hard / num_random are masked, so that batches of different splits
    share one shape.

    Args:
      rows: (B,) training row ids.
      rng: the batch's generator (positive subsets and random draws).
      hard_negatives: (B, S c) label ids (-1: none), block s from shard s, or None.
      num_random: random draws per shard (default k_r, or k_r + k_h without hard
        negatives).
      random_columns: random columns per shard in the batch (>= num_random).
      num_hard: hard negatives per shard that train (default c).
    Returns:
      The rows' LabelBatch (batch.py; the arrays the module docstring lists), all_pos_ids
      only when the sampler keeps every positive.
    Raises:
      ValueError: hard negatives outside their shard's block, random_columns <
        num_random, or a row with more positives than all_positives.
    """
    b, S = len(rows), self.num_shards
    all_pos_row, all_pos_ids = rowsets.rows_of(self.labels, rows)
    # Up to k_p positives per row; a row with more keeps a uniform random k_p-subset: its
    # entries in order of a random key, the first k_p (vectorised over the batch).
    order = np.lexsort((rng.random(len(all_pos_row)), all_pos_row))
    row_start = np.searchsorted(all_pos_row, np.arange(b))
    rank = np.arange(len(order)) - row_start[all_pos_row[order]]
    kept = rank < self.k_p
    keep, slot = order[kept], rank[kept]
    pos_ids = np.zeros((b, self.k_p), np.int32)
    pos_mask = np.zeros((b, self.k_p), bool)
    pos_ids[all_pos_row[keep], slot] = all_pos_ids[keep]
    pos_mask[all_pos_row[keep], slot] = True
    num_pos = np.bincount(all_pos_row, minlength=b)
    pos_weight = np.maximum(num_pos / self.k_p, 1.0).astype(np.float32)

    if hard_negatives is None:
      k_r = self.k_r + self.k_h if num_random is None else num_random
      hard_ids = np.zeros((b, 0), np.int32)
      hard_mask = np.zeros((b, 0), bool)
    else:
      k_r = self.k_r if num_random is None else num_random
      hard_ids = np.asarray(hard_negatives, np.int32).reshape(b, -1)
      valid = hard_ids >= 0
      # Shard s's step only sees block s: a negative outside its block would be lost.
      lo, hi = (np.repeat(self.shard_bounds[:, j], hard_ids.shape[1] // S) for j in (0, 1))
      if (valid & ((hard_ids < lo) | (hard_ids >= hi))).any():
        raise ValueError("hard negatives are not grouped by classifier shard")
      if num_hard is not None and num_hard < hard_ids.shape[1] // S:  # padding columns
        valid &= np.tile(np.arange(hard_ids.shape[1] // S) < num_hard, S)
      hard_mask = valid & ~rowsets.member(hard_ids, all_pos_row, all_pos_ids, reuse_table=True)
      hard_ids = np.where(valid, hard_ids, lo).astype(np.int32)
    width = k_r if random_columns is None else random_columns
    if width < k_r:
      raise ValueError(f"random_columns={width} < num_random={k_r}")
    lo, hi = self.shard_bounds[:, :1], self.shard_bounds[:, 1:]
    rand_weight = np.repeat(((hi - lo) / max(k_r, 1)).astype(np.float32).reshape(-1), width)
    excluded_rows = np.concatenate([all_pos_row, np.repeat(np.arange(b), hard_mask.sum(1))])
    excluded_ids = np.concatenate([all_pos_ids, hard_ids[hard_mask].astype(np.int64)])
    if self.per_query_random:
      rand_ids = np.empty((b, S, width), np.int32)  # L < 2^31
      # One draw per shard with scalar bounds: faster than one draw with an array of shard
      # bounds (docs/results/training.md).
      for s, (start, end) in enumerate(self.shard_bounds):
        rand_ids[:, s] = rng.integers(0, end - start, size=(b, width), dtype=np.int32)
        rand_ids[:, s] += np.int32(start)
      rand_ids = rand_ids.reshape(b, -1)
      rand_mask = ~rowsets.member(rand_ids, excluded_rows, excluded_ids, reuse_table=True)
    else:
      rand_ids = (lo + rng.integers(0, hi - lo, size=(S, width), dtype=np.int64)).reshape(-1)
      rand_mask = ~rowsets.shared_member(rand_ids, b, excluded_rows, excluded_ids)
    if width > k_r:  # padding columns: not negatives
      rand_mask &= np.tile(np.arange(width) < k_r, S)
    all_pos = None
    if self.all_positives:  # every positive, in the random order that chose the k_p
      if len(rank) and rank.max() >= self.all_positives:
        raise ValueError(
          f"a row has {rank.max() + 1} positives, all_positives is {self.all_positives}"
        )
      all_pos = np.full((b, self.all_positives), -1, np.int32)
      all_pos[all_pos_row[order], rank] = all_pos_ids[order]
    return LabelBatch(
      pos_ids,
      pos_mask,
      hard_ids,
      hard_mask,
      rand_ids.astype(np.int32, copy=False),
      rand_mask,
      rand_weight,
      pos_weight,
      all_pos,
    )
