"""A ScaNN index built in groups, for shards of millions of rows: a coarse k-means puts each
row in its GROUP_SPILL nearest groups, each group gets its own ScaNN index with the leaves a
flat index would have, and a query opens its best leaves across all groups by their centres.
Build O(L x group_rows / leaf_rows) instead of a flat index's O(L^2 / leaf_rows)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from astra_jax.ann.index import ScannIndex, ScannParams

# The coarse k-means that splits rows into groups: centres trained on this many rows per
# group, for this many Lloyd iterations after k-means++ seeding, all with a fixed seed (the
# same rows give the same groups, and so the same negatives).
GROUP_TRAINING_ROWS = 256


GROUP_KMEANS_ITERATIONS = 10


# Groups each row is put in (its nearest centres). With one, a row's natural neighbours
# across a group's border land in leaves of another group, trained without them, and
# recall at a fixed cost falls as the groups multiply; with each row in two groups (twice
# the leaves and index, the same rows per leaf) it does not (docs/results/refresh_index.md).
GROUP_SPILL = 2


def coarse_groups(
  rows: np.ndarray, num_groups: int, spill: int = 1, block: int = 1 << 18
) -> np.ndarray:
  """Each row's `spill` nearest centres of a k-means with `num_groups` (squared L2).

  Args:
    rows: (L, d) float32 rows (a memmap is read block by block).
    num_groups: centres, at most L.
    spill: groups per row (at most num_groups).
    block: rows assigned per matmul (bounds the (block, num_groups) score array).
  Returns:
    (L, spill) int32 group ids, nearest first."""
  rng = np.random.default_rng(0)
  sample = np.sort(rng.choice(len(rows), min(len(rows), GROUP_TRAINING_ROWS * num_groups), False))
  train = np.asarray(rows[sample], np.float32)
  # k-means++ seeding (each next centre drawn in proportion to its squared distance from
  # the nearest one so far): Lloyd's iterations from uniformly drawn rows can leave two
  # centres in one cluster and one across two.
  centres = np.empty((num_groups, train.shape[1]), np.float32)
  centres[0] = train[rng.integers(len(train))]
  nearest_sq = ((train - centres[0]) ** 2).sum(1, dtype=np.float64)
  for g in range(1, num_groups):
    total = nearest_sq.sum()
    pick = rng.choice(len(train), p=nearest_sq / total) if total > 0 else rng.integers(len(train))
    centres[g] = train[pick]
    nearest_sq = np.minimum(nearest_sq, ((train - centres[g]) ** 2).sum(1, dtype=np.float64))

  def closeness(x: np.ndarray) -> np.ndarray:
    # argmin |x - c|^2 = argmax (x . c - |c|^2 / 2)
    return x @ centres.T - 0.5 * (centres * centres).sum(1)

  for _ in range(GROUP_KMEANS_ITERATIONS):
    owner = np.argmax(closeness(train), axis=1)
    sums = np.zeros_like(centres, np.float64)
    np.add.at(sums, owner, train)
    counts = np.bincount(owner, minlength=num_groups)
    held = counts > 0  # a centre that lost all its rows stays where it was
    centres[held] = (sums[held] / counts[held, None]).astype(np.float32)
  spill = min(spill, num_groups)
  out = np.empty((len(rows), spill), np.int32)
  for s in range(0, len(rows), block):
    score = closeness(np.asarray(rows[s : s + block], np.float32))
    near = np.argpartition(-score, spill - 1, axis=1)[:, :spill] if spill < num_groups else None
    if near is None:
      near = np.broadcast_to(np.arange(num_groups), score.shape)
    order = np.argsort(-np.take_along_axis(score, near, 1), axis=1, kind="stable")
    out[s : s + block] = np.take_along_axis(near, order, 1)
  return out


class GroupedScannIndex:
  """A ScaNN index built group by group, searched as one.

  A flat index's build seeds its leaf centres by k-means++ over their training sample and
  assigns every row to a leaf, leaves x rows work each: with leaves of a fixed size,
  O(L^2) (build times: docs/results/refresh_index.md). Here a coarse k-means splits the
  rows into groups of about `params.group_rows` rows, each row in its GROUP_SPILL nearest
  groups, and each group gets its own ScaNN index with its share of the leaves (leaves of
  the same size), so the build is O(L x group_rows / leaf rows). A query
  scores every group's leaf centres (one matmul), takes the num_leaves_to_search best
  across groups, and searches each group with as many leaves as it holds of those; the
  groups' candidates are merged by their exact scores, a row found in two groups once."""

  def __init__(
    self,
    rows: np.ndarray,
    k: int,
    params: ScannParams,
    threads: int = 0,
    spill: int = GROUP_SPILL,
    progress=None,
  ):
    """spill: groups per row (GROUP_SPILL); progress: called with (groups built, groups)
    after each group (None: silent)."""
    self.params = params
    num_rows = len(rows)
    num_groups = max(1, num_rows // params.group_rows)
    group = coarse_groups(rows, num_groups, spill)
    row_of = np.repeat(np.arange(num_rows), group.shape[1])
    order = np.argsort(group.ravel(), kind="stable")
    bounds = np.searchsorted(group.ravel()[order], np.arange(num_groups + 1))
    # Leaves of the same size as one flat index of num_leaves would have.
    rows_per_leaf = num_rows / params.num_leaves
    sample_share = params.training_sample_size / num_rows
    self.members: list[np.ndarray] = []
    self.indexes: list[ScannIndex] = []
    centres, leaf_group = [], []
    for g in range(num_groups):
      members = row_of[order[bounds[g] : bounds[g + 1]]]
      if not len(members):
        continue
      group_params = dataclasses.replace(
        params,
        num_leaves=max(1, min(len(members), round(len(members) / rows_per_leaf))),
        training_sample_size=max(1, min(len(members), round(len(members) * sample_share))),
        group_rows=0,
      )
      index = ScannIndex(np.asarray(rows[members], np.float32), k, group_params, threads)
      centres.append(index.leaf_centres())
      leaf_group.append(np.full(len(centres[-1]), len(self.indexes), np.int32))
      self.members.append(members.astype(np.int64))
      self.indexes.append(index)
      if progress is not None:
        progress(g + 1, num_groups)
    self.centres = np.concatenate(centres)
    self.leaf_group = np.concatenate(leaf_group)

  @property
  def num_leaves(self) -> int:
    return len(self.centres)

  def search(
    self,
    queries: np.ndarray,
    k: int,
    leaves_to_search: int | None = None,
    reorder: int | None = None,
    query_block: int = 1024,
  ) -> np.ndarray:
    """As ScannIndex.search: (n, k) ids into the rows, best first, -1 for an empty slot.
    leaves_to_search counts leaves across all groups. query_block: queries whose leaf
    centre scores are ranked at once (the scores and their partitioned copy, 8 bytes per
    query and centre: 0.26 GB for 1,024 queries and 31,642 centres)."""
    queries = np.ascontiguousarray(queries, np.float32)
    n, groups = len(queries), len(self.indexes)
    m = min(leaves_to_search or self.params.num_leaves_to_search, self.num_leaves)
    # Leaves each query opens in each group: its m best leaf centres across all groups.
    opened = np.zeros((n, groups), np.int32)
    for s in range(0, n, query_block):
      block = queries[s : s + query_block]
      if m >= self.num_leaves:
        opened[s : s + len(block)] = np.bincount(self.leaf_group, minlength=groups)
        continue
      scores = block @ self.centres.T
      # Each query's m-th best score by a partition of the values, then the leaves at or
      # above it: faster than argpartition's indices (docs/results/refresh_index.md), and
      # no (block, K) int64 array. A tie at the m-th score (float scores of distinct
      # centres: unlikely) would open one leaf more.
      kth = self.num_leaves - m
      threshold = np.partition(scores, kth, axis=1)[:, kth]
      query, leaf = np.nonzero(scores >= threshold[:, None])
      del scores
      counts = np.bincount(query * groups + self.leaf_group[leaf], minlength=len(block) * groups)
      opened[s : s + len(block)] = counts.reshape(len(block), groups)
    best_ids = np.full((n, k), -1, np.int64)
    best_scores = np.full((n, k), -np.inf, np.float32)
    budget = reorder or self.params.reorder
    for g, index in enumerate(self.indexes):
      for leaves in np.unique(opened[:, g]):
        if leaves == 0:
          continue
        rows = np.flatnonzero(opened[:, g] == leaves)
        # Each group re-ranks its share of the budget, in proportion to the leaves the
        # query opens in it: at 10^7 rows a query opens leaves in tens of groups, and the
        # whole budget in each would re-score tens of times what a flat index does.
        share = max(k, math.ceil(budget * leaves / m))
        ids, scores = index.search_scored(queries[rows], k, int(leaves), share)
        ids = np.where(ids >= 0, self.members[g][np.maximum(ids, 0)], -1)
        both_ids = np.concatenate([best_ids[rows], ids], axis=1)
        both_scores = np.concatenate([best_scores[rows], scores], axis=1)
        # best first, empty slots (-inf) last; a stable sort keeps ties in the order the
        # groups were searched (a lexsort by id too is much slower:
        # docs/results/refresh_index.md).
        order = np.argsort(-both_scores, axis=1, kind="stable")
        both_ids = np.take_along_axis(both_ids, order, 1)
        both_scores = np.take_along_axis(both_scores, order, 1)
        # A row found in two groups has the same exact score in both (the same float row
        # re-scored by the same kernel), so its copies sit side by side: keep the first.
        again = np.zeros(both_ids.shape, bool)
        again[:, 1:] = (both_ids[:, 1:] == both_ids[:, :-1]) & (both_ids[:, 1:] >= 0)
        keep = np.argsort(again, axis=1, kind="stable")[:, :k]
        best_ids[rows] = np.take_along_axis(both_ids, keep, 1)
        best_scores[rows] = np.take_along_axis(both_scores, keep, 1)
    return np.where(np.isfinite(best_scores), best_ids, -1).astype(np.int32)
