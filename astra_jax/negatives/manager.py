"""Runs the schedule during training: collects query embeddings, snapshots the label
vectors, launches refreshes in the worker, swaps new negatives in, survives failures.

Files live in `<workdir>/negatives/`: `hard_epoch{e}.npy` (n x k int32, the negatives in
use for the n training rows this process's data groups draw from: all N with one group),
and per refresh the inputs `vectors_epoch{e}.npy`, `queries_epoch{e}.npy` and
`job_epoch{e}.json` (deleted once the next refresh is consumed).

At most two negatives files exist: the one in use and the one a worker is writing. One
worker runs at a time: with tau_r = 1 a refresh's inputs are ready (end of epoch r - 2)
before the previous refresh is swapped in (start of r - 1), and its worker starts at that
swap. The file replaced is deleted at the swap: the trainer waits for the checkpoint before
a refresh epoch to be on disk (trainer.py), so the newest checkpoint names it only as the
negatives of a state that resumes at the start of that refresh epoch, where the refresh runs
again from its inputs (kept) before any batch needs negatives (`load_state`). Older
checkpoints that name it are unusable; resume sets them aside and takes the newest one.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from astra_jax.ann.index import IndexKnobs
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives import mining
from astra_jax.negatives.held_blocks import HeldBlocks
from astra_jax.negatives.refresh import (
  InProcessRefresh,
  RefreshFailed,
  RefreshFiles,
  RefreshJob,
  RefreshWorker,
  positives_source,
  run_job,
)
from astra_jax.negatives.schedule import NegativeSchedule, NegativeSplit
from astra_jax.runtime import distributed

DEFAULT_INDEX = IndexKnobs()  # "auto", the ScaNN knobs scaled to L
VectorsFn = Callable[[], np.ndarray]  # (L, d) label vectors to index, now
EmbedFn = Callable[[np.ndarray], np.ndarray]  # training row ids -> (n, d) embeddings, now


class HardNegatives:
  """The refresh manager: the hard negatives each epoch trains with, and the refreshes
  that mine them (see the module docstring for the files and their lifetimes).

  Args:
    schedule: which epochs collect, refresh and swap, and how many negatives they mine.
    workdir: the run's workdir (files go to its `negatives/`).
    train_labels: the training rows' positives (removed from the mined negatives).
    dim: d, the width of the collected query embeddings.
    index: the index each refresh builds (ann/index.py).
    refresh_backend: "host" (a worker process beside training) or "device" (exact, on the
      training devices, when the swap waits for it).
    recall_sample: queries whose recall against exact search each refresh reports.
    seed: the refreshes' seed (refresh e uses seed + e).
    inject_fault: a fault for the first refresh (tests and benchmarks/faults.py).
    shards: each W shard's global row range [lo, hi) (default: one shard over all labels).
    shard_ids: the shards this process mines for (default: all).
    num_shards: the shards of the whole run.
    threads: each worker's thread budget (cpu_budget.refresh_threads; 0: the default).
    queries_dir: where the collected query embeddings live (default: the process's own
      `negatives/`). In a multi-process run every process holds the same gathered
      embeddings, so one file serves them all (each worker reads its `query_rows`): every
      process names the same directory and only the process with `writes_queries` writes
      it.
    writes_queries: whether this process writes the collected embeddings.
    query_rows: the training rows [lo, hi) this process mines for (default: all): those
      its data groups draw batches from (pipeline.data_group_bounds). The negatives file
      holds these rows only; the other rows read -1 (none) and never reach its devices.
  """

  def __init__(
    self,
    schedule: NegativeSchedule,
    workdir: str,
    train_labels: SparseRows,
    dim: int,
    index: IndexKnobs = DEFAULT_INDEX,
    refresh_backend: str = "host",
    recall_sample: int = 1000,
    seed: int = 0,
    inject_fault: str = "",
    shards: list | None = None,
    shard_ids: list | None = None,
    num_shards: int = 1,
    threads: int = 0,
    queries_dir: str | None = None,
    writes_queries: bool = True,
    query_rows: tuple[int, int] | None = None,
  ):
    self.schedule, self.labels, self.dim = schedule, train_labels, dim
    self.num_rows = train_labels.num_rows
    self.query_rows = tuple(query_rows or (0, self.num_rows))
    self.index, self.refresh_backend = index, refresh_backend
    self.recall_sample, self.seed, self.fault = recall_sample, seed, inject_fault
    self.threads = threads  # each worker's thread budget (cpu_budget.refresh_threads)
    # Polled while the trainer waits for a refresh: a stop request (SIGTERM) ends the wait
    # with RefreshInterrupted, the refresh left pending for the resumed run.
    self.stop_requested: Callable[[], bool] = lambda: False
    # One index per W shard (global row ranges [lo, hi)); the negatives are k per shard,
    # grouped. In a multi-process run a process mines for the shards it holds (`shard_ids`
    # of `num_shards`) and leaves the others' blocks -1: they never reach its devices.
    self.shards = shards or [[0, train_labels.num_cols]]
    self.shard_ids = list(range(len(self.shards))) if shard_ids is None else list(shard_ids)
    self.num_shards = max(num_shards, len(self.shards))
    self.dir = os.path.join(workdir, "negatives")
    self.queries_dir = queries_dir or self.dir
    self.writes_queries = writes_queries
    self.pending: dict[int, RefreshWorker] = {}  # refresh epoch -> its running worker
    self.deferred: list[int] = []  # refreshes whose inputs wait for the running one to end
    self.current: np.ndarray | None = None
    self.current_path: str | None = None
    self.current_epoch: int | None = None  # the refresh that produced `current`
    # A file the newest checkpoint names but that is not in use (mined for another number
    # of W shards, or an older checkpoint's second generation): deleted at the next swap.
    self.previous_path: str | None = None
    self.consumed: list[int] = []  # refreshes whose inputs are still on disk
    self.refreshes: list[dict] = []
    self.queries: np.ndarray | None = None
    self.filled: np.ndarray | None = None
    self.collect_for: int | None = None
    self._in_flight: tuple[np.ndarray, jax.Array] | None = None  # collect_step's last step
    if schedule.uses_index:
      os.makedirs(self.dir, exist_ok=True)
      os.makedirs(self.queries_dir, exist_ok=True)
      self.labels_path = positives_source(train_labels, self.dir)

  def _paths(self, epoch: int) -> RefreshFiles:
    return RefreshFiles.at(self.dir, self.queries_dir, epoch)

  def _job(self, epoch: int) -> RefreshJob:
    paths = self._paths(epoch)
    fault, self.fault = self.fault, ""  # an injected fault hits the first refresh only
    return RefreshJob(
      epoch=epoch,
      vectors_path=paths.vectors,
      queries_path=paths.queries,
      labels_path=self.labels_path,
      out_path=paths.out,
      stats_path=paths.stats,
      k=self.schedule.mined_k(),
      backend="device" if self.refresh_backend == "device" else self.index.kind,
      scann_knobs=self.index.scann_knobs(),
      recall_sample=self.recall_sample,
      seed=self.seed + epoch,
      fault=fault,
      shards=self.shards,
      threads=self.threads,
      query_rows=list(self.query_rows),
    )

  def start_epoch(
    self,
    epoch: int,
    vectors_fn: VectorsFn,
    embed_fn: EmbedFn,
    resumed_rows: np.ndarray | None = None,
  ) -> tuple[np.ndarray | None, NegativeSplit]:
    """Swaps in the negatives `epoch` trains with, waiting for its refresh if it has one,
    and starts collecting embeddings when `epoch` is a collection epoch.

    Args:
      epoch: the epoch about to start.
      vectors_fn: W (or the label embeddings) to index now, for a refresh run in place.
      embed_fn: embeddings of training rows now, for a refresh run in place.
      resumed_rows: resuming mid-epoch (the swap is done, see load_state); these rows'
        embeddings were collected before the interruption.
    Returns:
      (hard negatives (N, c) or None, split): split is the sampler's num_hard (h),
      num_random and random_columns (schedule.columns: c >= h hard and random_columns >=
      num_random columns, the extra ones masked by the sampler).
    Raises:
      RefreshInterrupted: a stop was requested while it waited for the refresh (nothing
        changed: the refresh stays pending, its worker running until `close`).
    """
    if epoch in self.deferred:  # (not reached by the schedule: its swap launches it)
      self.deferred.remove(epoch)
      self._launch(epoch)
    if epoch in self.schedule.refresh_epochs and resumed_rows is None:
      self._swap_in(epoch, vectors_fn, embed_fn)
    self._launch_deferred()
    hard, split = self._hard_negatives(epoch)
    self._start_collecting(epoch, resumed_rows)
    return hard, split

  def _swap_in(self, epoch: int, vectors_fn: VectorsFn, embed_fn: EmbedFn) -> None:
    """Waits for `epoch`'s refresh (or runs it in place) and makes its negatives current;
    a failed refresh leaves the current ones, everywhere alike."""
    t0 = time.time()
    new, error = None, None
    if epoch in self.pending:
      self.pending[epoch].join(self.stop_requested)
    try:
      if epoch in self.pending:
        stats = self.pending.pop(epoch).wait()
      else:  # nothing pipelined (tau_s < 2): collect and mine now, blocking
        logging.info("negatives: refresh for epoch %d runs synchronously", epoch)
        self._write_inputs(epoch, vectors_fn(), embed_fn)
        stats = run_job(self._job(epoch))
      new = self._load(epoch)
    except Exception as e:  # RefreshFailed or any other: training goes on with what it had
      error = str(e)[:300]
    finally:
      # Inputs stay until the next refresh is consumed: a resume from the checkpoint
      # taken just before this one reruns it from them.
      for old in [r for r in self.consumed if r != epoch]:
        self._cleanup_inputs(old)
      self.consumed = [epoch]
    # Every process must train with the same kind of negatives (the batch shapes depend
    # on it): a refresh counts only if it succeeded everywhere.
    if not distributed.all_true(error is None) and error is None:
      error = "a refresh failed on another process"
    if error is None:
      self._commit(epoch, new)
      stats.update(wait_s=round(time.time() - t0, 3), ok=True)
      logging.info(
        "negatives: epoch %d swapped in (build %.2fs, search %.2fs, recall %s, waited %.2fs)",
        epoch,
        stats["build_s"],
        stats["search_s"],
        stats["recall"],
        stats["wait_s"],
      )
    else:
      stats = {"epoch": epoch, "ok": False, "error": error, "wait_s": round(time.time() - t0, 3)}
      logging.warning(
        "negatives: %s; epoch %d keeps the %s",
        error,
        epoch,
        "previous hard negatives" if self.current is not None else "random negatives",
      )
    self.refreshes.append(stats)

  def _hard_negatives(self, epoch: int) -> tuple[np.ndarray | None, NegativeSplit]:
    """This process's hard negatives for `epoch` and the sampler's split of its draws."""
    have = self.current is not None
    h, r = self.schedule.split(epoch, have)
    hard_columns, random_columns = self.schedule.columns(epoch, have)
    # uptodate has h > 0 without a file: its hard negatives are mined inside the step.
    hard = None
    if h and have:
      lo, hi = self.query_rows
      mine = self.current.reshape(hi - lo, len(self.shards), -1)[:, :, :hard_columns]
      hard = (
        mine
        if len(self.shards) == self.num_shards and (lo, hi) == (0, self.num_rows)
        else HeldBlocks(mine, self.shard_ids, self.num_shards, self.query_rows, self.num_rows)
      )
    return hard, NegativeSplit(h, r, random_columns)

  def _start_collecting(self, epoch: int, resumed_rows: np.ndarray | None) -> None:
    """Opens the file that `epoch`'s embeddings go to, when a refresh collects them now."""
    self.collect_for = self.schedule.refresh_collected_in(epoch)
    if self.collect_for is not None and self.writes_queries:
      done = self._paths(self.collect_for).queries
      path = done + ".partial"
      self.filled = np.zeros(self.num_rows, bool)
      if resumed_rows is not None and not os.path.exists(path) and os.path.exists(done):
        os.replace(done, path)  # the interrupted run had finished this epoch's collection
      if resumed_rows is not None and os.path.exists(path):
        self.queries = np.lib.format.open_memmap(path, "r+")
        self.filled[resumed_rows] = True
      else:
        self.queries = np.lib.format.open_memmap(path, "w+", np.float32, (self.num_rows, self.dim))

  @property
  def collecting(self) -> bool:
    return self.collect_for is not None

  def collect(self, rows: np.ndarray, embeddings: np.ndarray) -> None:
    """Records a step's query embeddings for the refresh being collected for.

    Args:
      rows: (b,) training row ids of the step's queries.
      embeddings: (b, d) their E(x), on the host.
    """
    if self.queries is None:  # another process writes the shared file
      return
    self.queries[rows] = embeddings
    self.filled[rows] = True

  def collect_step(self, rows: np.ndarray, pooled: jax.Array) -> None:
    """A train step's query embeddings (before embedding dropout, on the devices), when
    this epoch collects them.

    In one process they are stored one step late: the copy to the host starts now and
    overlaps the next step, and the previous step's arrive here. In several, the one file
    serves every process's worker, so they are gathered from all processes now (a
    collective every process joins) and the one process that `writes_queries` stores them.

    Args:
      rows: the step's training row ids (B,).
      pooled: (B, d) E(x) of those rows, as the step returned it.
    """
    if not self.collecting:
      return
    if jax.process_count() > 1:
      self.collect(rows, distributed.gather_rows(pooled))
      return
    self.collect_pending()
    pooled.copy_to_host_async()
    self._in_flight = (rows, pooled)

  def collect_pending(self) -> None:
    """Stores the step whose embeddings `collect_step` left in flight, if any."""
    if self._in_flight is not None:
      rows, pooled = self._in_flight
      self._in_flight = None
      self.collect(rows, np.asarray(pooled))

  def end_epoch(self, epoch: int, vectors_fn: VectorsFn, embed_fn: EmbedFn) -> None:
    """After a collection epoch: embeds the rows the epoch skipped, snapshots the label
    vectors and launches the refresh (or defers it while another one runs).

    Args:
      epoch: the epoch that ended.
      vectors_fn: the label vectors to index (W), now.
      embed_fn: embeddings of training rows, now.
    """
    self.collect_pending()
    if self.collect_for is None:
      return
    r, self.collect_for = self.collect_for, None
    paths = self._paths(r)
    if self.writes_queries:
      missing = np.nonzero(~self.filled)[0]
      if len(missing):  # rows of the dropped last batch
        self.queries[missing] = embed_fn(missing)
      self.queries.flush()
      del self.queries
      self.queries = None
      os.replace(paths.queries + ".partial", paths.queries)
    distributed.barrier(f"negatives: queries of refresh {r} written")
    mining.save_atomic(paths.vectors, np.asarray(vectors_fn(), np.float32))
    # With tau_r = 1 the refresh for r - 1 is still pending: r's worker starts at its swap.
    self.deferred.append(r)
    self._launch_deferred()
    logging.info(
      "negatives: refresh for epoch %d %s (%d queries, W snapshot of epoch %d)",
      r,
      "launched" if r in self.pending else "waits for the running one",
      self.num_rows,
      epoch,
    )

  def _launch(self, r: int) -> None:
    self.pending[r] = InProcessRefresh() if self.refresh_backend == "device" else RefreshWorker()
    self.pending[r].start(self._job(r), self._paths(r).job)

  def _launch_deferred(self) -> None:
    """Starts the oldest deferred refresh when no worker runs (one negatives file being
    written at a time)."""
    if self.deferred and not self.pending:
      self._launch(self.deferred.pop(0))

  def _write_inputs(self, epoch: int, vectors: np.ndarray, embed_fn: EmbedFn) -> None:
    paths = self._paths(epoch)
    mining.save_atomic(paths.vectors, np.asarray(vectors, np.float32))
    if self.writes_queries:
      mining.save_embedded(paths.queries, self.num_rows, self.dim, embed_fn)
    distributed.barrier(f"negatives: queries of refresh {epoch} written")

  def _load(self, epoch: int) -> np.ndarray:
    path = self._paths(epoch).out
    new = np.load(path, mmap_mode="r")
    lo, hi = self.query_rows
    want = (hi - lo, len(self.shards) * self.schedule.mined_k())
    if new.shape != want:
      raise RefreshFailed(f"{path} has shape {new.shape}, expected {want}")
    return new

  def _commit(self, epoch: int, new: np.ndarray) -> None:
    # The file replaced goes now (module docstring: no checkpoint resume needs it).
    path = self._paths(epoch).out
    replaced = [self.current_path, self.previous_path]
    self.current, self.current_path, self.current_epoch = new, path, epoch
    self.previous_path = None
    for old in replaced:
      if old and old != path and os.path.exists(old):
        os.remove(old)

  def flush(self) -> None:
    """Everything collected up to the last step on disk (before a checkpoint names it)."""
    self.collect_pending()
    if self.queries is not None:
      self.queries.flush()

  def state_dict(self) -> dict:
    """The JSON-ready record a checkpoint keeps (`load_state` reads it back)."""
    # File names only: the workdir may be reached by another path after a move or resume.
    name = lambda p: os.path.basename(p) if p else None
    return {
      "current_path": name(self.current_path),
      "current_epoch": self.current_epoch,
      "previous_path": name(self.previous_path),
      "refreshes": self.refreshes,
      "pending": sorted([*self.pending, *self.deferred]),
      "consumed": self.consumed,
      "num_shards": self.num_shards,
      "query_rows": list(self.query_rows),
    }

  def load_state(self, state: dict, resumes_at: tuple[int, int] | None = None) -> None:
    """Back to a checkpoint's state; refreshes that were running are started again from
    their inputs (deterministic: the same negatives).

    Args:
      state: what state_dict returned.
      resumes_at: the checkpoint's (epoch, step within it). At step 0 of a refresh epoch
        the negatives it names may be gone (replaced by that refresh, see the module
        docstring): the refresh runs again before they would be used.
    Raises:
      RefreshFailed: the negatives the checkpoint trains with are missing."""
    self.close()
    # (older checkpoints stored the paths as given: their file name is in self.dir too)
    here = lambda p: os.path.join(self.dir, os.path.basename(p)) if p else None
    path, previous = here(state["current_path"]), here(state["previous_path"])
    if previous and not os.path.exists(previous):
      previous = None
    if path and not os.path.exists(path):
      epoch, step = resumes_at or (None, None)
      if step != 0 or epoch not in self.schedule.refresh_epochs:
        raise RefreshFailed(f"{path}: the checkpoint's hard negatives are missing")
      logging.info(
        "negatives: %s was replaced by the refresh for epoch %d, which runs again now", path, epoch
      )
      path = None
    # A file mined per shard of another mesh.model (no block is a top-k over a new shard's
    # rows) or for training rows [a, b) that do not cover this process's (older checkpoints:
    # all rows) is of no use here.
    saved_shards = state.get("num_shards", self.num_shards)
    a, b = state.get("query_rows", [0, self.num_rows])
    lo, hi = self.query_rows
    unusable = (
      f"was mined for {saved_shards} classifier shards, this run has {self.num_shards}"
      if saved_shards != self.num_shards
      else f"was mined for training rows [{a}, {b}), this process trains on [{lo}, {hi})"
      if not (a <= lo and hi <= b)
      else None
    )
    if path and unusable:
      logging.warning("negatives: %s %s: random negatives until the next refresh", path, unusable)
      if previous and previous != path and os.path.exists(previous):
        os.remove(previous)
      path, previous = None, path
    self.current = np.load(path, mmap_mode="r")[lo - a : hi - a] if path else None
    self.current_path, self.previous_path = path, previous
    self.current_epoch = state["current_epoch"] if path else None
    self.refreshes = state["refreshes"]
    self.consumed = state["consumed"]
    self.deferred = sorted(state["pending"])
    self._launch_deferred()

  def _cleanup_inputs(self, epoch: int) -> None:
    paths = self._paths(epoch)
    inputs = [paths.vectors, paths.job, paths.stats] + [paths.queries] * self.writes_queries
    for path in inputs:
      for p in (path, path + ".log"):
        if os.path.exists(p):
          os.remove(p)
    # A worker killed mid-mining (SIGKILL, OOM) never removes its N x k temporary output.
    for p in glob.glob(glob.escape(paths.out) + ".tmp-*"):
      os.remove(p)

  def finish(self) -> None:
    """At the end of training: only the negatives in use stay on disk."""
    for r in self.consumed:
      self._cleanup_inputs(r)
    if self.previous_path and os.path.exists(self.previous_path):
      os.remove(self.previous_path)

  def close(self) -> None:
    for worker in self.pending.values():
      worker.stop()
    self.pending.clear()
    self.deferred.clear()

  def summary(self) -> dict:
    """results.json's "negatives": the schedule's numbers and every refresh's record."""
    return {
      "strategy": self.schedule.strategy.name,
      "k_h": self.schedule.k_h,
      "k_r": self.schedule.k_r,
      "tau_s": self.schedule.tau_s,
      "tau_r": self.schedule.tau_r,
      "index": self.index.kind,
      "refreshes": self.refreshes,
    }
