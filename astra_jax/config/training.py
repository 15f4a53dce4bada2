"""The training fields: the optimizer (`config.optim`), the warm-start stage
(`config.warmstart`), the loop (`config.train`), the device mesh (`config.mesh`) and
checkpoints (`config.checkpoint`)."""

from __future__ import annotations

import math

import ml_collections

from astra_jax.config.require import require
from astra_jax.model import architectures
from astra_jax.negatives import strategies


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the sections `optim`, `warmstart`, `train`, `mesh`, `checkpoint` with their defaults."""
  c.optim = ml_collections.ConfigDict()
  c.optim.encoder_lr = 1e-4
  c.optim.classifier_lr = 0.05
  c.optim.warmup_steps = 3000
  # At most this share of the run's steps warms up (1.0: warmup_steps as given, capped only
  # by the run's length): a recipe meant for any dataset size sets it below 1.
  c.optim.warmup_max_fraction = 1.0
  c.optim.encoder_weight_decay = 0.0
  c.optim.encoder_adam_eps = 1e-8  # the paper configs take Renee's 1e-6 (paper_configs.py)
  c.optim.classifier_weight_decay = 1e-4
  # The classifier's SGD momentum, decay inside it as torch's SGD (xc/sparse_momentum.py: a
  # velocity as large as W); 0: plain SGD + decay (W = scale * V).
  c.optim.classifier_momentum = 0.0
  c.optim.classifier_update = "sparse"  # sparse: O(rows touched) per step, exact; dense: optax
  c.optim.grad_clip_norm = 0.0
  # The encoder's lookup table (the n-gram bag's) in the sparse step: dense (Adam over every
  # row) or rows (Adam over the rows the batch reads, their moments as they were elsewhere;
  # training/table_rows.py). For encoders without one (BERT) it is always dense.
  c.optim.encoder_table_update = "dense"
  # Loss scaling for float16 compute (training/loss_scale.py): 0 = dynamic under float16,
  # off otherwise; > 0 = that static scale.
  c.optim.loss_scale = 0.0

  # An optional first stage (astra_jax/training/warmstart.py, NGAME's stage 1): the encoder alone,
  # trained on (query, positive label text) pairs with in-batch negatives, before W exists.
  c.warmstart = ml_collections.ConfigDict()
  c.warmstart.epochs = 0  # 0: no warm start
  c.warmstart.batch_size = 256  # pairs per step (the in-batch negatives)
  c.warmstart.lr = 1e-3  # Adam, linear warmup then cosine decay to 0
  c.warmstart.warmup_steps = 100
  c.warmstart.inverse_temperature = 20.0  # logits = this x cosine similarity
  # Pairs an epoch: 0 takes every (query, positive) pair once in a random order; N > 0 draws
  # N pairs uniformly with replacement each epoch (for datasets whose pairs are too many).
  c.warmstart.pairs_per_epoch = 0

  c.train = ml_collections.ConfigDict()
  c.train.epochs = 10
  c.train.batch_size = 256  # global batch (all devices, all accumulation steps)
  c.train.grad_accum_steps = 1  # micro-batches per update (batch_size / this each)
  c.train.seed = 0
  c.train.log_every_steps = 50
  c.train.eval_every_epochs = 0  # 0: evaluate at the end only
  c.train.profile_steps = 20  # steps timed phase by phase for the time break-up
  c.train.prefetch = 4  # batches prepared ahead of the step
  c.train.input_threads = 2  # threads preparing them (a fast GPU: more; docs/training.md)
  c.train.classifier_init_std = 0.02
  # A workdir whose exported model the run continues from: its encoder, and W's rows matched
  # to this data's labels by text (training/export_start.py). "": none.
  c.train.init_from = ""
  # Parts of the model a run leaves as they start (a few-shot update of a grown model):
  # freeze_encoder trains no encoder weight (its backward pass is skipped); freeze_old_rows
  # trains only the W rows `init_from` never trained (labels it lacks or was grown with),
  # every other row staying the export's bit for bit, so the classifier's weight decay must
  # be 0 (it shrinks every row).
  c.train.freeze_encoder = False
  c.train.freeze_old_rows = False
  c.train.stop_after_steps = 0  # tests/debugging: behave as if SIGTERM came after N steps
  c.train.full_label_block = 8192  # strategy=full: labels per block of the full-L loss
  # A step that makes no progress for this long ends the process with every thread's stack
  # (runtime/watchdog.py), instead of a stuck rank holding the job; 0: no watchdog.
  c.train.hang_timeout_s = 1800.0

  # Device mesh: data x model devices; 1 x 1 is the single-device step. data=-1 takes every
  # device the model axis leaves. W's rows are split over 'model'.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1
  c.mesh.model = 1
  # Multi-process runs (one process per GPU): auto = jax.distributed.initialize() when the
  # environment says so (SLURM with more than one task, or JAX_COORDINATOR_ADDRESS set).
  c.mesh.distributed = "auto"  # auto | on | off

  # Checkpoints (orbax) in <workdir>/checkpoints: at every epoch end, every `every_steps`
  # steps and every `every_minutes` minutes (0 = not by that rule), and on SIGTERM/SIGINT.
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.enabled = True
  c.checkpoint.every_steps = 0
  c.checkpoint.every_minutes = 30.0
  c.checkpoint.keep = 3  # the last N, plus the best by P@5 (periodic evals)


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field of `optim`, `warmstart`, `train`, `mesh`
  and `checkpoint`."""
  strategy = strategies.get(c.negatives.strategy)
  for field in (
    "train.batch_size",
    "train.grad_accum_steps",
    "train.log_every_steps",
    "train.input_threads",
    "eval.batch_size",
    "checkpoint.keep",
  ):
    section, name = field.split(".")
    require(c[section][name] >= 1, field, f"must be >= 1, got {c[section][name]}")
  require(
    c.optim.classifier_update in ("sparse", "dense"),
    "optim.classifier_update",
    f"use sparse or dense, got {c.optim.classifier_update!r}",
  )
  require(
    0 <= c.optim.classifier_momentum < 1,
    "optim.classifier_momentum",
    f"must be in [0, 1) (0: no momentum), got {c.optim.classifier_momentum}",
  )
  require(c.train.epochs >= 1, "train.epochs", "must be >= 1")
  require(
    0 < c.optim.warmup_max_fraction <= 1,
    "optim.warmup_max_fraction",
    f"must be in (0, 1], got {c.optim.warmup_max_fraction}",
  )
  dense = c.optim.classifier_update == "dense" or strategy.dense_update_only
  require(
    c.optim.encoder_table_update in ("dense", "rows"),
    "optim.encoder_table_update",
    f"use dense or rows, got {c.optim.encoder_table_update!r}",
  )
  require(
    c.optim.encoder_table_update == "dense" or bool(architectures.get(c.encoder.arch).lookup_table),
    "optim.encoder_table_update",
    f"rows needs an encoder with a lookup table (ngram_bag), not {c.encoder.arch!r}",
  )
  require(
    c.optim.encoder_table_update == "dense" or not dense,
    "optim.encoder_table_update",
    "rows is the sparse step's; the dense update (optim.classifier_update=dense, or a "
    "dense-only strategy) updates the whole encoder",
  )
  require(
    not (dense and (c.encoder.dtype == "float16" or c.optim.loss_scale > 0)),
    "encoder.dtype",
    "float16 needs loss scaling, which only the sparse step does; the "
    "dense update (optim.classifier_update=dense, or a dense-only strategy: "
    + ", ".join(strategies.names(lambda s: s.dense_update_only))
    + ") runs in "
    "float32 or bfloat16",
  )
  require(
    c.optim.classifier_lr * c.optim.classifier_weight_decay < 1,
    "optim.classifier_weight_decay",
    f"classifier_lr x classifier_weight_decay = "
    f"{c.optim.classifier_lr * c.optim.classifier_weight_decay:g}: a step would scale W "
    "by 1 - lr wd <= 0",
  )
  beta, lr_wd = c.optim.classifier_momentum, c.optim.classifier_lr * c.optim.classifier_weight_decay
  require(
    dense or not beta or lr_wd <= (1 - math.sqrt(beta)) ** 2,
    "optim.classifier_weight_decay",
    f"classifier_lr x classifier_weight_decay = {lr_wd:g} is over (1 - sqrt(classifier_momentum))^2"
    f" = {(1 - math.sqrt(beta)) ** 2:g}: the sparse step's classifier momentum needs the decay "
    "below the momentum's damping (docs/DESIGN.md, section 3); lower either, or use "
    "optim.classifier_update=dense",
  )
  require(
    not ((c.train.freeze_encoder or c.train.freeze_old_rows) and dense),
    "train.freeze_encoder",
    "freezing part of the model needs the sparse step (optim.classifier_update=sparse and a "
    "strategy that is not dense-only)",
  )
  require(
    not (c.train.freeze_encoder and c.warmstart.epochs),
    "train.freeze_encoder",
    f"the warm start (warmstart.epochs={c.warmstart.epochs}) would train the frozen encoder; "
    "set warmstart.epochs=0",
  )
  if c.train.freeze_old_rows:
    require(
      c.train.init_from,
      "train.freeze_old_rows",
      "needs train.init_from: the old rows are those the exported model gives",
    )
    require(
      c.optim.classifier_weight_decay == 0,
      "train.freeze_old_rows",
      f"needs optim.classifier_weight_decay=0 (got {c.optim.classifier_weight_decay:g}): the "
      "decay shrinks every row, the frozen ones too",
    )
  require(c.train.hang_timeout_s >= 0, "train.hang_timeout_s", "must be >= 0 (0: no watchdog)")
  require(c.warmstart.epochs >= 0, "warmstart.epochs", "must be >= 0 (0: no warm start)")
  require(c.warmstart.batch_size >= 2, "warmstart.batch_size", "must be >= 2 (in-batch negatives)")
  require(
    c.warmstart.get("pairs_per_epoch", 0) >= 0,
    "warmstart.pairs_per_epoch",
    "must be >= 0 (0: every pair once an epoch)",
  )
  require(
    c.warmstart.lr > 0 and c.warmstart.inverse_temperature > 0,
    "warmstart",
    "lr and inverse_temperature must be > 0",
  )
