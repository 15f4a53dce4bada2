"""How the neighbour vote finds the memory rows nearest a query (`scoring.neighbour_search`).

The vote (xc/neighbour_vote.py) needs each query's k most cosine-similar rows of the memory,
the N training rows' unit embeddings. Two ways:

  * exact: `vote_memory.nearest`, (query block x key block) tiles on the device, O(N d)
    per query. Right for the CPU recipe's memories (10^4-10^5 rows), where a search is
    seconds, and on accelerators.
  * scann: a ScaNN index over the memory (index.py, as the refresh searches W), built
    on the host once per memory and cached with it; a query scores about
    `scoring.neighbour_search_rows` rows in its nearest leaves, then re-ranks its best
    candidates exactly, so its cost no longer grows with N, but its recall at a fixed
    budget does fall as N grows. At SS-20M's 146M rows the exact search is ~6e17 flop,
    hours on a GPU and out of reach of CPUs.

`auto` (the default) searches exactly on a GPU or TPU, and on CPUs exactly until the memory
holds more than AUTO_ROWS_PER_BUDGET times the budget (200,000 rows at the default 50,000),
with ScaNN above. Without ScaNN installed every search is exact.

Where the memory lives (`scoring.neighbour_memory`, LAYOUTS): split over the devices that
encoded it (mesh_memory.py) where a device's share fits, else over the processes' hosts,
each its own rows (process_memory.py).
No jax here: the planner reads this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from astra_jax.ann import index

# Rows a ScaNN search scores per query, by default (`scoring.neighbour_search_rows`).
SCANN_ROWS_PER_QUERY = 50_000
# `auto` uses ScaNN on CPUs only for a memory of more than this many times the budget: at a
# quarter of the rows a query, debian-builddeps' real memory kept recall@50 0.96 and the
# vote's P@1 within 0.3 of the exact search's, and below that ScaNN saves less than 4x.
AUTO_ROWS_PER_BUDGET = 4
# Query rows a search of a memory on the processes' hosts takes at once (process_memory.py):
# each search streams the process's share of the keys to its device, 4 d bytes a row, and
# scores 2 d flop a row for each query: on a V100 (7.85e12 flop/s in the search, ~12 GB/s
# from the host) the transfer takes 1,300 / Q of the flops' time for Q queries, 1/50 with
# this many, 1.3x with one block of 1,024.
PROCESS_QUERY_ROWS = 1 << 16
# A device's share of the memory (mesh_memory.py) may take at most this part of the device
# memory free after training, the rest left to the search's tiles and the evaluation's
# batches; a larger memory stays on the processes' hosts, each its own rows
# (process_memory.py).
DEVICE_ROOM_FRACTION = 0.5


@dataclasses.dataclass(frozen=True)
class MemorySearch:
  """One way of searching the memory (`scoring.neighbour_search`).

  Attributes:
    name: the config's name for it.
    scann: whether it ever searches with ScaNN.
    on_accelerators: whether it does so where the exact search runs on a GPU or TPU.
    rows_per_budget: ScaNN only for a memory of more than this many times the rows a
      query scores (0: any memory).
  """

  name: str
  scann: bool
  on_accelerators: bool
  rows_per_budget: int

  def uses_scann(self, rows: int, search_rows: int, accelerator: bool) -> bool:
    """Whether a memory is searched with ScaNN (when it is installed).

    Args:
      rows: the memory's rows.
      search_rows: the rows a ScaNN search would score per query.
      accelerator: whether the exact search would run on a GPU or TPU.
    """
    if not self.scann or (accelerator and not self.on_accelerators):
      return False
    return rows > self.rows_per_budget * search_rows


# `auto` keeps the exact search on accelerators: there it is a matmul at tens of TFLOP/s
# (SS-20M's 146M rows: hours on one GPU, once after training) with recall 1, where ScaNN's
# recall at a fixed budget falls as the memory grows (docs/results/vote_search.md).
SEARCHES = {
  s.name: s
  for s in (
    MemorySearch("auto", scann=True, on_accelerators=False, rows_per_budget=AUTO_ROWS_PER_BUDGET),
    MemorySearch("exact", scann=False, on_accelerators=False, rows_per_budget=0),
    MemorySearch("scann", scann=True, on_accelerators=True, rows_per_budget=0),
  )
}


def device_share_bytes(rows: int, d: int, devices: int) -> int:
  """Bytes of one device's share of a memory of `rows` keys of width `d` split over
  `devices`: its keys (float32) and their row ids (int32)."""
  return -(-rows // devices) * (4 * d + 4)


def fits_devices(rows: int, d: int, devices: int, room: int | None) -> bool:
  """Whether the memory is split over the devices (mesh_memory.py) rather than held on the
  host: its share of a device within DEVICE_ROOM_FRACTION of `room`, the device's free bytes
  after training (None: unknown, as on CPUs, where it always is)."""
  return room is None or device_share_bytes(rows, d, devices) <= DEVICE_ROOM_FRACTION * room


@dataclasses.dataclass(frozen=True)
class MemoryLayout:
  """Where the vote's memory lives after training (`scoring.neighbour_memory`).

  Attributes:
    name: the config's name for it.
    on_devices: (rows, d, devices, room) -> whether the keys are split over the devices
      (mesh_memory.py) rather than over the processes' hosts (process_memory.py); `room` is
      a device's free bytes after training, None where the backend does not say.
  """

  name: str
  on_devices: Callable[[int, int, int, int | None], bool]


# `auto` keeps the keys on the devices where a device's share fits beside what training left
# there; `hosts` keeps the devices free for the evaluation's batches whatever the room.
LAYOUTS = {
  layout.name: layout
  for layout in (
    MemoryLayout("auto", fits_devices),
    MemoryLayout("devices", lambda rows, d, devices, room: True),
    MemoryLayout("hosts", lambda rows, d, devices, room: False),
  )
}


def scann_params(rows: int, k: int, rows_per_query: int) -> index.ScannParams:
  """The index's knobs: scann_defaults' fixed-cost rule (leaves of ~1,000 rows once N is
  large, as many searched as hold `rows_per_query` rows, the best 20 k re-ranked exactly)."""
  return index.scann_defaults(rows, k, rows_per_query=min(rows_per_query, rows))


def scann_index(keys: np.ndarray, params: index.ScannParams, threads: int = 0) -> index.ScannIndex:
  """A ScaNN index over the memory's unit keys (inner product = cosine).

  Args:
    keys: (N, d) unit-norm rows.
    params: its knobs (`scann_params`).
    threads: the build's and searches' threads (0: ScaNN's default, every core).
  Returns:
    The index.
  """
  return index.ScannIndex(keys, 1, params, threads)  # each search gives its own k
