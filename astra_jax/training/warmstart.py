"""An optional first stage: a siamese encoder trained on (query, positive label text) pairs.

NGAME's first stage, which Renée and DEXA start from: before any classifier exists, the
encoder learns to place each training query near the texts of its labels, with the other
label texts of the batch as negatives (an in-batch softmax over cosine similarities). The
classifier stage then starts from that encoder, and with `classifier.init=label_text` each
w_l starts at E(z_l), which the stage made meaningful: a label with one or no training
point scores queries by their similarity to its text from the first step.

The stage runs for `warmstart.epochs` passes over the training pairs, before W exists. An
epoch ends with a checkpoint in WORKDIR/warmstart (orbax, the encoder and its optimizer
state) when `checkpoint.every_minutes` have passed since the last one, and the last epoch
always does, so a killed run resumes at its last saved epoch, and a run whose stage is done
restores its result instead of training it again. The stage is replicated: on a mesh every
device (and process) computes the same step, which is cheap next to the classifier stage
and keeps the stage free of sharding rules.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx

from astra_jax.runtime.errors import InputError


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Every (training row, positive label) pair of the original training rows."""

  rows: np.ndarray  # (n,) int64 training-row index
  labels: np.ndarray  # (n,) int32 label id


def training_pairs(train_labels, num_rows: int) -> Pairs:
  """The (row, label) pairs of the first `num_rows` rows of `train_labels` (the original
  training rows; label-text rows would pair a text with itself).

  Args:
    train_labels: the training label rows (SparseRows or WithLabelRows).
    num_rows: how many leading rows are training points.
  Returns:
    The pairs, in row order.
  """
  rows, labels = train_labels.entries(np.arange(num_rows, dtype=np.int64))
  return Pairs(rows.astype(np.int64), labels.astype(np.int32))


def in_batch_softmax_loss(
  queries: jax.Array, texts: jax.Array, labels: jax.Array, inverse_temperature: float
) -> jax.Array:
  """Mean cross-entropy of each query against the batch's label texts, its own text the
  target; another pair of the batch with the same label is no negative (masked out).

  Args:
    queries: (B, d) query embeddings.
    texts: (B, d) embeddings of each pair's label text.
    labels: (B,) each pair's label id.
    inverse_temperature: logits are this times the cosine similarity.
  Returns:
    The scalar loss.
  """
  q = queries / jnp.linalg.norm(queries, axis=-1, keepdims=True).clip(1e-6)
  z = texts / jnp.linalg.norm(texts, axis=-1, keepdims=True).clip(1e-6)
  logits = inverse_temperature * (q @ z.T)
  same = labels[:, None] == labels[None, :]
  logits = jnp.where(same & ~jnp.eye(len(labels), dtype=bool), -jnp.inf, logits)
  return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(len(labels))).mean()


def _make_step(graphdef, optimizer: optax.GradientTransformation, inverse_temperature: float):
  def loss_fn(params, q_ids, z_ids, labels, key):
    model = nnx.merge(graphdef, params)
    kq, kz = jax.random.split(key)
    return in_batch_softmax_loss(
      model.pooled(q_ids, kq), model.pooled(z_ids, kz), labels, inverse_temperature
    )

  @jax.jit
  def step(params, opt_state, q_ids, z_ids, labels, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, q_ids, z_ids, labels, key)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def run(
  config,
  graphdef,
  enc_params: nnx.State,
  train_tokens,
  label_tokens: np.ndarray | None,
  pairs: Pairs,
  workdir: str,
) -> nnx.State:
  """Trains the encoder for `config.warmstart.epochs` siamese epochs (resuming, or restoring
  a finished stage, from WORKDIR/warmstart) and returns its parameters.

  Args:
    config: the run's config (`warmstart.*`, `train.seed`).
    graphdef: the encoder's NNX graph definition.
    enc_params: its starting parameters.
    train_tokens: (N, T) token rows, indexed by `pairs.rows`.
    label_tokens: (L, T) label-text tokens.
    pairs: the (row, label) pairs to train on.
    workdir: the run's directory.
  Returns:
    The warm-started encoder parameters.
  Raises:
    InputError: the dataset has no label texts, or too few pairs for one batch.
  """
  ws = config.warmstart
  if label_tokens is None:
    raise InputError(
      f"config.warmstart.epochs={ws.epochs}: the siamese stage pairs queries "
      f"with label texts, and {config.data.dir} has none"
    )
  batch = ws.batch_size
  steps_per_epoch = len(pairs.rows) // batch
  if steps_per_epoch < 1:
    raise InputError(
      f"config.warmstart.batch_size={batch}: only {len(pairs.rows)} (query, label) pairs"
    )
  total = steps_per_epoch * ws.epochs
  schedule = optax.warmup_cosine_decay_schedule(0.0, ws.lr, min(ws.warmup_steps, total // 2), total)
  optimizer = optax.adam(schedule)
  step = _make_step(graphdef, optimizer, ws.inverse_temperature)
  opt_state = optimizer.init(enc_params)
  manager = ocp.CheckpointManager(
    os.path.abspath(os.path.join(workdir, "warmstart")),
    options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True),
  )
  done = manager.latest_step() or 0
  if done:
    target = {"params": enc_params, "opt_state": opt_state}
    restored = manager.restore(done, args=ocp.args.StandardRestore(target))
    enc_params, opt_state = restored["params"], restored["opt_state"]
    logging.info(
      "warm start: resumed after epoch %d of %d (%s)",
      done,
      ws.epochs,
      os.path.join(workdir, "warmstart"),
    )
  key = jax.random.key(config.train.seed + 7)
  # The encoder's Adam state makes a checkpoint three times its size (the n-gram bag of
  # xc_text.py:ngram: docs/results/training.md), so between epochs the stage saves on the
  # run's clock (checkpoint.every_minutes; every epoch without one); the last epoch is
  # always saved, so a finished stage is restored, never trained again.
  every_s = 60.0 * config.checkpoint.every_minutes if "checkpoint" in config else 0.0
  last_save = time.time()
  for epoch in range(done, ws.epochs):
    order = np.random.default_rng([config.train.seed, epoch]).permutation(len(pairs.rows))
    start, losses = time.time(), []
    for s in range(steps_per_epoch):
      take = np.sort(order[s * batch : (s + 1) * batch])
      q = np.asarray(train_tokens[pairs.rows[take]], np.int32)
      z = np.asarray(label_tokens[pairs.labels[take]], np.int32)
      enc_params, opt_state, loss = step(
        enc_params,
        opt_state,
        q,
        z,
        pairs.labels[take],
        jax.random.fold_in(key, epoch * steps_per_epoch + s),
      )
      losses.append(loss)
    logging.info(
      "warm start epoch %d/%d: in-batch softmax loss %.4f | %d pairs/s",
      epoch + 1,
      ws.epochs,
      float(np.mean(jax.device_get(losses))),
      steps_per_epoch * batch / max(time.time() - start, 1e-9),
    )
    if epoch + 1 == ws.epochs or time.time() - last_save >= every_s:
      manager.save(
        epoch + 1, args=ocp.args.StandardSave({"params": enc_params, "opt_state": opt_state})
      )
      manager.wait_until_finished()
      last_save = time.time()
  manager.close()
  return enc_params
