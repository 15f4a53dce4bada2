"""After training: the final evaluation, the export, the ANN and validation evaluations, and
the results.json record."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
from absl import logging

from astra_jax.data import xc_format
from astra_jax.evaluation import ann_eval, baselines, ranking
from astra_jax.model import encoder_source
from astra_jax.runtime import distributed, faults
from astra_jax.serving.export import save_trained_model
from astra_jax.training.lexical_terms import LexicalIndexes
from astra_jax.training.neighbour_memory import VoteMemories
from astra_jax.training.trainer import Trainer
from astra_jax.xc import lexical, neighbour_vote


@dataclasses.dataclass
class StageClock:
  """Wall-clock seconds of a run's stages in this process, in the order they ran (a
  resumed run's: what this process spent; a restored warm start costs its restore)."""

  seconds: dict[str, float] = dataclasses.field(default_factory=dict)
  _last: float = dataclasses.field(default_factory=time.time)

  def mark(self, stage: str) -> None:
    """Ends `stage` now: it took the time since the previous mark (or the clock's start)."""
    now = time.time()
    self.seconds[stage] = round(now - self._last, 2)
    self._last = now


def evaluate_and_export(
  trainer: Trainer,
  encoder_cfg,
  memories: VoteMemories | None = None,
  lexical_indexes: LexicalIndexes | None = None,
) -> tuple[dict, dict | None, dict]:
  """After training: the final evaluation, the export, the ANN evaluation when asked for
  and the validation split's; each recorded in the progress log.

  Args:
    trainer: the finished trainer.
    encoder_cfg: the encoder's shape (the export's record of it).
    memories: the neighbour vote's memories (neighbour_memory.py) when the score votes:
      the test split and the export read `final`, the validation split `choice`.
    lexical_indexes: the lexical terms' (lexical_terms.py) when the score may hold them:
      likewise.
  Returns:
    (final test metrics, the ANN evaluation's report or None, wall-clock spans of these
    phases {name: [start, end]}).
  """
  p = trainer.parts
  config, workdir, data, eval_data = p.config, p.workdir, p.data, p.eval_data
  params = trainer.state.params
  votes = memories is not None and neighbour_vote.from_config(config) is not None
  lexical_on = lexical_indexes is not None and lexical.from_scoring(config.scoring).total > 0
  t_eval = time.time()
  final = trainer.final_evaluation(
    memories.final if votes else None, lexical_indexes.test if lexical_on else None
  )
  final.update(
    ranking.diagnostics(
      p.mesh, p.embed_fn, params, data, data, config, p.inv_prop, trainer.final_rows
    )
  )
  t_export = time.time()
  with faults.writing(
    os.path.join(workdir, "model"), sum(x.nbytes for x in jax.tree.leaves(params))
  ):
    save_trained_model(
      workdir,
      config,
      encoder_cfg,
      params,
      data,
      final,
      memories.final if votes else None,
      lexical_index=lexical_indexes.final if lexical_on else None,
    )
  # Wall-clock spans of this process's last phases (a resumed run's: its own), so that a
  # driver sampling the process's memory can attribute it to them (benchmarks/scale_run.py).
  phase_spans = {"final_evaluation": [t_eval, t_export], "export": [t_export, time.time()]}
  logging.info(
    "final evaluation %.1f s, export %.1f s", t_export - t_eval, phase_spans["export"][1] - t_export
  )
  ann = None
  if config.eval.search == "scann":
    t_ann = time.time()
    ann = ann_eval.evaluate(workdir, data, config, p.inv_prop, trainer.final_rows).report(final)
    phase_spans["ann_evaluation"] = [t_ann, time.time()]
  if eval_data is not data:
    val = ranking.evaluate_model(
      p.mesh,
      p.embed_fn,
      params,
      eval_data,
      config,
      p.inv_prop,
      memory=memories.choice if votes else None,
      vote_cache=memories.validation_cache if votes else None,
      lexical_terms=lexical_indexes.choice if lexical_on else None,
    )
    val.update(ranking.diagnostics(p.mesh, p.embed_fn, params, data, eval_data, config, p.inv_prop))
    trainer.record_eval(config.train.epochs, "validation", val)
  if memories is not None:  # the validation rows' votes are read for the last time above
    memories.validation_cache.clear()
  trainer.record_eval(config.train.epochs, "test", final)
  return final, ann, phase_spans


def results_record(
  trainer: Trainer,
  final: dict,
  ann: dict | None,
  phase_spans: dict,
  t_start: float,
  n_params: int,
  stages: StageClock | None = None,
) -> dict:
  """results.json: the run's size, times (every stage's, `stage_seconds`), metrics beside
  the baselines, the negatives' record, the layout and device, what degraded, the encoder
  that ran and the config."""
  p, progress = trainer.parts, trainer.progress
  stage_seconds = dict(stages.seconds) if stages else {}
  for phase, (start, end) in phase_spans.items():
    stage_seconds[phase] = round(end - start, 2)
  config, data = p.config, p.data
  return {
    "data_dir": os.path.abspath(data.data_dir),
    "strategy": config.negatives.strategy,
    "num_labels": data.num_labels,
    "num_train": data.num_train_original,
    # The rows the validation split holds out (data.validation_*), 0 without one.
    "num_validation": p.eval_data.test_labels.num_rows if p.eval_data is not data else 0,
    "num_train_with_label_texts": data.train_labels.num_rows,
    "num_test": data.test_labels.num_rows,
    "num_test_evaluated": trainer.final_rows,
    "epochs": config.train.epochs,
    "steps": progress.global_step,
    "train_time_s": round(progress.train_seconds, 2),
    "skipped_steps": trainer.skipped_steps,
    "first_step_s": trainer.first_step_s,
    "matmul_precision": config.encoder.matmul_precision,
    "total_time_s": round(time.time() - t_start, 2),
    "stage_seconds": stage_seconds,
    "phase_spans": phase_spans,
    "metrics": final,
    **final,
    "popularity_baseline": ranking.popularity_baseline(
      data, config, p.inv_prop, trainer.final_rows
    ),
    **(baselines.for_training_run(config) if distributed.is_leader() else {}),
    "evaluations": progress.evals,
    "time_breakup": p.profiler.breakup(progress.step_times, config.train.batch_size),
    "negatives": {**p.hard_negatives.summary(), "per_epoch": progress.negatives_per_epoch},
    "device": str(jax.devices()[0].platform),
    "device_kind": str(jax.devices()[0].device_kind),
    "num_devices": jax.device_count(),
    "num_processes": jax.process_count(),
    "mesh": dict(p.mesh.shape),
    "grad_accum_steps": config.train.grad_accum_steps,
    "degraded": progress.degraded.to_json(),
    "trained": trained_parts(trainer),
    **({"ann_eval": ann} if ann else {}),
    "encoder": encoder_source.identity(config.encoder, n_params)._asdict(),
    "config": json.loads(config.to_json()),
  }


def trained_parts(trainer: Trainer) -> dict:
  """What the run trained: {"encoder": whether it trained the encoder (not
  train.freeze_encoder), "classifier_rows": the W rows it could change (all L unless
  train.freeze_old_rows)}."""
  trainable = trainer.state.trainable
  rows = trainer.parts.data.num_labels if trainable is None else int(jax.jit(jnp.sum)(trainable))
  return {"encoder": not trainer.parts.config.train.freeze_encoder, "classifier_rows": rows}


def write_json(path: str, record: dict) -> None:
  """Atomically; a disk error raises faults.DiskFull naming `path`."""
  text = json.dumps(record, indent=1)
  with faults.writing(path, len(text)), xc_format.atomic_text_writer(path) as f:
    f.write(text)
