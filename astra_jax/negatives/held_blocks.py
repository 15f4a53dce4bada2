"""Hard negatives held per W shard: the array-like view a process whose devices hold only
some of W's shards (or some query rows) gives the sampler, as if it held the whole table."""

from __future__ import annotations

import numpy as np


class HeldBlocks:
  """(N, S, h) negatives of which this process holds the rows [lo, hi) of the shard blocks
  `shard_ids`; the others read -1 (none)."""

  def __init__(
    self,
    local: np.ndarray,
    shard_ids: list,
    num_shards: int,
    query_rows: tuple[int, int],
    num_rows: int,
  ):
    self.local, self.shard_ids, self.num_shards = local, shard_ids, num_shards
    (self.lo, self.hi), self.num_rows = query_rows, num_rows

  def __len__(self) -> int:
    return self.num_rows

  def __getitem__(self, rows) -> np.ndarray:
    rows = np.asarray(rows)
    held = np.nonzero((rows >= self.lo) & (rows < self.hi))[0]
    out = np.full((len(rows), self.num_shards, self.local.shape[-1]), -1, np.int32)
    out[np.ix_(held, self.shard_ids)] = np.asarray(self.local[rows[held] - self.lo])
    return out
