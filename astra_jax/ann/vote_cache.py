"""The neighbour votes of the rows a search ranks, kept for its next search of the same
rows (ann/sharded_topk.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np

from astra_jax.xc.neighbour_vote import Votes


@dataclasses.dataclass
class VoteCache:
  """One process's votes for the rows it ranks, block by block, kept for the next search of
  the same rows from the same memory: the score choice's candidate weights change the
  vote's weight, not its neighbours. It holds the process's own rows only, in RAM or, with a
  `directory`, as .npy files read back memory-mapped (SS-20M's 7.3M validation rows a
  process: 13.9 GiB that the page cache holds while there is room, not the process).

  Attributes:
    directory: where the votes are written (None: kept in RAM); emptied by `clear`.
    blocks: (the vote's settings but its weight, block start, stop, rows per block) ->
      this process's Votes for the rows of the block its devices hold, in their order.
  """

  directory: str | None = None
  blocks: dict = dataclasses.field(default_factory=dict)

  def get(self, key: tuple) -> Votes | None:
    """The votes kept under `key`, or None."""
    return self.blocks.get(key)

  def put(self, key: tuple, votes: Votes) -> Votes:
    """Keeps `votes` under `key`; returns them as kept (memory-mapped with a directory)."""
    if self.directory is not None:
      os.makedirs(self.directory, exist_ok=True)
      stem = os.path.join(self.directory, f"block{len(self.blocks)}")
      arrays = []
      for name, array in (("ids", votes.ids), ("values", votes.values)):
        np.save(f"{stem}.{name}.npy", array)
        arrays.append(np.load(f"{stem}.{name}.npy", mmap_mode="r"))
      votes = Votes(*arrays)
    self.blocks[key] = votes
    return votes

  def clear(self) -> None:
    """Forgets every block, and removes the directory."""
    self.blocks.clear()
    if self.directory is not None:
      shutil.rmtree(self.directory, ignore_errors=True)
