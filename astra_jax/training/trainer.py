"""The Trainer: one run's training loop over a `steps.TrainState`, epoch by epoch.

train.py builds the pieces (data, encoder, mesh, sampler, refresh manager, steps) and calls
`Trainer.run_epoch` for each epoch, then `Trainer.final_evaluation`. The Trainer owns what
changes as training goes: the state, the progress record (progress.py) and the checkpoints.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import jax
import ml_collections
import numpy as np
from absl import logging

from astra_jax.ann.mesh_memory import MeshMemory
from astra_jax.ann.vote_memory import Memory
from astra_jax.data import dataset
from astra_jax.evaluation import final_eval, ranking
from astra_jax.model.embedding import EmbedFn, embed, embed_rows, host_local
from astra_jax.negatives.manager import HardNegatives
from astra_jax.negatives.refresh import RefreshInterrupted
from astra_jax.negatives.schedule import NegativeSplit
from astra_jax.negatives.strategies import IndexOver
from astra_jax.parallel import sharding
from astra_jax.runtime import distributed, faults, host_memory
from astra_jax.runtime.degraded import note_epoch_start
from astra_jax.runtime.watchdog import HangWatchdog
from astra_jax.training import checkpoint, steps
from astra_jax.training.pipeline import TrainBatches
from astra_jax.training.progress import Progress
from astra_jax.training.step_profile import StepProfiler
from astra_jax.training.train_log import TrainLog

# W = scale * V: V's rows grow as 1 / scale while the decay shrinks the scale, so V is
# folded back into W (scale 1) at a log line once the scale is below this.
_FOLD_BELOW_SCALE = 1e-2


@dataclasses.dataclass
class RunParts:
  """What a run trains with and does not change while it trains (train.py builds it)."""

  config: ml_collections.ConfigDict
  workdir: str
  data: dataset.XCData  # the training split (and the final evaluation's test set)
  eval_data: dataset.XCData  # the periodic evaluations' split (validation or test)
  inv_prop: np.ndarray  # inverse propensities of the training labels
  embed_fn: EmbedFn
  mesh: jax.sharding.Mesh
  batches: TrainBatches
  hard_negatives: HardNegatives
  steps: steps.Steps
  profiler: StepProfiler
  log: TrainLog
  hang_watchdog: HangWatchdog


class Trainer:
  """Runs epochs of train steps with their refreshes, evaluations and checkpoints.

  Attributes:
    state: the train state (its classifier is W itself after each epoch's fold).
    progress: the resumable progress record.
    first_step_s: this process's first step's seconds (compilation included), once run.
  """

  def __init__(self, parts: RunParts, state: steps.TrainState):
    self.parts, self.state = parts, state
    self.config = parts.config
    self.progress = Progress()
    self.first_step_s: float | None = None
    self.base_key = jax.random.key(self.config.train.seed + 2)
    self.ckpt = (
      checkpoint.Checkpoints(parts.workdir, self.config.checkpoint.keep)
      if self.config.checkpoint.enabled
      else None
    )
    self.stop = checkpoint.StopSignal()
    parts.hard_negatives.stop_requested = lambda: bool(self.stop.received)
    self.policy = checkpoint.SavePolicy(
      self.stop,
      self.config.checkpoint.every_steps,
      self.config.checkpoint.every_minutes,
      self.config.train.log_every_steps,
    )
    self._resume_step = 0  # > 0: the first epoch run resumes inside, at this step
    self._epoch_t0 = 0.0

  # -------------------------------------------------------------------- resume
  def restore(self) -> None:
    """Continues from the workdir's newest checkpoint that restores, if any (damaged ones
    are set aside)."""
    if self.ckpt is None:
      return
    hard_negatives = self.parts.hard_negatives

    def accept(record: dict) -> None:
      saved = Progress.from_json(record)
      hard_negatives.load_state(saved.hard_negatives, resumes_at=(saved.epoch, saved.step))

    params, opt_state = steps.saved_layout(self.state)
    restored = self.ckpt.restore(params, opt_state, accept=accept)
    if restored is None:
      return
    params, opt_state, record = restored
    self.progress = Progress.from_json(record)
    self.state = steps.from_saved(self.state, params, opt_state, self.progress.global_step)
    self.progress.degraded.checkpoints_set_aside += len(self.ckpt.set_aside)
    if self.progress.phases is not None:
      self.parts.profiler.phases = self.progress.phases
    self._resume_step = self.progress.step
    logging.info(
      "resuming at epoch %d step %d (global step %d)",
      self.progress.epoch,
      self.progress.step,
      self.progress.global_step,
    )

  @property
  def skipped_steps(self) -> int:
    """Steps dynamic loss scaling skipped: the state's step counts the applied ones."""
    return self.progress.global_step - int(self.state.step)

  # ---------------------------------------------------------------------- epoch
  def run_epoch(self, epoch: int) -> None:
    """One epoch: its negatives in, its steps (a checkpoint when due), the refresh's
    inputs out, the fold, the periodic evaluation and the epoch's checkpoint.

    Raises:
      checkpoint.Preempted: a stop was requested (after saving, when checkpointing).
    """
    p, cfg, prog = self.parts, self.config, self.progress
    self._epoch_t0 = time.time()
    first_step, self._resume_step = self._resume_step, 0
    hard, split = self._start_negatives(epoch, first_step)
    step_fn = p.steps.for_epoch(split.num_hard)
    p.log.start(first_step, self.skipped_steps)
    # At most 2 steps in flight: dispatch stays ahead of the device without the host
    # queueing unboundedly many steps (and their batches) when the input is faster.
    inflight = collections.deque()
    for step, (host, prep_s) in enumerate(
      p.batches.epoch(epoch, hard, first_step, split), start=first_step
    ):
      p.hang_watchdog.kick(f"in epoch {epoch} step {step + 1}")
      key = jax.random.fold_in(self.base_key, prog.global_step)
      profiling = p.profiler.wants(prog.global_step)
      t0 = time.perf_counter()
      batch = sharding.shard_batch(host.batch, p.mesh)
      if profiling:
        p.profiler.before_step(
          t0, prep_s, batch, self.state.encoder, self.state.classifier, self.state.scale, key
        )
      self.state, value, pooled = step_fn(self.state, batch, key)
      if self.first_step_s is None:
        value.block_until_ready()
        self.first_step_s = round(time.perf_counter() - t0, 3)
        logging.info("first step: %.1f s (XLA compilation included)", self.first_step_s)
      inflight.append(value)
      if len(inflight) > 2:
        inflight.popleft().block_until_ready()
      if profiling:
        p.profiler.after_step(value)
      p.hard_negatives.collect_step(host.rows, pooled)
      prog.global_step += 1
      if p.log.due(step):
        p.log.report(epoch, step, prog.global_step, float(value), split, self.skipped_steps)
        if float(self.state.scale) < _FOLD_BELOW_SCALE:
          self.state = steps.fold_classifier(self.state)
      self._checkpoint_within_epoch(epoch, step)
    p.hang_watchdog.disarm()  # what follows grows with the data, not a step
    self.state = steps.fold_classifier(self.state)  # from here on the classifier is W itself
    with faults.writing(p.hard_negatives.dir, self._collection_bytes()):
      p.hard_negatives.end_epoch(epoch, self._label_vectors, self._embed_train_rows)
    # A refresh's inputs (a host copy of W, L x d float32: docs/results/scale_run.md) are
    # written and freed here while its worker starts: hand the pages back rather than keep
    # them beside it.
    host_memory.release_freed_memory()
    epoch_s = time.time() - self._epoch_t0
    prog.train_seconds += epoch_s
    if first_step == 0:  # a resumed part of an epoch would add a compilation to fewer steps
      prog.step_times.append(epoch_s / p.batches.steps_per_epoch)
    every = cfg.train.eval_every_epochs
    if every and (epoch + 1) % every == 0 and epoch + 1 < cfg.train.epochs:
      self._periodic_evaluation(epoch)
    self._checkpoint_after_epoch(epoch)

  def _start_negatives(
    self, epoch: int, first_step: int
  ) -> tuple[np.ndarray | None, NegativeSplit]:
    """Swaps in the epoch's hard negatives (HardNegatives.start_epoch) and records them:
    (hard (N, c) or None, the sampler's split)."""
    p, prog = self.parts, self.progress
    hard_negatives = p.hard_negatives
    if self.ckpt is not None and epoch in hard_negatives.schedule.refresh_epochs:
      # A refresh deletes the negatives and inputs the previous checkpoint names: the
      # asynchronous save that stops naming them must be on disk first.
      self.ckpt.wait()
    if hard_negatives.schedule.refresh_collected_in(epoch) is not None:
      # The epoch's query embeddings go to a memory map (and W's snapshot follows).
      faults.require_space(hard_negatives.dir, self._collection_bytes())
    resumed = first_step > 0  # resuming inside an epoch: its negatives are already in place
    refreshes, pipelined = len(hard_negatives.refreshes), epoch in hard_negatives.pending
    try:
      hard, split = hard_negatives.start_epoch(
        epoch,
        self._label_vectors,
        self._embed_train_rows,
        resumed_rows=p.batches.rows_before(epoch, first_step) if resumed else None,
      )
    except RefreshInterrupted:  # the checkpoint at (epoch, 0) lists the refresh as pending
      raise self._preempted(
        f"at the start of epoch {epoch} (waiting for its hard-negative refresh)"
      ) from None
    if not resumed:
      note_epoch_start(
        prog.degraded,
        hard_negatives,
        refreshes,
        epoch,
        pipelined,
        split,
        self.config.negatives.on_refresh_failure,
      )
      prog.negatives_per_epoch.append(
        {
          "epoch": epoch,
          "hard": split.num_hard,
          "random": split.num_random,
          "source": hard_negatives.current_epoch if hard is not None else None,
        }
      )
    return hard, split

  def _collection_bytes(self) -> int:
    """The disk a collection epoch's refresh inputs take: queries and the label vectors."""
    p = self.parts
    return (
      4 * p.hard_negatives.dim * (p.data.train_labels.num_rows + self.state.classifier.shape[0])
    )

  # ----------------------------------------------------- the refresh's inputs
  def _label_vectors(self) -> np.ndarray:
    """Rows of the shards this process mines for, concatenated: W, or E(z_l) for the
    strategies that index label-text embeddings."""
    p = self.parts
    bounds = p.hard_negatives.shards
    if p.hard_negatives.schedule.index_over is IndexOver.LABEL_TEXT:
      rows = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
      return embed(
        p.embed_fn,
        host_local(self.state.encoder),
        p.data.label_tokens[rows],
        self.config.eval.batch_size,
      )
    held = dict(distributed.local_row_shards(self.state.classifier))  # first row -> rows
    return np.concatenate([held[lo][: hi - lo] for lo, hi in bounds])

  def _embed_train_rows(self, rows: np.ndarray) -> np.ndarray:
    """E(x) of training rows under the current encoder."""
    p = self.parts
    return embed_rows(
      p.embed_fn,
      host_local(self.state.encoder),
      p.data.train_tokens,
      rows,
      self.config.eval.batch_size,
    )

  # ---------------------------------------------------------------- evaluation
  def _periodic_evaluation(self, epoch: int) -> None:
    p, cfg, prog = self.parts, self.config, self.progress
    if 0 < cfg.eval.max_test_rows < p.eval_data.test_labels.num_rows:
      prog.degraded.note(
        "evals_on_subset",
        "eval after epoch %d on the first %d of %d test rows (eval.max_test_rows)",
        epoch + 1,
        cfg.eval.max_test_rows,
        p.eval_data.test_labels.num_rows,
      )
    m = ranking.evaluate_model(
      p.mesh, p.embed_fn, self.state.params, p.eval_data, cfg, p.inv_prop, cfg.eval.max_test_rows
    )
    m.update(
      ranking.diagnostics(
        p.mesh,
        p.embed_fn,
        self.state.params,
        p.data,
        p.eval_data,
        cfg,
        p.inv_prop,
        cfg.eval.max_test_rows,
      )
    )
    self.record_eval(epoch + 1, "validation" if p.eval_data is not p.data else "test", m)
    logging.info(
      "eval after epoch %d: %s",
      epoch + 1,
      ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k.startswith("P@")),
    )

  def record_eval(self, epoch: int, split: str, metrics: dict[str, float]) -> None:
    """Appends an evaluation to the progress record and metrics.jsonl."""
    self.progress.evals.append(
      {
        "epoch": epoch,
        "train_time_s": round(self.progress.train_seconds, 2),
        "split": split,
        **metrics,
      }
    )
    self.parts.log.write(kind="eval", **self.progress.evals[-1])

  @property
  def final_rows(self) -> int:
    """The test rows the final evaluation scores (eval.final_max_rows bounds them)."""
    n, limit = self.parts.data.test_labels.num_rows, self.config.eval.final_max_rows
    return min(n, limit) if limit > 0 else n

  def final_evaluation(
    self, memory: MeshMemory | Memory | None = None, lexical_terms=None
  ) -> dict[str, float]:
    """The whole test set's metrics (final_eval.py): resumed from its progress record, and
    stopped by SIGTERM / SIGINT after recording it (checkpoint.Preempted). `memory`: the
    rows the neighbour vote reads, when the score votes; `lexical_terms`: the test rows'
    lexical terms (xc/lexical.TermVotes), when the score holds them."""
    p, cfg = self.parts, self.config
    evaluator = ranking.ModelEvaluator.for_model(
      p.mesh,
      p.embed_fn,
      self.state.params,
      p.data,
      cfg,
      p.inv_prop,
      memory=memory,
      lexical_terms=lexical_terms,
    )
    n = self.final_rows
    if n < p.data.test_labels.num_rows:
      self.progress.degraded.note(
        "evals_on_subset",
        "final evaluation on the first %d of %d test rows (eval.final_max_rows)",
        n,
        p.data.test_labels.num_rows,
      )
    stop = checkpoint.StopSignal()
    try:
      return final_eval.evaluate(
        evaluator.block_sums,
        n,
        tuple(cfg.eval.ks),
        cfg.eval.progress_rows,
        p.workdir,
        self.progress.global_step,
        lambda: bool(stop.received),
      )
    except final_eval.EvalInterrupted as e:
      raise self._preempted(f"({e})", stop) from None
    finally:
      stop.restore()

  # --------------------------------------------------------------- checkpoints
  def _save(self, epoch: int, step: int, metrics: dict | None = None, wait: bool = False) -> None:
    """A checkpoint that resumes at (epoch, step); step 0 = before the epoch starts."""
    prog = self.progress
    prog.epoch, prog.step = epoch, step
    record = dataclasses.replace(
      prog,
      phases=self.parts.profiler.phases,
      hard_negatives=self.parts.hard_negatives.state_dict(),
      train_seconds=prog.train_seconds + (time.time() - self._epoch_t0 if step else 0.0),
    )
    params, opt_state = steps.saved_layout(self.state)
    self.ckpt.save(prog.global_step, params, opt_state, record.to_json(), metrics)
    if wait:
      self.ckpt.wait()
    self.policy.saved()

  def _checkpoint_within_epoch(self, epoch: int, step: int) -> None:
    cfg, prog = self.config, self.progress
    if cfg.train.stop_after_steps and prog.global_step >= cfg.train.stop_after_steps:
      self.stop.received = self.stop.received or "stop_after_steps"
    due, stop_now = self.policy.decide(prog.global_step, step)
    if step + 1 == self.parts.batches.steps_per_epoch:
      return  # the epoch-end save follows
    if self.ckpt is not None and due:
      self.parts.hard_negatives.flush()  # everything up to this step is in the memmap
      self._save(epoch, step + 1, wait=stop_now)
    if stop_now:
      raise self._preempted(f"at epoch {epoch} step {step + 1}")

  def _checkpoint_after_epoch(self, epoch: int) -> None:
    evals = self.progress.evals
    stop_now = distributed.any_true([bool(self.stop.received)])[0]
    if self.ckpt is not None:  # after the last epoch too: a rerun then only evaluates
      fresh = evals and evals[-1]["epoch"] == epoch + 1
      self._save(
        epoch + 1,
        0,
        {"P@5": evals[-1]["P@5"]} if fresh and "P@5" in evals[-1] else None,
        wait=stop_now,
      )
    if stop_now and epoch + 1 < self.config.train.epochs:
      raise self._preempted(f"after epoch {epoch}")

  def _preempted(
    self, where: str, stop: checkpoint.StopSignal | None = None
  ) -> checkpoint.Preempted:
    stop = stop or self.stop
    return checkpoint.Preempted(
      f"stopped by signal {stop.received} {where}; "
      + (
        "checkpoint written; rerun the same command to resume"
        if self.ckpt is not None
        else "no checkpoint (checkpoint.enabled=False)"
      )
    )

  def close(self) -> None:
    """Signal handlers back, refresh workers and checkpoint writes finished."""
    self.stop.restore()
    self.parts.hard_negatives.close()
    if self.ckpt is not None:
      self.ckpt.close()
