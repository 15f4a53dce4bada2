"""One hard-negative refresh as a job, run in a worker process off the critical path.

A job reads a snapshot of the label vectors (W, or label-text embeddings E(z_l)) and the
training queries' embeddings from .npy files, builds an index, mines k negatives per query
(positives removed), writes them atomically to `out_path` and its timings and recall to
`stats_path`, then exits (dropping the index). The worker is a separate process
(`python -m astra_jax.negatives.refresh JOB.json`): ScaNN runs on the host's cores beside
training, and an exception, a kill or an out-of-memory in it cannot take training down.

The worker's thread pools (ScaNN's, and numpy's BLAS / OpenMP through the environment it
starts with) are held to `job.threads`, the task's CPU share (cpu_budget.py). It ignores
SIGTERM and SIGINT: a preemption signals every process of the job, and the trainer, which
checkpoints the refresh as pending, stops the worker itself; the refresh then runs again
after the requeue instead of being recorded as failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np

from astra_jax.ann import index as index_lib
from astra_jax.data import csr_files, label_cache, sparse_rows
from astra_jax.data.sparse_rows import SelectedRows, SparseRows, WithLabelRows
from astra_jax.data.xc_format import atomic_text_writer
from astra_jax.negatives import mining
from astra_jax.runtime import cpu_budget, host_memory, tmpnames


class RefreshFiles(NamedTuple):
  """The files of one refresh (the manager's `negatives/` directory)."""

  vectors: str  # (L, d) float32 .npy: the label vectors to index
  queries: str  # (N, d) float32 .npy: the training queries' embeddings
  out: str  # (N, k) int32 .npy: the mined negatives
  stats: str  # JSON: build_s, search_s, recall
  job: str  # JSON: the RefreshJob

  @classmethod
  def at(cls, directory: str, queries_dir: str, epoch: int) -> RefreshFiles:
    """The files of the refresh for `epoch` (queries in `queries_dir`, the rest in
    `directory`)."""
    name = lambda kind, ext: os.path.join(directory, f"{kind}_epoch{epoch}.{ext}")
    return cls(
      vectors=name("vectors", "npy"),
      queries=os.path.join(queries_dir, f"queries_epoch{epoch}.npy"),
      out=name("hard", "npy"),
      stats=name("stats", "json"),
      job=name("job", "json"),
    )


@dataclasses.dataclass
class RefreshJob:
  epoch: int  # the epoch whose training uses the result
  vectors_path: str  # (L, d) float32 .npy: label vectors to index
  queries_path: str  # (N, d) float32 .npy: training-query embeddings
  labels_path: str  # CSR positives of the N queries (see positives_source)
  out_path: str  # (N, k) int32 .npy written here
  stats_path: str  # JSON: build_s, search_s, recall
  k: int
  backend: str = "auto"
  scann_knobs: dict = dataclasses.field(default_factory=dict)
  recall_sample: int = 1000
  seed: int = 0
  fault: str = ""  # tests: "raise" or "kill" makes the job fail that way
  # Global label ranges [lo, hi) indexed separately (one index per W shard, built one after
  # the other); the vectors file holds their rows concatenated in this order. The output
  # holds k per shard, block s from shard s. None: one index over all rows.
  shards: list | None = None
  threads: int = 0  # > 0: ScaNN's threads (the worker's BLAS pool is set at its start)
  # Training rows [lo, hi) to mine for (the data groups of one process); the output holds
  # those rows only, in order. None: every row of the queries file.
  query_rows: list | None = None

  def save(self, path: str) -> None:
    with atomic_text_writer(path) as f:
      json.dump(dataclasses.asdict(self), f)


def positives_source(labels: SparseRows | SelectedRows | WithLabelRows, directory: str) -> str:
  """Where a worker reads the training positives, a small JSON: for rows memory-mapped from
  a label cache, naming the cache (the worker maps the same files: no copy, one page-cache
  copy per node); for rows picked from a label cache (the rows a validation split keeps),
  naming the cache and an .npy of the picked row ids written beside it; for rows held only
  in RAM, naming .npy files of them written beside it. The worker maps every file.

  Args:
    labels: the training rows' positives.
    directory: where the JSON (and any .npy) is written.
  Returns:
    The JSON's path.
  """
  base = labels.base if isinstance(labels, WithLabelRows) else labels
  path = os.path.join(directory, "train_labels.json")
  view = {"label_rows": isinstance(labels, WithLabelRows)}
  if isinstance(base, SelectedRows) and base.base.cache:
    rows_path = os.path.join(directory, "train_label_rows.npy")
    mining.save_atomic(rows_path, base.rows)  # a worker maps whole files only
    view.update(cache=base.base.cache, rows=rows_path)
  elif base.cache:
    view.update(cache=base.cache)
  else:
    save_labels(path, labels)
    return path
  with atomic_text_writer(path) as f:
    json.dump(view, f)
  return path


def save_labels(path: str, labels: SparseRows | SelectedRows | WithLabelRows) -> None:
  """`labels` as .npy files beside `path` (written a block at a time, never copied whole)
  and `path`, a JSON naming them."""
  stem = path[: -len(".json")] if path.endswith(".json") else path
  arrays = csr_files.save_npy(labels, stem)
  with atomic_text_writer(path) as f:
    json.dump({"arrays": arrays, "num_cols": labels.num_cols}, f)


def load_labels(path: str) -> SparseRows | SelectedRows | WithLabelRows:
  """The positives `positives_source` or `save_labels` wrote, memory-mapped."""
  with open(path) as f:
    view = json.load(f)
  if "cache" in view:
    rows = label_cache.open_cache(view["cache"])
    if "rows" in view:
      rows = SelectedRows(rows, np.load(view["rows"], mmap_mode="r"))
    return WithLabelRows(rows) if view["label_rows"] else rows
  arrays = view["arrays"]
  return SparseRows(
    np.load(arrays["indptr"], mmap_mode="r"),
    np.load(arrays["indices"], mmap_mode="r"),
    None,
    int(view["num_cols"]),
  )


def run_job(job: RefreshJob) -> dict:
  """The refresh itself (the same code runs in the worker and synchronously)."""
  if job.fault == "raise":
    raise RuntimeError("injected refresh fault")
  if job.fault == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
  vectors = np.load(job.vectors_path, mmap_mode="r")
  queries = np.load(job.queries_path, mmap_mode="r")
  labels = load_labels(job.labels_path)
  row_lo, row_hi = job.query_rows or (0, len(queries))
  queries = queries[row_lo:row_hi]
  shards = job.shards or [[0, len(vectors)]]
  starts = np.cumsum([0] + [hi - lo for lo, hi in shards])
  if starts[-1] != len(vectors):
    raise ValueError(f"{job.vectors_path}: {len(vectors)} rows, the shards need {starts[-1]}")
  # Written block by block into a memmap (N x S k can exceed RAM at 1e8 queries), then
  # flushed and renamed: a reader never sees a partial file.
  tmp = f"{job.out_path}.tmp-{tmpnames.unique_suffix()}.npy"
  negatives = np.lib.format.open_memmap(tmp, "w+", np.int32, (len(queries), len(shards) * job.k))
  try:
    build_s, search_s, recalls, negative_recalls = _mine_shards(
      job, vectors, queries, labels, shards, starts, negatives, row_lo
    )
  except BaseException:
    del negatives
    os.remove(tmp)
    raise
  negatives.flush()
  del negatives
  os.replace(tmp, job.out_path)
  recall = round(float(np.mean(recalls)), 4) if recalls else None
  negatives_recall = round(float(np.mean(negative_recalls)), 4) if negative_recalls else None
  stats = {
    "epoch": job.epoch,
    "build_s": round(build_s, 3),
    "search_s": round(search_s, 3),
    "recall": recall,
    "negatives_recall": negatives_recall,
    "num_queries": len(queries),
    "query_rows": [int(row_lo), int(row_hi)],
    "num_labels": len(vectors),
    "num_shards": len(shards),
    # Shards searched exactly because ScaNN is not installed (degraded.py counts them).
    "exact_without_scann": sum(
      mining.exact_without_scann(job.backend, hi - lo) for lo, hi in shards
    ),
    # The peak of the process that ran it: the worker's (the trainer's when synchronous).
    "peak_rss_bytes": host_memory.peak_resident_bytes(),
  }
  with atomic_text_writer(job.stats_path) as f:
    json.dump(stats, f)
  return stats


def _mine_shards(
  job, vectors, queries, labels, shards, starts, negatives, query_offset
) -> tuple[float, float, list[float], list[float]]:
  """One index per shard, built one after the other; block s of `negatives` from shard s.
  `queries` are the training rows from `query_offset` on (their positives' row numbers).
  Returns (build seconds, search seconds, recall per shard, negatives' recall per shard):
  recall is the index's top k against exact search's; the negatives' recall is the k
  negatives mined (positives removed) against the k exact search mines, the set training
  uses, where a query's positives, easy to find, do not count."""
  rng = np.random.default_rng(job.seed)
  sample = np.sort(rng.choice(len(queries), min(job.recall_sample, len(queries)), replace=False))
  build_s = search_s = 0.0
  recalls, negative_recalls = [], []
  for s, ((lo, hi), start) in enumerate(zip(shards, starts)):
    rows = np.asarray(vectors[start : start + hi - lo])
    t0 = time.time()
    index = mining.build_index(
      rows, job.k, job.backend, job.scann_knobs, job.threads, _GroupProgress(s, t0)
    )
    t1 = time.time()
    block = negatives[:, s * job.k : (s + 1) * job.k]
    mining.mine(
      index,
      queries,
      labels,
      job.k,
      len(rows),
      offset=lo,
      out=block,
      query_offset=query_offset,
    )
    build_s, search_s = build_s + t1 - t0, search_s + time.time() - t1
    if getattr(index, "exact", False):
      recalls.append(1.0)
      negative_recalls.append(1.0)
    elif job.recall_sample > 0:
      exact_top, exact_negatives = _exact_sample(
        rows,
        np.asarray(queries[sample]),
        sparse_rows.row_subset(labels, sample + query_offset),
        job.k,
        lo,
      )
      recalls.append(mining.overlap_at_k(index.search(queries[sample], job.k), exact_top))
      negative_recalls.append(mining.overlap_at_k(np.asarray(block[sample]), exact_negatives))
    del index
  return build_s, search_s, recalls, negative_recalls


class _GroupProgress:
  """Prints a grouped index build's progress (groups whose leaves are trained) to the
  worker's log, about every tenth."""

  def __init__(self, shard: int, start: float):
    self.shard, self.start, self.shown = shard, start, 0

  def __call__(self, built: int, groups: int) -> None:
    if built * 10 // groups > self.shown or built == groups:
      self.shown = built * 10 // groups
      print(
        f"refresh: shard {self.shard}: leaves of {built}/{groups} index groups trained "
        f"({time.time() - self.start:.0f} s)",
        flush=True,
      )


class _FirstSearchKept:
  """An index whose first search's ids are kept: mining.mine's candidates double as the
  exact top k, so the recall check scans the shard once for both of its recalls."""

  def __init__(self, index):
    self.index, self.first = index, None

  def search(self, queries: np.ndarray, k: int) -> np.ndarray:
    ids = self.index.search(queries, k)
    if self.first is None:
      self.first = ids
    return ids


def _exact_sample(
  rows: np.ndarray, queries: np.ndarray, positives: SparseRows, k: int, offset: int
) -> tuple[np.ndarray, np.ndarray]:
  """Exact search's top k (local ids) and the k negatives it mines (global ids, positives
  removed) for the sampled queries: at 10^7 rows the exact scan is the check's cost."""
  exact = _FirstSearchKept(index_lib.ExactIndex(rows))
  negatives = mining.mine(exact, queries, positives, k, len(rows), offset=offset)
  return exact.first[:, : min(k, len(rows))], negatives


class RefreshFailed(RuntimeError):
  pass


class RefreshInterrupted(Exception):
  """The trainer was asked to stop (SIGTERM) while it waited for a refresh; the refresh is
  still pending in the last checkpoint and runs again on resume."""


# The worker's signal dispositions: it must not die of the job's SIGTERM (see the module
# docstring). Blocked from before its fork until it installs SIG_IGN, so that a signal that
# comes while it starts up is discarded, not fatal.
_IGNORED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class InProcessRefresh:
  """A job run in the trainer's process when its swap waits for it (`negatives.
  refresh_backend=device`: the search runs on the training devices, between epochs, so it
  cannot overlap the epoch before). RefreshWorker's interface."""

  def __init__(self):
    self.job: RefreshJob | None = None

  def start(self, job: RefreshJob, job_path: str) -> None:
    job.save(job_path)  # as the worker's: `python -m astra_jax.negatives.refresh` reruns it
    self.job = job

  @property
  def busy(self) -> bool:
    return self.job is not None

  def join(self, stop_requested) -> None:
    """Nothing runs before `wait`."""

  def wait(self) -> dict:
    """Runs the job now; returns its stats or raises RefreshFailed."""
    job, self.job = self.job, None
    try:
      return {**run_job(job), "in_process": True}
    except Exception as e:
      raise RefreshFailed(f"refresh for epoch {job.epoch} failed: {e}") from e

  def stop(self) -> None:
    self.job = None


class RefreshWorker:
  """Runs one job at a time in a child process."""

  def __init__(self):
    self.proc: subprocess.Popen | None = None
    self.job: RefreshJob | None = None
    self.started = 0.0

  def start(self, job: RefreshJob, job_path: str) -> None:
    if self.proc is not None:
      raise RuntimeError("a refresh is already running")
    job.save(job_path)
    for p in (job.out_path, job.stats_path):
      if os.path.exists(p):
        os.remove(p)
    self.job, self.started = job, time.time()
    self.log_path = job_path + ".log"
    # The child inherits the blocked mask through fork and exec; this thread's mask is
    # restored right after, and a SIGTERM for the trainer meanwhile stays pending for it.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED_SIGNALS)
    try:
      with open(self.log_path, "w") as log:
        self.proc = subprocess.Popen(
          [sys.executable, "-m", "astra_jax.negatives.refresh", job_path],
          stdout=log,
          stderr=subprocess.STDOUT,
          start_new_session=True,
          env=cpu_budget.thread_environment(job.threads) if job.threads else None,
        )
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, previous)

  @property
  def busy(self) -> bool:
    return self.proc is not None

  def join(self, stop_requested) -> None:
    """Blocks until the job's process ends, or raises RefreshInterrupted as soon as
    `stop_requested()` is true (the worker keeps running: `stop` ends it)."""
    while self.proc is not None:
      # A stop already requested wins over a refresh still running: a preempted job must
      # not spend its grace period waiting for a refresh that the requeued job reruns.
      if self.proc.poll() is not None:
        return
      if stop_requested():
        raise RefreshInterrupted(
          f"stopped while waiting for the refresh for epoch {self.job.epoch}"
        )
      try:
        self.proc.wait(timeout=0.5)
        return
      except subprocess.TimeoutExpired:
        pass

  def wait(self) -> dict:
    """Blocks until the job ends; returns its stats or raises RefreshFailed."""
    if self.proc is None:
      raise RuntimeError("no refresh running")
    code = self.proc.wait()
    job, self.proc = self.job, None
    if code != 0:
      tail = ""
      try:
        with open(self.log_path) as f:
          tail = f.read()[-500:].strip().splitlines()[-1:]
      except OSError:
        pass
      how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
      raise RefreshFailed(f"refresh for epoch {job.epoch} failed ({how}) {' '.join(tail)}")
    try:
      with open(job.stats_path) as f:
        return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise RefreshFailed(f"refresh for epoch {job.epoch} left no stats: {e}") from e

  def stop(self) -> None:
    if self.proc is not None:
      self.proc.kill()
      self.proc.wait()
      self.proc = None


def prefer_as_oom_victim() -> bool:
  """Makes this process the kernel's first choice when the machine runs out of memory
  (oom_score_adj 1000; raising it needs no privilege). A refresh worker that dies is
  recorded and training goes on; without it the largest process, the trainer, is the one
  killed (docs/results/scale_run.md). Returns whether it could (False where /proc has no
  such file)."""
  try:
    with open("/proc/self/oom_score_adj", "w") as f:
      f.write("1000")
    return True
  except OSError:
    return False


def _main(argv: list[str]) -> int:
  prefer_as_oom_victim()
  for sig in _IGNORED_SIGNALS:
    signal.signal(sig, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED_SIGNALS)
  if len(argv) != 2:
    print("usage: python -m astra_jax.negatives.refresh JOB.json", file=sys.stderr)
    return 2
  with open(argv[1]) as f:
    job = RefreshJob(**json.load(f))
  stats = run_job(job)
  print(json.dumps(stats))
  return 0


if __name__ == "__main__":
  sys.exit(_main(sys.argv))
