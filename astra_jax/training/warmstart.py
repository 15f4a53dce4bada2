"""An optional first stage: a siamese encoder trained on (query, positive label text) pairs.

NGAME's first stage, which Renée and DEXA start from: before any classifier exists, the
encoder learns to place each training query near the texts of its labels, with the other
label texts of the batch as negatives (an in-batch softmax over cosine similarities). The
classifier stage then starts from that encoder, and with `classifier.init=label_text` each
w_l starts at E(z_l), which the stage made meaningful: a label with one or no training
point scores queries by their similarity to its text from the first step.

The stage runs for `warmstart.epochs` passes over the training pairs, before W exists (or,
with `warmstart.pairs_per_epoch`, epochs of that many pairs drawn at random, for datasets
whose pairs are too many to take every one each epoch). An
epoch ends with a checkpoint in WORKDIR/warmstart (orbax, the encoder and its optimizer
state) when `checkpoint.every_minutes` have passed since the last one, and the last epoch
always does, so a killed run resumes at its last saved epoch, and a run whose stage is done
restores its result instead of training it again. The stage is data parallel: each device
of the mesh encodes its slice of a step's pairs with a replicated encoder, and the in-batch
softmax sees the whole batch (XLA gathers the embeddings), so a step equals the one-device
step and the stage's pairs per second grow with the devices.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.parallel import sharding
from astra_jax.runtime.errors import InputError


class TrainingPairs:
  """Every (training row, positive label) pair of the original training rows, in row order,
  read from the label rows a batch at a time rather than held (12 bytes a pair): only the
  rows' pair offsets are kept, 8 bytes a row."""

  def __init__(self, train_labels, num_rows: int):
    """
    Args:
      train_labels: the training label rows (SparseRows, SelectedRows or WithLabelRows).
      num_rows: how many leading rows are training points (label-text rows would pair a
        text with itself).
    """
    self.labels = train_labels
    self.offsets = np.zeros(num_rows + 1, np.int64)
    np.cumsum(train_labels.row_lengths(np.arange(num_rows, dtype=np.int64)), out=self.offsets[1:])

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def take(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs numbered `ids` (0 .. len - 1, in row order).

    Args:
      ids: (n,) pair numbers.
    Returns:
      (rows (n,) int64, labels (n,) int32).
    """
    ids = np.asarray(ids, np.int64)
    # The row holding pair p is the last whose offset is <= p (rows without labels share
    # their offset with the next row, which holds the pair).
    rows = np.searchsorted(self.offsets, ids, side="right") - 1
    lengths = self.offsets[rows + 1] - self.offsets[rows]
    _, labels = self.labels.entries(rows)
    first = np.cumsum(lengths) - lengths  # each row's first entry among `labels`
    return rows, labels[first + ids - self.offsets[rows]].astype(np.int32)


def epoch_pairs(num_pairs: int, per_epoch: int, rng: np.random.Generator) -> np.ndarray:
  """The pair numbers of one epoch, in the order its batches take them: every pair once in
  a random order, or, with `per_epoch` in (0, num_pairs), that many drawn uniformly with
  replacement (8 bytes a drawn pair, where a permutation is 8 bytes a pair of the data).

  Args:
    num_pairs: the pairs there are.
    per_epoch: `warmstart.pairs_per_epoch` (0: all).
    rng: the epoch's generator.
  Returns:
    (n,) int64 pair numbers.
  """
  if not per_epoch or per_epoch >= num_pairs:
    return rng.permutation(num_pairs)
  return rng.integers(0, num_pairs, per_epoch, dtype=np.int64)


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


def _batch_placement(mesh: jax.sharding.Mesh | None, batch: int):
  """A function placing a host batch array on the mesh split by rows over every device, or
  None where the stage runs on one device (no mesh, one device, or a batch the devices do
  not divide: the in-batch softmax takes no padding). Every process builds the same batch
  and hands over the slices of its own devices."""
  if mesh is None or mesh.size == 1 or batch % mesh.size:
    if mesh is not None and mesh.size > 1:
      logging.info(
        "warm start: batch %d is not a multiple of the %d devices; one device runs it",
        batch,
        mesh.size,
      )
    return None
  split = NamedSharding(mesh, P(sharding.ALL))
  return lambda x: sharding.from_host(x, split)


def run(
  config,
  graphdef,
  enc_params: nnx.State,
  train_tokens,
  label_tokens: np.ndarray | None,
  pairs: TrainingPairs,
  workdir: str,
  mesh: jax.sharding.Mesh | None = None,
) -> nnx.State:
  """Trains the encoder for `config.warmstart.epochs` siamese epochs (resuming, or restoring
  a finished stage, from WORKDIR/warmstart) and returns its parameters.

  Args:
    config: the run's config (`warmstart.*`, `train.seed`).
    graphdef: the encoder's NNX graph definition.
    enc_params: its starting parameters.
    train_tokens: (N, T) token rows, indexed by the pairs' rows.
    label_tokens: (L, T) label-text tokens.
    pairs: the (row, label) pairs to train on (`warmstart.pairs_per_epoch` of them an
      epoch, or all).
    workdir: the run's directory.
    mesh: the run's mesh; when its devices divide the batch, each takes its slice of the
      pairs (data parallel), the encoder replicated. None: the default device.
  Returns:
    The warm-started encoder parameters (replicated over the mesh when it split the batch).
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
  per_epoch = ws.get("pairs_per_epoch", 0)
  steps_per_epoch = min(per_epoch or len(pairs), len(pairs)) // batch
  if steps_per_epoch < 1:
    raise InputError(
      f"config.warmstart.batch_size={batch}: only {len(pairs)} (query, label) pairs"
      + (f" and warmstart.pairs_per_epoch={per_epoch}" if per_epoch else "")
    )
  put = _batch_placement(mesh, batch)
  if put is not None:
    enc_params = jax.device_put(enc_params, NamedSharding(mesh, P()))
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
    rng = np.random.default_rng([config.train.seed, epoch])
    order = epoch_pairs(len(pairs), per_epoch, rng)
    start, losses = time.time(), []
    for s in range(steps_per_epoch):
      rows, labels = pairs.take(np.sort(order[s * batch : (s + 1) * batch]))
      q = np.asarray(train_tokens[rows], np.int32)
      z = np.asarray(label_tokens[labels], np.int32)
      if put is not None:
        q, z, labels = put(q), put(z), put(labels)
      enc_params, opt_state, loss = step(
        enc_params,
        opt_state,
        q,
        z,
        labels,
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
