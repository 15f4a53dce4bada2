r"""The end-to-end run at a large label count, through the real command lines, measured.

  python benchmarks/scale_run.py --config=experiments/ss20m.py:full_labels \
      --num_labels=10000000 --num_train=200000 --out=docs/results/scale_run_1e7.json

Phases, each a subprocess of the installed tools (`python -m ...`), in one work directory:
  prepare          `astra_jax.prepare --config=...`: the synthetic stand-in generated, its
                   labels parsed and texts tokenized into the cache;
  train_killed     `astra_jax.main`: trained until a checkpoint inside the epoch that first
                   uses mined hard negatives has been written, then SIGKILLed (the trainer
                   and its refresh worker) a few steps later;
  train_resumed    the same command: resumes from that checkpoint, trains to the end,
                   evaluates exactly on every test row and exports the model
                   (`final_evaluation` and `export` are its last spans, from results.json);
  train_reference  (--reference) the same config and seed in another work directory,
                   uninterrupted: `resume_metrics_equal` compares its metrics with the
                   resumed run's;
  predict          `astra_jax.predict --exact` on --predict_queries test queries.
Each phase's wall seconds and the peak resident memory of its processes: the driver samples
/proc of the process tree every --poll_s seconds (VmRSS for spans, VmHWM for a process's
peak) and keeps the trainer and the refresh worker (`astra_jax.negatives.refresh`) apart.

Writes one JSON object: num_labels, num_train, num_test, config, overrides, phases {name:
{seconds, peak_rss_bytes, refresh_worker_peak_rss_bytes}} (the worker's: the sampler's, or
the peak it reported if larger), refreshes [{epoch, recall, build_s, search_s, wait_s,
peak_rss_bytes (the worker's own)}], step_time_s (median wall seconds per step of the resumed
run), resume_metrics_equal, metrics, popularity_baseline, kill_after_checkpoint_step,
resumed_from_step, steps_per_epoch, predictions (the first query's top labels).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import app, flags

from astra_jax.config import base as config_base
from astra_jax.training import checkpoint

flags.DEFINE_string("config", "experiments/ss20m.py:full_labels", "experiment config[:variant]")
flags.DEFINE_string("out", None, "the JSON file to write")
flags.DEFINE_integer("num_labels", 0, "labels (0: the config's)")
flags.DEFINE_integer("num_train", 0, "training queries (0: the config's)")
flags.DEFINE_integer("num_test", 0, "test queries (0: the config's)")
flags.DEFINE_integer("epochs", 3, "training epochs")
flags.DEFINE_integer(
  "tau_s",
  2,
  "first epoch with mined hard negatives (its refresh runs over "
  "every training row, pipelined during the epoch before)",
)
flags.DEFINE_list("set", [], "further config overrides, e.g. train.batch_size=256")
flags.DEFINE_string(
  "work_dir",
  None,
  "where data and workdirs go (default: workdir/scale_run/L<num_labels>_N<num_train>)",
)
flags.DEFINE_bool("reference", True, "also train without interruption and compare metrics")
flags.DEFINE_integer("predict_queries", 5, "test queries given to predict")
flags.DEFINE_float("poll_s", 0.5, "seconds between memory samples")
flags.DEFINE_bool("keep", True, "keep the work directory (data, models) afterwards")
FLAGS = flags.FLAGS

REFRESH_WORKER_MODULE = "astra_jax.negatives.refresh"


@dataclasses.dataclass
class Phase:
  """What one phase's process tree used."""

  seconds: float
  peak_rss_bytes: int  # the largest peak of any process but the worker
  refresh_worker_peak_rss_bytes: int  # the refresh worker's, 0 if none ran
  samples: list  # (time, trainer RSS bytes) every poll


def add_reported_worker_peak(phase: Phase, results: dict) -> None:
  """Folds the peaks the phase's refresh workers reported (results.json's refreshes) into
  what the sampler saw: a worker that lives less than --poll_s can end between samples."""
  reported = [r.get("peak_rss_bytes") or 0 for r in results["negatives"]["refreshes"]]
  phase.refresh_worker_peak_rss_bytes = max([phase.refresh_worker_peak_rss_bytes, *reported])


def _status_bytes(pid: int, field: str) -> int:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return 0


def _children(pid: int) -> list[int]:
  out = []
  try:
    for tid in os.listdir(f"/proc/{pid}/task"):
      with open(f"/proc/{pid}/task/{tid}/children") as f:
        out += [int(x) for x in f.read().split()]
  except OSError:
    pass
  return out


def _tree(pid: int) -> list[int]:
  todo, seen = [pid], []
  while todo:
    p = todo.pop()
    seen.append(p)
    todo += _children(p)
  return seen


def _is_refresh_worker(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return REFRESH_WORKER_MODULE.encode() in f.read()
  except OSError:
    return False


class MemorySampler(threading.Thread):
  """Samples a process tree's memory until `stop()`: the highest VmHWM of the worker and of
  the other processes, and (time, VmRSS of the root) samples."""

  def __init__(self, pid: int, poll_s: float):
    super().__init__(daemon=True)
    self.pid, self.poll_s = pid, poll_s
    self.peak = self.worker_peak = 0
    self.samples: list[tuple[float, int]] = []
    self._done = threading.Event()

  def run(self) -> None:
    while not self._done.is_set():
      for p in _tree(self.pid):
        hwm = _status_bytes(p, "VmHWM")
        if _is_refresh_worker(p):
          self.worker_peak = max(self.worker_peak, hwm)
        else:
          self.peak = max(self.peak, hwm)
      self.samples.append((time.time(), _status_bytes(self.pid, "VmRSS")))
      self._done.wait(self.poll_s)

  def stop(self) -> None:
    self._done.set()
    self.join()


def run_phase(name: str, argv: list[str], log_path: str, until=None) -> Phase:
  """Runs `argv` (its output to `log_path`), sampling its memory. `until(proc)`, polled,
  returning True SIGKILLs the process group. A failed command ends the benchmark."""
  print(f"scale_run: {name}: {' '.join(argv)}", flush=True)
  t0 = time.time()
  with open(log_path, "a") as log:
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = MemorySampler(proc.pid, FLAGS.poll_s)
    sampler.start()
    killed = False
    while proc.poll() is None:
      if until is not None and not killed and until():
        sampler.samples.append((time.time(), _status_bytes(proc.pid, "VmRSS")))
        os.killpg(proc.pid, signal.SIGKILL)
        killed = True
      # The kill must land before the next checkpoint: a small run's steps take ~0.1 s, and
      # checking costs one directory listing.
      time.sleep(0.02)
    sampler.stop()
  seconds = time.time() - t0
  if proc.returncode != 0 and not killed:
    with open(log_path) as f:
      tail = f.read()[-3000:]
    sys.exit(f"error: {name} failed (exit code {proc.returncode}); {log_path} ends:\n{tail}")
  if until is not None and not killed:
    sys.exit(f"error: {name} ended before the kill point; see {log_path}")
  print(
    f"scale_run: {name}: {seconds:.1f} s, peak RSS {sampler.peak / 1e9:.2f} GB, refresh "
    f"worker {sampler.worker_peak / 1e9:.2f} GB",
    flush=True,
  )
  return Phase(round(seconds, 1), sampler.peak, sampler.worker_peak, sampler.samples)


def span_peak(samples: list, span: list[float]) -> int:
  """The highest RSS sample inside a [start, end] wall-clock span and the first one after it
  (a span shorter than the poll interval holds none)."""
  inside = [rss for t, rss in samples if span[0] <= t <= span[1]]
  after = [rss for t, rss in samples if t > span[1]][:1]
  return max(inside + after, default=0)


def complete_checkpoints(workdir: str) -> list[int]:
  """Steps of the checkpoints whose saves completed."""
  root = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(root):
    return []
  return sorted(
    int(n)
    for n in os.listdir(root)
    if n.isdigit() and checkpoint.damage(os.path.join(root, n)) is None
  )


def keep_refresh_inputs(workdir: str, epoch: int, dest: str) -> None:
  """Hard-links the refresh's inputs (W after epoch - 1 and the training queries'
  embeddings), which the finished run deletes, into `dest`: benchmarks/refresh_knobs.py
  chooses the fixed-cost knobs on them (--vectors, --queries)."""
  os.makedirs(dest, exist_ok=True)
  for name in (f"vectors_epoch{epoch}.npy", f"queries_epoch{epoch}.npy"):
    src, dst = os.path.join(workdir, "negatives", name), os.path.join(dest, name)
    if os.path.exists(src):
      if os.path.exists(dst):
        os.remove(dst)
      os.link(src, dst)


def load_config(spec: str, overrides: list[str]):
  """The experiment config `FILE[:VARIANT]` with `overrides` (`field=value`, the value read
  as the field's type) applied."""
  path, _, variant = spec.partition(":")
  c = config_base.load_config(path, variant or None)
  for item in overrides:
    key, _, value = item.partition("=")
    *parents, leaf = key.split(".")
    node = c
    for p in parents:
      node = node[p]
    old = node[leaf]
    node[leaf] = value.lower() in ("1", "true") if isinstance(old, bool) else type(old)(value)
  return c


def main(argv):
  del argv
  if not FLAGS.out:
    sys.exit("error: --out=FILE.json is required")
  py = sys.executable
  size = []
  if FLAGS.num_labels:
    size += [f"data.synthetic.num_labels={FLAGS.num_labels}", f"data.num_labels={FLAGS.num_labels}"]
  if FLAGS.num_train:
    size += [f"data.synthetic.num_train={FLAGS.num_train}", f"data.num_train={FLAGS.num_train}"]
  if FLAGS.num_test:
    size += [f"data.synthetic.num_test={FLAGS.num_test}"]
  config = load_config(FLAGS.config, size + FLAGS.set)
  L, N = config.data.synthetic.num_labels, config.data.synthetic.num_train
  work = os.path.abspath(FLAGS.work_dir or f"workdir/scale_run/L{L}_N{N}")
  os.makedirs(work, exist_ok=True)
  data_dir = os.path.join(work, "data")
  data_overrides = size + [f"data.dir={data_dir}"] + FLAGS.set
  steps_per_epoch = N // config.train.batch_size
  if steps_per_epoch < 4:
    sys.exit(
      f"error: --num_train={N} gives {steps_per_epoch} steps per epoch at batch "
      f"{config.train.batch_size}; the kill needs at least 4 (--set=train.batch_size=...)"
    )
  mid = max(1, steps_per_epoch // 2)
  train_overrides = data_overrides + [
    f"train.epochs={FLAGS.epochs}",
    f"negatives.tau_s={FLAGS.tau_s}",
    f"negatives.tau_r={FLAGS.epochs}",
    f"checkpoint.every_steps={mid}",
    "checkpoint.every_minutes=0",
  ]
  as_flags = lambda items: [f"--config.{x}" for x in items]
  phases: dict[str, Phase] = {}

  phases["prepare"] = run_phase(
    "prepare",
    [py, "-m", "astra_jax.prepare", f"--config={FLAGS.config}", *as_flags(data_overrides)],
    os.path.join(work, "prepare.log"),
  )

  # The kill: as soon as the mid-epoch checkpoint of epoch tau_s (its hard negatives
  # swapped in) is complete; the run has gone on meanwhile, so the resume repeats steps.
  killed_dir = os.path.join(work, "killed")
  train = lambda workdir: [
    py,
    "-m",
    "astra_jax.main",
    f"--config={FLAGS.config}",
    f"--workdir={workdir}",
    *as_flags(train_overrides),
  ]
  kill_step = FLAGS.tau_s * steps_per_epoch + mid

  def past_checkpoint() -> bool:  # the steps run between its save and the kill are redone
    return kill_step in complete_checkpoints(killed_dir)

  if os.path.exists(killed_dir):
    shutil.rmtree(killed_dir)
  phases["train_killed"] = run_phase(
    "train_killed", train(killed_dir), os.path.join(work, "train_killed.log"), past_checkpoint
  )
  resumed_from = max(complete_checkpoints(killed_dir), default=0)
  keep_refresh_inputs(killed_dir, FLAGS.tau_s, os.path.join(work, "refresh_inputs"))
  phases["train_resumed"] = run_phase(
    "train_resumed", train(killed_dir), os.path.join(work, "train_resumed.log")
  )
  with open(os.path.join(killed_dir, "results.json")) as f:
    results = json.load(f)
  add_reported_worker_peak(phases["train_killed"], results)
  samples = phases["train_resumed"].samples
  for name in ("final_evaluation", "export"):
    span = results["phase_spans"][name]
    phases[name] = Phase(round(span[1] - span[0], 1), span_peak(samples, span), 0, [])

  queries_path = os.path.join(work, "predict_queries.txt")
  with open(os.path.join(data_dir, "tst_X.txt")) as src, open(queries_path, "w") as dst:
    for _, line in zip(range(FLAGS.predict_queries), src):
      dst.write(line)
  predictions_path = os.path.join(work, "predictions.jsonl")
  phases["predict"] = run_phase(
    "predict",
    [
      py,
      "-m",
      "astra_jax.predict",
      f"--workdir={killed_dir}",
      "--exact",
      f"--input={queries_path}",
      f"--output={predictions_path}",
      "--k=5",
    ],
    os.path.join(work, "predict.log"),
  )
  with open(predictions_path) as f:
    predictions = [json.loads(line) for line in f]

  def write_record(reference: dict | None) -> dict:
    """The JSON file, written once without the reference run and again with it: a run
    stopped during the reference still leaves its record."""
    with open(os.path.join(data_dir, "synthetic.json")) as f:
      generator = json.load(f)
    breakup = results.get("time_breakup") or {}
    record = {
      "num_labels": results["num_labels"],
      "num_train": results["num_train"],
      "num_test": results["num_test"],
      "epochs": results["epochs"],
      "steps": results["steps"],
      "batch_size": config.train.batch_size,
      "config": FLAGS.config,
      "overrides": train_overrides,
      "phases": {
        name: {
          "seconds": p.seconds,
          "peak_rss_bytes": p.peak_rss_bytes,
          "refresh_worker_peak_rss_bytes": p.refresh_worker_peak_rss_bytes,
        }
        for name, p in phases.items()
      },
      "generator_seconds": generator.get("seconds"),
      "train_time_s": results["train_time_s"],
      "step_time_s": (
        breakup["mean_step_wall_ms"] / 1000
        if breakup.get("mean_step_wall_ms") is not None
        else None
      ),
      "time_breakup": breakup,
      "refreshes": [
        {
          k: r.get(k)
          for k in (
            "epoch",
            "ok",
            "recall",
            "negatives_recall",
            "build_s",
            "search_s",
            "wait_s",
            "num_queries",
            "num_labels",
            "peak_rss_bytes",
            "error",
          )
        }
        for r in results["negatives"]["refreshes"]
      ],
      "scann_rows_per_query": config.negatives.index.rows_per_query,
      "kill_after_checkpoint_step": kill_step,
      "resumed_from_step": resumed_from,
      "steps_per_epoch": steps_per_epoch,
      "resume_metrics_equal": (
        results["metrics"] == reference["metrics"] if reference is not None else None
      ),
      "reference_metrics": reference["metrics"] if reference is not None else None,
      "metrics": results["metrics"],
      "popularity_baseline": results["popularity_baseline"],
      "predictions": predictions[:1],
      "work_dir": work,
    }
    with open(FLAGS.out, "w") as f:
      json.dump(record, f, indent=1)
    return record

  record = write_record(None)
  if FLAGS.reference:
    reference_dir = os.path.join(work, "reference")
    if os.path.exists(reference_dir):
      shutil.rmtree(reference_dir)
    phases["train_reference"] = run_phase(
      "train_reference", train(reference_dir), os.path.join(work, "train_reference.log")
    )
    with open(os.path.join(reference_dir, "results.json")) as f:
      reference = json.load(f)
    add_reported_worker_peak(phases["train_reference"], reference)
    record = write_record(reference)
  print(
    json.dumps(
      {k: record[k] for k in ("num_labels", "phases", "refreshes", "resume_metrics_equal")},
      indent=1,
    )
  )
  if not FLAGS.keep:
    shutil.rmtree(work)


if __name__ == "__main__":
  app.run(main)
