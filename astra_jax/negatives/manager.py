"""Runs the schedule during training: collects query embeddings, snapshots the label
vectors, launches refreshes in the worker, swaps new negatives in, survives failures.

Files live in `<workdir>/negatives/`: `hard_epoch{e}.npy` (N x k int32, the negatives in
use; older ones are deleted once replaced), and per refresh the inputs `vectors_epoch{e}.npy`,
`queries_epoch{e}.npy` and `job_epoch{e}.json` (deleted after the refresh).
"""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np
from absl import logging

from astra_jax.data.xc_format import SparseRows
from astra_jax.negatives import index as index_lib
from astra_jax.negatives.refresh import (RefreshFailed, RefreshJob, RefreshWorker, run_job,
                                         save_labels)
from astra_jax.negatives.schedule import NegativeSchedule

VectorsFn = Callable[[], np.ndarray]            # (L, d) label vectors to index, now
EmbedFn = Callable[[np.ndarray], np.ndarray]    # training row ids -> (n, d) embeddings, now


class HardNegatives:

  def __init__(self, schedule: NegativeSchedule, workdir: str, train_labels: SparseRows,
               dim: int, backend: str = "auto", scann_knobs: dict | None = None,
               recall_sample: int = 1000, seed: int = 0, inject_fault: str = ""):
    self.schedule, self.labels, self.dim = schedule, train_labels, dim
    self.num_rows = train_labels.num_rows
    self.backend, self.scann_knobs = backend, dict(scann_knobs or {})
    self.recall_sample, self.seed, self.fault = recall_sample, seed, inject_fault
    self.dir = os.path.join(workdir, "negatives")
    self.pending: dict[int, RefreshWorker] = {}  # refresh epoch -> its running worker
    self.current: np.ndarray | None = None
    self.current_path: str | None = None
    self.current_epoch: int | None = None  # the refresh that produced `current`
    self.refreshes: list[dict] = []
    self.queries: np.ndarray | None = None
    self.filled: np.ndarray | None = None
    self.collect_for: int | None = None
    if schedule.uses_index:
      os.makedirs(self.dir, exist_ok=True)
      self.labels_path = os.path.join(self.dir, "train_labels.npz")
      save_labels(self.labels_path, train_labels)

  def _paths(self, epoch: int) -> dict[str, str]:
    p = lambda name: os.path.join(self.dir, f"{name}_epoch{epoch}")
    return {"vectors": p("vectors") + ".npy", "queries": p("queries") + ".npy",
            "out": p("hard") + ".npy", "stats": p("stats") + ".json", "job": p("job") + ".json"}

  def _job(self, epoch: int) -> RefreshJob:
    paths = self._paths(epoch)
    fault, self.fault = self.fault, ""  # an injected fault hits the first refresh only
    return RefreshJob(epoch, paths["vectors"], paths["queries"], self.labels_path, paths["out"],
                      paths["stats"], self.schedule.mined_k(), self.backend, self.scann_knobs,
                      self.recall_sample, self.seed + epoch, fault)

  # ------------------------------------------------------------------------ epochs
  def start_epoch(self, epoch: int, vectors_fn: VectorsFn, embed_fn: EmbedFn
                  ) -> tuple[np.ndarray | None, int, int]:
    """Swaps in the negatives `epoch` trains with: (hard (N, h) or None, h, num_random)."""
    if epoch in self.schedule.refresh_epochs:
      t0 = time.time()
      try:
        if epoch in self.pending:
          stats = self.pending.pop(epoch).wait()
        else:  # nothing pipelined (tau_s < 2): collect and mine now, blocking
          logging.info("negatives: refresh for epoch %d runs synchronously", epoch)
          self._write_inputs(epoch, vectors_fn(), embed_fn(np.arange(self.num_rows)))
          stats = run_job(self._job(epoch))
        self._swap(epoch)
        stats.update(wait_s=round(time.time() - t0, 3), ok=True)
        logging.info("negatives: epoch %d swapped in (build %.2fs, search %.2fs, recall %s, "
                     "waited %.2fs)", epoch, stats["build_s"], stats["search_s"],
                     stats["recall"], stats["wait_s"])
      except Exception as e:  # RefreshFailed or any other: training goes on with what it had
        stats = {"epoch": epoch, "ok": False, "error": str(e)[:300],
                 "wait_s": round(time.time() - t0, 3)}
        logging.warning("negatives: %s; epoch %d keeps the %s", e, epoch,
                        "previous hard negatives" if self.current is not None else
                        "random negatives")
      finally:
        self._cleanup_inputs(epoch)
      self.refreshes.append(stats)
    h, r = self.schedule.split(epoch, self.current is not None)
    # uptodate has h > 0 without a file: its hard negatives are mined inside the step.
    hard = None if h == 0 or self.current is None else self.current[:, :h]
    self.collect_for = self.schedule.refresh_collected_in(epoch)
    if self.collect_for is not None:
      self.queries = np.lib.format.open_memmap(
          self._paths(self.collect_for)["queries"] + ".partial", "w+", np.float32,
          (self.num_rows, self.dim))
      self.filled = np.zeros(self.num_rows, bool)
    return hard, h, r

  @property
  def collecting(self) -> bool:
    return self.collect_for is not None

  def collect(self, rows: np.ndarray, embeddings: np.ndarray) -> None:
    self.queries[rows] = embeddings
    self.filled[rows] = True

  def end_epoch(self, epoch: int, vectors_fn: VectorsFn, embed_fn: EmbedFn) -> None:
    """After the collection epoch: fill rows the epoch skipped, snapshot, launch."""
    if self.collect_for is None:
      return
    r, self.collect_for = self.collect_for, None
    missing = np.nonzero(~self.filled)[0]
    if len(missing):  # rows of the dropped last batch
      self.queries[missing] = embed_fn(missing)
    self.queries.flush()
    paths = self._paths(r)
    del self.queries
    self.queries = None
    os.replace(paths["queries"] + ".partial", paths["queries"])
    index_lib.save_atomic(paths["vectors"], np.asarray(vectors_fn(), np.float32))
    # With tau_r = 1 the refresh for r - 1 may still be running: each has its own worker.
    self.pending[r] = RefreshWorker()
    self.pending[r].start(self._job(r), paths["job"])
    logging.info("negatives: refresh for epoch %d launched (%d queries, W snapshot of epoch %d)",
                 r, self.num_rows, epoch)

  # ----------------------------------------------------------------------- helpers
  def _write_inputs(self, epoch: int, vectors: np.ndarray, queries: np.ndarray) -> None:
    paths = self._paths(epoch)
    index_lib.save_atomic(paths["vectors"], np.asarray(vectors, np.float32))
    index_lib.save_atomic(paths["queries"], np.asarray(queries, np.float32))

  def _swap(self, epoch: int) -> None:
    path = self._paths(epoch)["out"]
    new = np.load(path, mmap_mode="r")
    if new.shape != (self.num_rows, self.schedule.mined_k()):
      raise RefreshFailed(f"{path} has shape {new.shape}, expected "
                          f"{(self.num_rows, self.schedule.mined_k())}")
    old, self.current, self.current_path = self.current_path, new, path
    self.current_epoch = epoch
    if old and old != path and os.path.exists(old):
      os.remove(old)

  def _cleanup_inputs(self, epoch: int) -> None:
    paths = self._paths(epoch)
    for key in ("vectors", "queries", "job", "stats"):
      for p in (paths[key], paths[key] + ".log"):
        if os.path.exists(p):
          os.remove(p)

  def close(self) -> None:
    for worker in self.pending.values():
      worker.stop()
    self.pending.clear()

  def summary(self) -> dict:
    return {"strategy": self.schedule.strategy, "k_h": self.schedule.k_h,
            "k_r": self.schedule.k_r, "tau_s": self.schedule.tau_s, "tau_r": self.schedule.tau_r,
            "index": self.backend, "refreshes": self.refreshes}
