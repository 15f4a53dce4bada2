"""train_and_evaluate(config, workdir): data -> encoder + classifier -> train -> evaluate.

This module builds a run's parts and reads top to bottom; the loop itself is trainer.py's,
the steps steps.py's, the evaluations ranking.py's. Outputs in the workdir:
results.json, time_breakup.json, metrics.jsonl (one JSON object per log line / evaluation).
"""

from __future__ import annotations

import copy
import json
import os
import time

import jax
import ml_collections
import optax
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.ann.index import IndexKnobs, scann_available, warn_scann_missing
from astra_jax.config import base as config_base
from astra_jax.data import dataset, label_subset, synthetic, validation
from astra_jax.evaluation import final_eval, metrics
from astra_jax.model import pretrained
from astra_jax.model.embedding import make_embed_fn
from astra_jax.negatives import strategies
from astra_jax.negatives.manager import HardNegatives
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.negatives.schedule import NegativeSchedule
from astra_jax.negatives.strategies import IndexOver
from astra_jax.parallel import device_check, sharding
from astra_jax.parallel.mesh_embedding import embed_on_mesh
from astra_jax.runtime import cpu_budget, distributed, host_memory
from astra_jax.runtime.errors import InputError
from astra_jax.runtime.watchdog import HangWatchdog
from astra_jax.serving import export
from astra_jax.training import checkpoint, export_start, optim, run_config, steps, warmstart
from astra_jax.training.encoder_init import start_encoder
from astra_jax.training.lexical_terms import lexical_indexes
from astra_jax.training.neighbour_memory import vote_memories
from astra_jax.training.pipeline import TrainBatches, data_group_bounds
from astra_jax.training.results import StageClock, evaluate_and_export, results_record, write_json
from astra_jax.training.score_choice import choose_weights
from astra_jax.training.step_profile import StepProfiler
from astra_jax.training.train_log import TrainLog
from astra_jax.training.trainer import RunParts, Trainer
from astra_jax.xc import classifier_init, score_fusion, sparse_momentum


# ------------------------------------------------------------------------------- data
def prepare_data(config: ml_collections.ConfigDict) -> dataset.XCData:
  """Generates the synthetic dataset when asked (cached by its spec), then loads."""
  dc = config.data
  if dc.synthetic.enabled:
    if distributed.is_leader():
      synthetic.ensure_generated(dc.dir, synthetic.spec_from_config(dc.synthetic), workers=0)
    distributed.barrier("synthetic data")
    with dc.unlocked():
      if not dc.tokenizer_dir:
        dc.tokenizer_dir = os.path.join(dc.dir, "tokenizer")
  with dc.unlocked():
    dc.tokenizer_dir = pretrained.resolve(dc.tokenizer_dir)
  if not distributed.is_leader():  # the leader tokenizes (cached) first, the others read
    distributed.barrier("tokenized data")
  data = dataset.load(dc)
  if distributed.is_leader():
    distributed.barrier("tokenized data")
  if dc.get("label_subset", 0):
    data = label_subset.restrict(data, dc.label_subset, dc.label_subset_seed)
    logging.info(
      "label subset: %d labels (seed %d), %d training and %d test queries",
      data.num_labels,
      dc.label_subset_seed,
      data.num_train_original,
      data.test_labels.num_rows,
    )
  return data


# ------------------------------------------------------------------------------- setup
def load_splits(config: ml_collections.ConfigDict) -> tuple[dataset.XCData, dataset.XCData]:
  """(training data, the periodic evaluations' data): the validation split when
  `data.validation_fraction` carves one, else the test split (the same object)."""
  data = prepare_data(config)
  if not config.data.validation_fraction:
    return data, data
  split = validation.carve(data, validation.SplitSpec.from_config(config.data))
  return split.train, split.validation


def uses_sparse_step(config: ml_collections.ConfigDict) -> bool:
  """The sparse ASTRA step, or the dense one (a dense-only strategy touches every label)."""
  return (
    config.optim.classifier_update == "sparse"
    and not strategies.get(config.negatives.strategy).dense_update_only
  )


def check_layout(config: ml_collections.ConfigDict, mesh, sparse: bool) -> int:
  """Checks the mesh and batch split the config asks for; returns the micro-batch size."""
  num_devices = mesh.devices.size
  device_check.check_mesh(num_devices)
  if num_devices > 1 and not sparse:
    raise InputError(
      "config.mesh: a multi-device mesh needs optim.classifier_update=sparse "
      f"and a strategy that is not dense-only "
      f"({config.negatives.strategy} is)"
    )
  accum = config.train.grad_accum_steps
  micro_batch = config.train.batch_size // accum
  if config.train.batch_size % accum or micro_batch % num_devices:
    raise InputError(
      f"config.train.batch_size={config.train.batch_size} must split into "
      f"grad_accum_steps={accum} micro-batches divisible by the mesh's "
      f"{num_devices} devices"
    )
  return micro_batch


def make_state_and_steps(
  config: ml_collections.ConfigDict,
  graphdef,
  params: dict,
  mesh,
  total_steps: int,
  sparse: bool,
  trainable: jax.Array | None = None,
) -> tuple[steps.TrainState, steps.Steps]:
  """The train state laid out on the mesh and the run's jitted steps (for `uptodate` also
  the step that mines k_h in the step); `trainable`: the rows a step may change (None: all)."""
  nc, strategy = config.negatives, strategies.get(config.negatives.strategy)
  if sparse:
    frozen = config.train.freeze_encoder
    if frozen:
      logging.info("train.freeze_encoder: the encoder's weights stay as they start")
    # A frozen encoder keeps no Adam moments.
    tx = optax.set_to_zero() if frozen else optim.encoder_optimizer(config.optim, total_steps)
    beta = config.optim.classifier_momentum
    state = steps.shard_state(
      steps.init_sparse_state(
        tx,
        params,
        optim.initial_loss_scale(config),
        sparse_momentum.period_capacity(beta) if beta else 0,
        mesh,
        trainable,
      ),
      mesh,
    )
    train_step = steps.make_sparse_train_step(
      graphdef,
      tx,
      optim.classifier_schedule(config.optim, total_steps),
      config.optim.classifier_weight_decay,
      mesh,
      config.train.batch_size,
      optim.loss_scaling(config),
      beta,
      train_encoder=not frozen,
      lookup_table=optim.table_by_rows(config),
    )
  else:
    tx = optim.make_optimizer(config.optim, total_steps)
    state = steps.init_dense_state(tx, params)
    train_step = steps.make_train_step(
      graphdef, tx, 0, config.train.full_label_block if strategy.full_loss else 0
    )
  # uptodate mines k_h in the step from tau_s on (before, the sampler's k_h + k_r random)
  mining_step = steps.make_train_step(graphdef, tx, nc.k_h) if strategy.mined_in_step else None
  return state, steps.Steps(train_step, mining_step)


def back_with_huge_pages(state: steps.TrainState) -> None:
  """The sparse step's V, and its momentum's velocity, on transparent huge pages (CPU
  backend only): both are donated and keep their buffers, so once covers the run."""
  t = time.time()
  arrays = [state.classifier] + ([state.momentum.velocity] if state.momentum is not None else [])
  advised = sum(host_memory.back_with_huge_pages(x) for x in arrays)
  if advised:
    logging.info(
      "classifier: %.2f GB on transparent huge pages (%.1f s)", advised / 1e9, time.time() - t
    )


def claim_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Creates the workdir, or refuses one that holds a run of another config: before any long
  work, a rerun must be the same run. Every process compares (the leader writes), and all
  stop with the one line, none at a later collective's timeout."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise InputError(f"--workdir={workdir} is a file, not a directory")
  os.makedirs(workdir, exist_ok=True)
  refused = None
  try:
    run_config.check_config(workdir, json.loads(config.to_json()), distributed.is_leader())
  except InputError as e:
    refused = e
  if distributed.any_true([refused is not None])[0]:
    raise refused or InputError(
      f"{workdir}/config.json: another process refused this workdir's config"
    )


def make_hard_negatives(
  config: ml_collections.ConfigDict,
  schedule: NegativeSchedule,
  sampler: NegativeSampler,
  mesh,
  data: dataset.XCData,
  dim: int,
  workdir: str,
) -> HardNegatives:
  """The refresh manager for the W shards this process holds (each process mines its own)."""
  nc = config.negatives
  local_shards = sharding.local_model_shards(mesh)
  groups = sharding.local_data_groups(mesh)
  bounds = data_group_bounds(data.train_labels.num_rows, mesh.shape["data"])
  return HardNegatives(
    schedule,
    distributed.process_dir(workdir),
    data.train_labels,
    dim,
    index=IndexKnobs.from_config(nc.index),
    refresh_backend=nc.refresh_backend,
    recall_sample=nc.recall_sample,
    seed=config.train.seed,
    inject_fault=nc.inject_fault,
    shards=sampler.shard_bounds[local_shards].tolist(),
    shard_ids=local_shards,
    num_shards=mesh.shape["model"],
    # The training rows whose batches this process's data groups draw (pipeline.py): the
    # data replicas of a W shard divide its queries.
    query_rows=(int(bounds[groups[0]]), int(bounds[groups[-1] + 1])),
    # One file of collected query embeddings for all processes (each holds them all).
    queries_dir=os.path.join(workdir, "negatives"),
    writes_queries=distributed.is_leader(),
    threads=cpu_budget.refresh_threads(nc.refresh_threads, config.train.input_threads),
  )


def make_negatives_and_batches(
  config: ml_collections.ConfigDict,
  data: dataset.XCData,
  mesh,
  micro_batch: int,
  dim: int,
  workdir: str,
) -> tuple[HardNegatives, TrainBatches]:
  """The refresh manager (the schedule's hard negatives) and the training batches (the
  sampler's positives, hard and random negatives, this process's token rows)."""
  nc = config.negatives
  schedule = NegativeSchedule.from_config(config)
  if schedule.index_over is IndexOver.LABEL_TEXT and data.label_tokens is None:
    raise InputError(
      f"config.negatives.strategy={nc.strategy} indexes label-text embeddings, "
      f"but {data.data_dir} has no label texts"
    )
  sampler = NegativeSampler(
    data.train_labels,
    nc.k_p,
    nc.k_h,
    nc.k_r,
    mesh.shape["model"],
    per_query_random=nc.random_draws == "per_query",
    all_positives=(
      max(1, data.train_labels.max_row_length()) if schedule.strategy.needs_all_positives else 0
    ),
  )
  hard_negatives = make_hard_negatives(config, schedule, sampler, mesh, data, dim, workdir)
  if schedule.refresh_epochs and nc.refresh_backend == "host" and not scann_available():
    warn_scann_missing()  # once; each refresh that searched exactly is counted in `degraded`
  accum = config.train.grad_accum_steps
  batches = TrainBatches(
    data.train_tokens,
    sampler,
    config.train.batch_size,
    config.train.seed,
    config.train.prefetch,
    accum,
    sharding.process_token_rows(mesh, accum, micro_batch),
    config.train.input_threads,
    data_groups=mesh.shape["data"],
    held_groups=sharding.local_data_groups(mesh),
  )
  return hard_negatives, batches


def starting_classifier(
  config: ml_collections.ConfigDict,
  workdir: str,
  mesh,
  rows: int,
  d: int,
  data: dataset.XCData,
  embed_fn,
  enc_params,
) -> tuple[jax.Array, jax.Array | None]:
  """W's start (classifier_init.py), born split over 'model', and the rows a step may change;
  zeros where a checkpoint will replace them.

  Args:
    rows: W's rows, padded to a multiple of the 'model' axis.
    d: the embedding width.
    embed_fn, enc_params: the encoder, for a start from the label texts' embeddings.
  Returns:
    (the (rows, d) float32 W, sharded by rows; with `train.freeze_old_rows` the (rows,) bool
    mask of the labels `train.init_from` never trained (export_start.new_rows), sharded
    alike, else None).
  """
  w_layout = NamedSharding(mesh, P("model"))
  if checkpoint.has_complete_step(workdir):
    # The resume replaces W (and the mask) by the checkpoint's: its start would be thrown
    # away, and from the label texts at 10^7 labels it costs minutes and gigabytes of
    # transients (docs/results/scale_run.md).
    jnp = jax.numpy
    zeros = lambda shape, dtype: jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=w_layout)()
    mask = zeros((rows,), bool) if config.train.freeze_old_rows else None
    return zeros((rows, d), jnp.float32), mask
  source = None
  if config.train.init_from:
    source, exported, trained = export_start.export_rows(
      config.train.init_from, export.label_texts_of(config.data, data.data_dir)
    )
  w = classifier_init.initial_classifier(
    config,
    rows,
    d,
    config.train.seed,
    data.label_tokens,
    lambda tokens: embed_on_mesh(mesh, embed_fn, enc_params, tokens, config.eval.batch_size),
    w_layout,
    # Rows the export gives are not embedded: at 10^7 labels that pass costs minutes.
    skip=None if source is None else source >= 0,
  )
  if source is None:
    return w, None
  w = export_start.continue_classifier(w, source, exported)
  mask = None
  if config.train.freeze_old_rows:
    mask = export_start.new_rows(source, trained, rows, w_layout)
  return w, mask


def train_log(
  config: ml_collections.ConfigDict, workdir: str, batches: TrainBatches, total_steps: int
) -> TrainLog:
  """The progress log: metrics.jsonl and TensorBoard events from the leader (which writes
  the run's files), log lines from every process."""
  leader = distributed.is_leader()
  return TrainLog(
    os.path.join(workdir, "metrics.jsonl") if leader else os.devnull,
    config,
    batches,
    total_steps,
    tensorboard_dir=workdir if leader else None,
  )


def release_setup_memory() -> None:
  """Hands the set-up's freed blocks back to the system: W's start (at 10^7 labels the label
  texts' embeddings, a host W and its device copy) and a restored checkpoint leave blocks
  no step reuses, which main.py's malloc settings would keep resident for the whole run."""
  released = host_memory.release_freed_memory()
  logging.info(
    "set-up: %.2f GB of freed memory released, %.2f GB resident",
    released / 1e9,
    host_memory.resident_bytes() / 1e9,
  )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates and writes the workdir's files (module docstring); returns the
  results.json record. float32 matmuls run at `encoder.matmul_precision` throughout (a
  context, so that it ends with the run: jit keys its compilations on it); the training
  steps under a hang watchdog (`train.hang_timeout_s`, watchdog.py)."""
  config_base.validate(config)
  config_base.check_inputs(config)
  precision = config.encoder.matmul_precision
  with (
    jax.default_matmul_precision(None if precision == "default" else precision),
    HangWatchdog(config.train.hang_timeout_s, jax.process_index()) as hang_watchdog,
  ):
    return _train_and_evaluate(config, workdir, hang_watchdog)


def _train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, hang_watchdog: HangWatchdog
) -> dict:
  config = copy.deepcopy(config)  # data preparation fills in derived fields
  claim_workdir(config, workdir)
  t_start = time.time()
  stages = StageClock()

  # ---- data and model
  data, eval_data = load_splits(config)
  encoder = start_encoder(config, data.vocab_size, data.pad_id, config.train.seed)
  graphdef, enc_params = nnx.split(encoder, nnx.Param)
  d = encoder.cfg.embed_dim
  sparse = uses_sparse_step(config)
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
  micro_batch = check_layout(config, mesh, sparse)
  # W's rows padded to a multiple of the model axis; padded rows are never sampled (the
  # sampler draws from each shard's real rows) and never predicted (evaluation reads W[:L]).
  rows = sharding.padded_rows(data.num_labels, mesh)
  score_fusion.check_label_texts(config, data.label_tokens is not None, data.data_dir)
  stages.mark("data_and_encoder")
  if config.warmstart.epochs:
    pairs = warmstart.TrainingPairs(data.train_labels, data.num_train_original)
    enc_params = warmstart.run(
      config, graphdef, enc_params, data.train_tokens, data.label_tokens, pairs, workdir, mesh
    )
    stages.mark("warm_start")
  embed_fn = make_embed_fn(graphdef)
  w, trainable = starting_classifier(config, workdir, mesh, rows, d, data, embed_fn, enc_params)
  stages.mark("classifier_init")

  # ---- negatives and batches
  hard_negatives, batches = make_negatives_and_batches(config, data, mesh, micro_batch, d, workdir)
  steps_per_epoch = batches.steps_per_epoch
  total_steps = steps_per_epoch * config.train.epochs

  # ---- state, steps, trainer
  state, run_steps = make_state_and_steps(
    config,
    graphdef,
    {"encoder": enc_params, "classifier": w},
    mesh,
    total_steps,
    sparse,
    trainable,
  )
  del w, trainable  # the state holds them from here
  n_params = sum(x.size for x in jax.tree.leaves(enc_params))
  logging.info(
    "encoder %s: %d parameters, d=%d; classifier %d x %d; %d steps/epoch x %d epochs",
    encoder.cfg.model_type,
    n_params,
    d,
    data.num_labels,
    d,
    steps_per_epoch,
    config.train.epochs,
  )
  parts = RunParts(
    config=config,
    workdir=workdir,
    data=data,
    eval_data=eval_data,
    # Propensities from the original training rows (label-text rows would add 1 to each n_l).
    inv_prop=metrics.inverse_propensity(
      data.train_labels.head(data.num_train_original),
      config.data.propensity_A,
      config.data.propensity_B,
    ),
    embed_fn=embed_fn,
    mesh=mesh,
    batches=batches,
    hard_negatives=hard_negatives,
    steps=run_steps,
    profiler=StepProfiler(
      graphdef, steps_per_epoch, config.train.epochs, config.train.profile_steps, mesh
    ),
    log=train_log(config, workdir, batches, total_steps),
    hang_watchdog=hang_watchdog,
  )
  trainer = Trainer(parts, state)

  # ---- train: the same command with the same workdir resumes from the last checkpoint
  try:
    trainer.restore()
    if sparse:
      back_with_huge_pages(trainer.state)
    release_setup_memory()
    for epoch in range(trainer.progress.epoch, config.train.epochs):
      trainer.run_epoch(epoch)
  finally:
    trainer.close()
  hard_negatives.finish()
  hang_watchdog.disarm()
  stages.mark("training")

  # ---- evaluate and export
  indexes = lexical_indexes(trainer)  # its choice's index builds while the memory embeds
  memories = vote_memories(trainer)
  choice = choose_weights(trainer, memories, indexes)
  if choice is not None:
    stages.mark("score_choice")
  final, ann, phase_spans = evaluate_and_export(trainer, encoder.cfg, memories, indexes)
  results = results_record(trainer, final, ann, phase_spans, t_start, n_params, stages)
  if choice is not None:
    results["score_choice"] = choice.to_json()
  if distributed.is_leader():
    write_json(os.path.join(workdir, "time_breakup.json"), results["time_breakup"])
    write_json(os.path.join(workdir, "results.json"), results)
  final_eval.clear(workdir)
  return results
