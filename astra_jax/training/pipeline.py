"""The numpy input pipeline: shuffled epochs of (tokens, label arrays) prepared by
background threads while the device runs the previous step.

Batch i of epoch e is a pure function of (seed, e, i), so a resumed run sees the same
batches and the threads' timing never changes results; with several threads
(`train.input_threads`) batches are prepared concurrently (numpy releases the GIL in its
bulk work) and handed over in order. The last incomplete batch of an
epoch is dropped (static shapes: one compiled step).

Every array of a batch has a leading micro-batch axis (A, B/A, ...) for gradient
accumulation (A = 1 without it); each micro-batch has its own random draws. `rows` is flat
(B,). In a multi-process run every process builds the label arrays of the whole batch
(positives and random draws are the same on every host by construction; hard-negative
blocks, and the masks that depend on them, only for the W shards this process holds: the
other blocks never reach its devices) but reads token rows only where `token_rows`
(A, B/A) is True: the rows its own devices hold.

With G > 1 data groups (the mesh's 'data' axis) the training rows are split once into G
contiguous parts (`data_group_bounds`) and group g's share of every batch comes from part g,
shuffled anew each epoch (`epoch_order`): a process then needs hard negatives only for
the parts of the groups it holds, so the replicas of a W shard divide its mining instead of
each repeating it for every query. A global batch stays a sample of all parts (G equal
strata); with G = 1 the order is one permutation of all rows, as before.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from astra_jax.data.batch import HostBatch, LabelBatch, TrainBatch, label_axes
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.negatives.schedule import NegativeSplit
from astra_jax.runtime.errors import InputError


def data_group_bounds(num_rows: int, data_groups: int) -> np.ndarray:
  """(G + 1,) row bounds: data group g draws its queries from training rows
  [bounds[g], bounds[g + 1]) (sizes differ by at most one)."""
  return np.linspace(0, num_rows, data_groups + 1).round().astype(np.int64)


def epoch_steps(num_rows: int, batch_size: int, data_groups: int = 1) -> int:
  """Steps in an epoch: each data group takes B/G rows a step from its own part, so the
  smallest part decides (with G = 1: N // B, the last incomplete batch dropped)."""
  smallest = int(np.diff(data_group_bounds(num_rows, data_groups)).min())
  return smallest // (batch_size // data_groups)


def _shuffled_part(seed: int, epoch: int, g: int, lo: int, hi: int, data_groups: int):
  """Rows [lo, hi) in the epoch's random order for data group g (G = 1: the seed the
  epoch's order always had)."""
  key = [seed, epoch, 0] + ([g] if data_groups > 1 else [])
  part = np.random.default_rng(key).permutation(hi - lo)
  part += lo  # in place: no second copy of the rows
  return part


def epoch_order(
  seed: int,
  epoch: int,
  num_rows: int,
  batch_size: int,
  micro_batches: int = 1,
  data_groups: int = 1,
) -> np.ndarray:
  """The training rows of an epoch in step order (steps x B of them; step i is
  [i B, (i + 1) B)), a pure function of its arguments.

  A batch is laid out (A, B/A) and the label side splits each micro-batch's B/A rows into G
  equal blocks over the 'data' axis (block g on data group g); block g of every micro-batch
  holds rows of part g (`data_group_bounds`), in the order of that part's own permutation.
  G = 1: one permutation of all rows (its seed is the one the order always had).
  """
  steps = epoch_steps(num_rows, batch_size, data_groups)
  block = batch_size // (micro_batches * data_groups)
  bounds = data_group_bounds(num_rows, data_groups)
  parts = (
    _shuffled_part(seed, epoch, g, lo, hi, data_groups)
    for g, (lo, hi) in enumerate(itertools.pairwise(bounds))
  )
  if data_groups == 1:  # the permutation is the order: no copy (1.3 GB at SS-20M's rows)
    return next(parts)[: steps * batch_size]
  # Filled part by part: one part's permutation is alive beside the order, not all G.
  order = np.empty((steps, micro_batches, data_groups, block), np.int64)
  for g, part in enumerate(parts):
    order[:, :, g] = part[: steps * micro_batches * block].reshape(steps, micro_batches, block)
  return order.reshape(-1)


class TrainBatches:
  def __init__(
    self,
    tokens,
    sampler: NegativeSampler,
    batch_size: int,
    seed: int,
    prefetch: int = 4,
    micro_batches: int = 1,
    token_rows: np.ndarray | None = None,
    threads: int = 1,
    data_groups: int = 1,
    held_groups: list[int] | None = None,
  ):
    self.tokens, self.sampler = tokens, sampler
    self.data_groups = data_groups
    # The data groups whose label side this process builds (None: all of them); the other
    # groups' rows are never sent to a device here.
    self.held_groups = list(range(data_groups)) if held_groups is None else list(held_groups)
    self.batch_size, self.seed, self.prefetch = batch_size, seed, max(prefetch, threads)
    self.threads = threads
    self.micro_batches = micro_batches
    self.wait_seconds = 0.0  # consumer time blocked on the next batch, all epochs
    self.num_rows = len(tokens)
    if self.num_rows < batch_size:
      raise InputError(
        f"config.train.batch_size={batch_size} exceeds the {self.num_rows} training rows"
      )
    if batch_size % micro_batches:
      raise InputError(
        f"config.train.batch_size={batch_size} is not divisible by "
        f"config.train.grad_accum_steps={micro_batches}"
      )
    if batch_size % (micro_batches * data_groups):
      raise InputError(
        f"config.train.batch_size={batch_size} does not split into "
        f"config.train.grad_accum_steps={micro_batches} micro-batches of "
        f"config.mesh.data={data_groups} equal blocks"
      )
    self.steps_per_epoch = epoch_steps(self.num_rows, batch_size, data_groups)
    if self.steps_per_epoch == 0:
      raise InputError(
        f"config.train.batch_size={batch_size}: each of the config.mesh.data={data_groups} "
        f"data groups draws {batch_size // data_groups} rows a step from its "
        f"{self.num_rows // data_groups} training rows"
      )
    self.token_rows = (
      None if token_rows is None or token_rows.all() else np.asarray(token_rows, bool).reshape(-1)
    )

  def order(self, epoch: int) -> np.ndarray:
    """The epoch's training rows in step order (`epoch_order`)."""
    return epoch_order(
      self.seed, epoch, self.num_rows, self.batch_size, self.micro_batches, self.data_groups
    )

  def make_batch(
    self,
    epoch: int,
    step: int,
    order: np.ndarray,
    hard_negatives: np.ndarray | None,
    split: NegativeSplit | None = None,
  ) -> HostBatch:
    rows = order[step * self.batch_size : (step + 1) * self.batch_size]
    rng = np.random.default_rng([self.seed, epoch, step, 1])
    hard = None if hard_negatives is None else np.asarray(hard_negatives[rows])
    a = self.micro_batches
    hards = [None] * a if hard is None else np.split(hard, a)
    counts = {} if split is None else split._asdict()
    if self.data_groups == 1 or not self.sampler.per_query_random:
      # One stream for the whole batch (a shared random draw serves all of its rows).
      parts = [self.sampler(r, rng, h, **counts) for r, h in zip(np.split(rows, a), hards)]
    else:
      parts = [
        self._held_label_side(r, h, counts, (self.seed, epoch, step, 1, i))
        for i, (r, h) in enumerate(zip(np.split(rows, a), hards))
      ]
    labels = LabelBatch(
      *(None if x is None else np.stack([p[i] for p in parts]) for i, x in enumerate(parts[0]))
    )  # (A, B/A, ...)
    if self.token_rows is None:
      ids = np.asarray(self.tokens[rows], np.int32)
    else:  # only this process's rows; the others are never sent to a device here
      ids = np.zeros((len(rows), self.tokens.shape[1]), np.int32)
      ids[self.token_rows] = self.tokens[rows[self.token_rows]]
    return HostBatch(rows.astype(np.int32), TrainBatch(ids.reshape(a, len(rows) // a, -1), labels))

  def _held_label_side(
    self, rows: np.ndarray, hard: np.ndarray | None, counts: dict, key: tuple
  ) -> LabelBatch:
    """One micro-batch's label side, built group by group with each group's own random
    stream (`key` + the group), for the held groups only: the other groups' rows are
    zeros, never sent to a device. A group's draws do not depend on which process builds
    them, so every layout of the processes trains on the same batches."""
    blocks = np.split(np.arange(len(rows)), self.data_groups)
    built = {
      g: self.sampler(
        rows[blocks[g]],
        np.random.default_rng([*key, g]),
        None if hard is None else hard[blocks[g]],
        **counts,
      )
      for g in self.held_groups
    }
    like = next(iter(built.values()))
    fields = []
    for name, axes in zip(LabelBatch._fields, label_axes(like)):
      x = getattr(like, name)
      if x is None or axes[0] != "query_group":  # absent, or the same for every row
        fields.append(x)
        continue
      empty = np.zeros_like(x)
      fields.append(
        np.concatenate(
          [getattr(built[g], name) if g in built else empty for g in range(self.data_groups)]
        )
      )
    return LabelBatch(*fields)

  def rows_before(self, epoch: int, step: int) -> np.ndarray:
    """The training rows of steps [0, step) of `epoch`."""
    order = self.order(epoch)
    return order[: step * self.batch_size]

  def epoch(
    self,
    epoch: int,
    hard_negatives: np.ndarray | None = None,
    start_step: int = 0,
    split: NegativeSplit | None = None,
  ) -> Iterator[tuple[HostBatch, float]]:
    """Yields (batch, seconds the thread spent preparing it) from `start_step` on.

    hard_negatives: (N, h) per training row, or None; split: the epoch's negatives
    (HardNegatives.start_epoch gives it; None: the sampler's defaults)."""
    order = self.order(epoch)

    def timed(step):
      t0 = time.perf_counter()
      return (self.make_batch(epoch, step, order, hard_negatives, split), time.perf_counter() - t0)

    pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"batches-epoch{epoch}")
    pending: collections.deque = collections.deque()
    steps = iter(range(start_step, self.steps_per_epoch))
    try:
      for step in steps:  # `prefetch` batches in flight, handed over in order
        pending.append(pool.submit(timed, step))
        if len(pending) == self.prefetch:
          break
      while pending:
        t0 = time.perf_counter()
        item = pending.popleft().result()  # re-raises the thread's error here
        self.wait_seconds += time.perf_counter() - t0
        step = next(steps, None)
        if step is not None:
          pending.append(pool.submit(timed, step))
        yield item
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
