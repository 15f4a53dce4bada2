"""One ScaNN index whose leaves are trained in groups, for shards of millions of rows.

A flat ScaNN build seeds its leaf centres by k-means++ over their training sample and
assigns every row to every centre: leaves x rows work, O(L^2) with leaves of a fixed size.
Here a coarse k-means splits the rows into groups of about `group_rows`, each group's leaves
are a k-means of that group's own rows, and each row goes to its nearest leaf (and, with
SOAR, a second one) among the leaves of its GROUP_SPILL nearest groups: O(L x group_rows /
leaf_rows). ScaNN is then given these leaves as its partition (scann_files) and builds one
index over them, so a query opens its best leaves of the whole shard in one call.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from astra_jax.ann.index import ScannIndex, ScannParams

# The coarse k-means that splits rows into groups: centres trained on this many rows per
# group, for this many Lloyd iterations after k-means++ seeding, all with a fixed seed (the
# same rows give the same groups, and so the same negatives).
GROUP_TRAINING_ROWS = 256
GROUP_KMEANS_ITERATIONS = 10
# Lloyd iterations of each group's leaf k-means (after k-means++ seeding).
LEAF_KMEANS_ITERATIONS = 10

# Groups whose leaves a row may be assigned to (its nearest centres). With one, a row near a
# group's border could only join leaves trained without its natural neighbours across it.
GROUP_SPILL = 2


def _closeness(x: np.ndarray, centres: np.ndarray, half_sq_norms: np.ndarray) -> np.ndarray:
  # argmin |x - c|^2 = argmax (x . c - |c|^2 / 2)
  return x @ centres.T - half_sq_norms


def kmeans(
  train: np.ndarray, num_centres: int, iterations: int, rng: np.random.Generator
) -> np.ndarray:
  """Centres of a k-means (squared L2) of `train`: k-means++ seeding, then Lloyd.

  Lloyd's iterations from uniformly drawn rows can leave two centres in one cluster and one
  across two; k-means++ draws each next centre in proportion to its squared distance from
  the nearest one so far. A centre that loses all its rows stays where it was.

  Args:
    train: (n, d) float32 rows.
    num_centres: centres wanted, at most n.
    iterations: Lloyd iterations after the seeding.
    rng: the seeding's draws.
  Returns:
    (num_centres, d) float32 centres."""
  centres = np.empty((num_centres, train.shape[1]), np.float32)
  # |x - c|^2 as |x|^2 - 2 x.c + |c|^2: one matrix-vector product per centre, not a pass
  # over an (n, d) difference.
  train_sq = (train * train).sum(1, dtype=np.float64)

  def sq_distance(c: np.ndarray) -> np.ndarray:
    return np.maximum(train_sq - 2.0 * (train @ c) + float(c @ c), 0.0)

  centres[0] = train[rng.integers(len(train))]
  nearest_sq = sq_distance(centres[0])
  for c in range(1, num_centres):
    total = nearest_sq.sum()
    pick = rng.choice(len(train), p=nearest_sq / total) if total > 0 else rng.integers(len(train))
    centres[c] = train[pick]
    nearest_sq = np.minimum(nearest_sq, sq_distance(centres[c]))
  for _ in range(iterations):
    owner = np.argmax(_closeness(train, centres, 0.5 * (centres * centres).sum(1)), axis=1)
    counts = np.bincount(owner, minlength=num_centres)
    sums = np.zeros((num_centres, train.shape[1]), np.float64)
    for j in range(train.shape[1]):
      sums[:, j] = np.bincount(owner, weights=train[:, j], minlength=num_centres)
    held = counts > 0
    centres[held] = (sums[held] / counts[held, None]).astype(np.float32)
  return centres


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
  centres = kmeans(np.asarray(rows[sample], np.float32), num_groups, GROUP_KMEANS_ITERATIONS, rng)
  half_sq = 0.5 * (centres * centres).sum(1)
  spill = min(spill, num_groups)
  out = np.empty((len(rows), spill), np.int32)
  for s in range(0, len(rows), block):
    score = _closeness(np.asarray(rows[s : s + block], np.float32), centres, half_sq)
    near = np.argpartition(-score, spill - 1, axis=1)[:, :spill] if spill < num_groups else None
    if near is None:
      near = np.broadcast_to(np.arange(num_groups), score.shape)
    order = np.argsort(-np.take_along_axis(score, near, 1), axis=1, kind="stable")
    out[s : s + block] = np.take_along_axis(near, order, 1)
  return out


def assign_leaves(rows: np.ndarray, centres: np.ndarray, soar_lambda: float | None) -> np.ndarray:
  """Each row's leaf among `centres` (squared L2), and with SOAR a second one.

  SOAR (Sun et al. 2023, ScaNN's TWO_CENTER_ORTHOGONALITY_AMPLIFIED spilling) puts a row x
  whose nearest centre is c1, with residual r = x - c1, also in the leaf c minimising
  |x - c|^2 + lambda ((x - c) . r / |r|)^2 (c != c1): a leaf whose residual is nearly
  orthogonal to r, so that a query that scores x badly through c1 scores it well there.

  Args:
    rows: (n, d) float32.
    centres: (m, d) float32 candidate leaf centres.
    soar_lambda: SOAR's lambda, or None (one leaf per row).
  Returns:
    (n, 1) int32 indices into `centres`, or with SOAR (n, 2), the nearest first; -1 as the
    second where there is one centre only."""
  sq = (centres * centres).sum(1)
  closeness = _closeness(rows, centres, 0.5 * sq)
  first = np.argmax(closeness, axis=1)
  if soar_lambda is None:
    return first[:, None].astype(np.int32)
  out = np.full((len(rows), 2), -1, np.int32)
  out[:, 0] = first
  if len(centres) < 2:
    return out
  residual = rows - centres[first]
  norm = np.linalg.norm(residual, axis=1, keepdims=True)
  unit = residual / np.where(norm > 0, norm, 1.0)
  # |x - c|^2 less |x|^2, which no choice of c changes: |c|^2 - 2 x.c.
  loss = -2.0 * closeness
  along = (rows * unit).sum(1, keepdims=True) - unit @ centres.T  # (x - c) . r / |r|
  loss += soar_lambda * along * along
  loss[np.arange(len(rows)), first] = np.inf
  out[:, 1] = np.argmin(loss, axis=1)
  return out


@dataclasses.dataclass(frozen=True)
class Partition:
  """Leaves computed outside ScaNN.

  Attributes:
    centres: (leaves, d) float32, leaf i's centre in row i.
    row_leaves: (L, 1) int32, each row's leaf, or (L, 2) with SOAR's second (or -1).
    first_leaf: (groups + 1,) int64: group g's leaves are first_leaf[g] .. first_leaf[g+1]-1.
  """

  centres: np.ndarray
  row_leaves: np.ndarray
  first_leaf: np.ndarray


def grouped_partition(
  rows: np.ndarray, params: ScannParams, spill: int = GROUP_SPILL, progress=None
) -> Partition:
  """Leaves trained group by group (the module docstring), their sizes and training sample
  those of a flat index of `params.num_leaves` leaves.

  Args:
    rows: (L, d) float32 rows (a memmap is read block by block).
    params: group_rows, num_leaves, training_sample_size and soar_lambda are read.
    spill: groups whose leaves a row may join (GROUP_SPILL).
    progress: called with (groups trained, groups) after each group's leaves (None: silent).
  Returns:
    The Partition."""
  num_rows = len(rows)
  num_groups = max(1, num_rows // params.group_rows)
  near = coarse_groups(rows, num_groups, spill)
  # Each group's leaves are trained on the rows whose nearest group it is.
  rows_per_leaf = num_rows / params.num_leaves
  sample_share = params.training_sample_size / num_rows
  order = np.argsort(near[:, 0], kind="stable")
  bounds = np.searchsorted(near[order, 0], np.arange(num_groups + 1))
  centres, first_leaf = [], np.zeros(num_groups + 1, np.int64)
  for g in range(num_groups):
    members = order[bounds[g] : bounds[g + 1]]
    leaves = min(len(members), max(1, round(len(members) / rows_per_leaf)))
    if leaves:
      rng = np.random.default_rng(g + 1)
      sample = max(leaves, min(len(members), round(len(members) * sample_share)))
      train = np.asarray(rows[np.sort(rng.choice(members, sample, replace=False))], np.float32)
      centres.append(kmeans(train, leaves, LEAF_KMEANS_ITERATIONS, rng))
    first_leaf[g + 1] = first_leaf[g] + leaves
    if progress is not None:
      progress(g + 1, num_groups)
  all_centres = np.concatenate(centres)
  row_leaves = _assign(rows, near, all_centres, first_leaf, params.soar_lambda)
  return Partition(all_centres, row_leaves, first_leaf)


def _assign(rows, near, centres, first_leaf, soar_lambda) -> np.ndarray:
  """(L, 1 or 2) leaf ids: `assign_leaves` over the leaves of each row's groups, for the
  rows of one set of groups at a time (one matmul against their leaves)."""
  width = 2 if soar_lambda else 1
  tokens = np.full((len(rows), width), -1, np.int32)
  groups = np.sort(near, axis=1)  # a set of groups, whatever their order
  key = groups[:, 0].astype(np.int64)
  for j in range(1, groups.shape[1]):
    key = key * len(first_leaf) + groups[:, j]
  order = np.argsort(key, kind="stable")
  starts = np.flatnonzero(np.r_[True, key[order][1:] != key[order][:-1], True])
  for a, b in itertools.pairwise(starts):
    members = np.sort(order[a:b])
    leaf_ids = np.concatenate(
      [np.arange(first_leaf[g], first_leaf[g + 1]) for g in np.unique(groups[members[0]])]
    )
    picked = assign_leaves(np.asarray(rows[members], np.float32), centres[leaf_ids], soar_lambda)
    tokens[members] = np.where(picked >= 0, leaf_ids[np.maximum(picked, 0)], -1)
  return tokens


class GroupedScannIndex(ScannIndex):
  """One ScaNN index over a shard, its leaves trained group by group (module docstring).

  Searched, saved and loaded as any ScannIndex: one ScaNN call per batch of queries, each
  query opening its `num_leaves_to_search` best leaves of the whole shard by inner product
  with their centres. `partition` keeps the leaves ScaNN was given (4 bytes per leaf a row
  is in)."""

  def __init__(
    self,
    rows: np.ndarray,
    k: int,
    params: ScannParams,
    threads: int = 0,
    spill: int = GROUP_SPILL,
    progress=None,
  ):
    """spill, progress: grouped_partition's."""
    self.partition = grouped_partition(rows, params, spill, progress)
    # The leaves are given: ScaNN trains no partition, so AVQ (a partition option) is off.
    params = dataclasses.replace(
      params, num_leaves=len(self.partition.centres), group_rows=0, avq=None
    )
    super().__init__(
      rows, k, params, threads, partition=(self.partition.centres, self.partition.row_leaves)
    )
