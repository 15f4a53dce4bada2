"""train_and_evaluate(config, workdir): data -> encoder + classifier -> train -> evaluate.

The train step is one jitted pure function of (params, opt_state, batch, key) with params
and optimizer state donated. Outputs in the workdir: results.json, time_breakup.json,
metrics.jsonl (one JSON object per log line / evaluation).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from astra_jax import (baselines, checkpoint, classifier, classifier_init, config_base,
                       cpu_budget, device_check, distributed, faults, final_eval, host_memory,
                       knn, loss, loss_scale, metrics, optim, predict, sharding,
                       sparse_momentum)
from astra_jax.data import dataset, label_subset, synthetic, validation, xc_format
from astra_jax.data.pipeline import TrainBatches
from astra_jax.degraded import Degraded, note_epoch_start
from astra_jax.errors import InputError
from astra_jax.export import load_model, save_trained_model
from astra_jax.model import encoder_source, pretrained
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.model.weights import load_hf_weights
from astra_jax.negatives import strategies
from astra_jax.negatives.manager import HardNegatives
from astra_jax.negatives.refresh import RefreshInterrupted
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.negatives.schedule import NegativeSchedule
from astra_jax.negatives.strategies import IndexOver
from astra_jax.step_profile import StepProfiler
from astra_jax.watchdog import HangWatchdog

_DEVICE_KEYS = ("input_ids", "pos_ids", "pos_mask", "pos_weight", "hard_ids", "hard_mask",
                "rand_ids", "rand_mask", "rand_weight", "all_pos_ids")


# ------------------------------------------------------------------------------- data
def prepare_data(config: ml_collections.ConfigDict) -> dataset.XCData:
  """Generates the synthetic dataset when asked (cached by its spec), then loads."""
  dc = config.data
  if dc.synthetic.enabled:
    # The spec's fields the config sets (a field it lacks keeps the spec's default).
    spec = synthetic.SyntheticSpec(**{f.name: dc.synthetic[f.name]
                                      for f in dataclasses.fields(synthetic.SyntheticSpec)
                                      if f.name in dc.synthetic})
    if not synthetic.is_current(dc.dir, spec) and distributed.is_leader():
      logging.info("generating synthetic dataset into %s", dc.dir)
      synthetic.generate(dc.dir, spec)
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
    logging.info("label subset: %d labels (seed %d), %d training and %d test queries",
                 data.num_labels, dc.label_subset_seed, data.num_train_original,
                 data.test_labels.num_rows)
  return data


# ------------------------------------------------------------------------------ model
def build_encoder(config, vocab_size: int, pad_id: int, seed: int) -> Encoder:
  ec = config.encoder
  common = dict(bottleneck_dim=ec.bottleneck_dim, embedding_dropout=ec.embedding_dropout,
                dtype=ec.dtype)
  hf_dir = pretrained.resolve(ec.hf_dir)
  if hf_dir:
    cfg = EncoderConfig.from_hf(hf_dir, **common)
    if cfg.vocab_size < vocab_size:
      raise InputError(f"{hf_dir}/config.json: vocab_size {cfg.vocab_size} is smaller than "
                       f"the tokenizer's {vocab_size}")
  else:
    cfg = EncoderConfig(vocab_size=vocab_size, hidden_size=ec.hidden_size,
                        num_layers=ec.num_layers, num_heads=ec.num_heads,
                        intermediate_size=ec.intermediate_size,
                        max_position=max(512, config.data.max_len), pad_token_id=pad_id,
                        hidden_dropout=ec.hidden_dropout, attention_dropout=ec.hidden_dropout,
                        **common)
  if config.data.max_len > cfg.max_position:
    raise InputError(f"config.data.max_len={config.data.max_len} exceeds the encoder's "
                     f"max_position_embeddings={cfg.max_position}")
  model = Encoder(cfg, nnx.Rngs(params=seed))
  encoder_source.check(ec)  # weights missing: an error unless load_weights=False
  if hf_dir and ec.load_weights:
    weights = os.path.join(hf_dir, encoder_source.WEIGHTS_FILE)
    load_hf_weights(model, weights)
    logging.info("loaded encoder weights from %s", weights)
  elif hf_dir:
    logging.info("encoder.load_weights=False: %s randomly initialised", hf_dir)
  if ec.get("init_from_workdir", ""):
    init_from_exported(model, ec.init_from_workdir)
  return model


def init_from_exported(model: Encoder, workdir: str) -> None:
  """Copies the encoder weights of WORKDIR/model (export.py) into `model`.

  Args:
    model: the encoder the config built.
    workdir: a finished run's workdir (`encoder.init_from_workdir`).
  Raises:
    InputError: no exported model there, or its encoder has another shape.
  """
  exported = load_model(workdir)
  ours = nnx.state(model, nnx.Param)
  theirs = dict(nnx.to_flat_state(exported.encoder_params))
  for path, var in nnx.to_flat_state(ours):
    got = theirs.get(path)
    if got is None or tuple(got.shape) != tuple(var.shape):
      raise InputError(f"config.encoder.init_from_workdir={workdir}: its encoder's "
                       f"{'/'.join(map(str, path))} is "
                       f"{'missing' if got is None else tuple(got.shape)}, this config's is "
                       f"{tuple(var.shape)}; give the encoder that run's shape")
    var.set_value(jnp.asarray(got.get_value(), var.dtype))
  nnx.update(model, ours)
  logging.info("encoder initialised from %s", os.path.join(workdir, "model"))


# ------------------------------------------------------------------------------- steps
def mine_in_step(emb: jax.Array, w: jax.Array, batch: dict, k: int) -> dict:
  """The `uptodate` oracle: each query's k top-scoring non-positive labels under the current
  W and E(x), exact over all L (O(B L) per step: small L only). Every positive is excluded
  (batch["all_pos_ids"], padded with -1), not only the k_p kept."""
  scores = jax.lax.stop_gradient(emb @ w.T)
  rows = jnp.arange(emb.shape[0])[:, None]
  pos = jnp.where(batch["all_pos_ids"] >= 0, batch["all_pos_ids"], w.shape[0])  # -> dropped
  scores = scores.at[rows, pos].set(-jnp.inf, mode="drop")
  _, hard = jax.lax.top_k(scores, k)
  rand = batch["rand_ids"] if batch["rand_ids"].ndim == 2 else batch["rand_ids"][None]
  hit = (rand[:, :, None] == hard[:, None, :]).any(-1)
  return dict(batch, hard_ids=hard.astype(jnp.int32), hard_mask=jnp.ones_like(hard, bool),
              rand_mask=batch["rand_mask"] & ~hit)


def encode(graphdef, enc_params, ids: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Training-mode E(x): (after the embedding dropout, before it). The pre-dropout
  embeddings are what the hard-negative refresh collects."""
  encoder = nnx.merge(graphdef, enc_params)
  pooled = encoder.pooled(ids, dropout_key=key)
  return encoder.embedding_dropout(pooled, key), pooled


def _micro_keys(key: jax.Array, n: int) -> jax.Array:
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))


def make_train_step(graphdef, tx: optax.GradientTransformation, uptodate_k: int = 0,
                    full_block: int = 0):
  """The dense step (one device): autodiff w.r.t. all of W and the optax chain of optim.py.
  Used by the `uptodate` oracle and the full-L baseline, which touch every label anyway, and
  as the reference the sparse step is tested against. Batch arrays are (A, B/A, ...): the
  gradients of the A micro-batches are summed before the update. Returns (params,
  opt_state, loss, E(x) before embedding dropout (B, d)). full_block > 0: the full-L BCE
  (all labels, in blocks of that many) instead of the estimator, over every positive of a
  query (batch["all_pos_ids"]), not only the k_p sampled."""

  def loss_fn(params, batch, key, num_micro):
    emb, pooled = encode(graphdef, params["encoder"], batch["input_ids"], key)
    if full_block:
      value = loss.full_bce_chunked(emb, params["classifier"], batch["all_pos_ids"],
                                    batch["all_pos_ids"] >= 0, full_block)
    else:
      if uptodate_k:
        batch = mine_in_step(pooled, params["classifier"], batch, uptodate_k)
      value = loss.sampled_bce(emb, params["classifier"], batch)
    return value / num_micro, pooled

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, key):
    a = batch["input_ids"].shape[0]

    def micro(acc, xs):
      mb, k = xs
      (value, pooled), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb, k, a)
      return jax.tree.map(jnp.add, acc, grads), (value, pooled)

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, (values, pooled) = jax.lax.scan(micro, zeros, (batch, _micro_keys(key, a)))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, values.sum(),
            pooled.reshape(-1, pooled.shape[-1]))

  return train_step


def make_sparse_train_step(graphdef, tx_encoder: optax.GradientTransformation, lr_schedule,
                           weight_decay: float, mesh, global_batch: int,
                           loss_scaling: str = "off", momentum: float = 0.0):
  """The ASTRA step on a (data, model) mesh (1 x 1 on one device), O(rows touched) in W.

  The encoder runs data-parallel under jit's partitioning; the classifier through
  `classifier.classifier_grads` (gradients w.r.t. the gathered rows of W = scale * V, never
  the (L, d) matrix); the encoder's gradient is the VJP of its forward pass with the
  kernel's dloss/dE(x). Batch arrays are (A, B/A, ...): a scan over the A micro-batches
  sums the encoder gradients and collects the row gradients (factored: dloss/dscore and the
  embeddings, not rows x d), then one Adam step and one
  `classifier.classifier_update` step into the donated V. W is the same for all
  micro-batches, as in the dense step. loss_scaling: off | static | dynamic (see
  loss_scale.py); with dynamic, a step with non-finite gradients changes nothing but the
  scale.
  momentum > 0: SGD with that momentum (decay inside it, as the dense chain), through
  `classifier.classifier_momentum_update`; W is then V caught up (sparse_momentum.py), not
  scale * V.
  opt_state: {"encoder", "scale", "step", "loss_scale"[, "momentum"]}."""
  grads_kernel = classifier.classifier_grads(mesh, global_batch)
  update_kernel = (classifier.classifier_momentum_update(mesh, weight_decay, momentum)
                   if momentum else classifier.classifier_update(mesh, weight_decay))

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, key):
    v, scale = params["classifier"], opt_state["scale"]
    s = opt_state["loss_scale"]["scale"] if loss_scaling != "off" else jnp.float32(1.0)
    a = batch["input_ids"].shape[0]

    def micro(acc, xs):
      mb, k = xs
      emb, enc_vjp, pooled = jax.vjp(lambda p: encode(graphdef, p, mb["input_ids"], k),
                                     params["encoder"], has_aux=True)
      labels = {name: x for name, x in mb.items() if name != "input_ids"}
      value, d_emb, row_grads = grads_kernel(emb, v, scale, labels, opt_state.get("momentum"))
      (g_enc,) = enc_vjp((d_emb.astype(jnp.float32) * s).astype(emb.dtype))
      return jax.tree.map(jnp.add, acc, g_enc), (value, row_grads, pooled)

    zeros = jax.tree.map(jnp.zeros_like, params["encoder"])
    g_enc, (values, row_grads, pooled) = jax.lax.scan(micro, zeros,
                                                      (batch, _micro_keys(key, a)))
    g_enc = jax.tree.map(lambda g: g / s, g_enc)
    value = values.sum()
    ok = jnp.bool_(True)
    if loss_scaling == "dynamic":
      ok = loss_scale.all_finite((g_enc, row_grads)) & jnp.isfinite(value)
      # lr 0 alone would still add 0 * inf = nan to V
      row_grads = jax.tree.map(
          lambda g: jnp.where(ok, g, 0.0) if jnp.issubdtype(g.dtype, jnp.floating) else g,
          row_grads)
    updates, enc_state = tx_encoder.update(g_enc, opt_state["encoder"], params["encoder"])
    encoder = optax.apply_updates(params["encoder"], updates)
    lr = jnp.where(ok, lr_schedule(opt_state["step"]), 0.0)
    if momentum:
      v, momentum_state = update_kernel(v, opt_state["momentum"], row_grads, lr, ok)
    else:
      v, scale = update_kernel(v, scale, row_grads, lr)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
    new_state = {"encoder": keep(enc_state, opt_state["encoder"]), "scale": scale,
                 "step": opt_state["step"] + ok.astype(jnp.int32),
                 "loss_scale": opt_state["loss_scale"]}
    if momentum:
      new_state["momentum"] = momentum_state
    if loss_scaling == "dynamic":
      new_state["loss_scale"] = loss_scale.adjust(opt_state["loss_scale"], ok)
    return ({"encoder": keep(encoder, params["encoder"]), "classifier": v}, new_state,
            value, pooled.reshape(-1, pooled.shape[-1]))

  return train_step


def init_sparse_opt_state(tx_encoder: optax.GradientTransformation, params,
                          initial_loss_scale: float = 1.0, momentum_steps: int = 0) -> dict:
  """The sparse step's optimizer state; momentum_steps > 0 adds the classifier's momentum
  state (sparse_momentum.py) for folds at least every that many steps."""
  state = {"encoder": tx_encoder.init(params["encoder"]), "scale": jnp.float32(1.0),
           "step": jnp.int32(0), "loss_scale": loss_scale.init(initial_loss_scale)}
  if momentum_steps:
    state["momentum"] = sparse_momentum.init(*params["classifier"].shape, momentum_steps)
  return state


def make_embed_fn(graphdef):
  return jax.jit(lambda p, ids: nnx.merge(graphdef, p)(ids))


def embed(embed_fn, enc_params, tokens, batch_size: int) -> np.ndarray:
  out = []
  for start in range(0, len(tokens), batch_size):
    ids = np.asarray(tokens[start:start + batch_size], np.int32)
    m = len(ids)
    if m < batch_size:
      ids = np.pad(ids, ((0, batch_size - m), (0, 0)))
    out.append(np.asarray(embed_fn(enc_params, jnp.asarray(ids)))[:m])
  return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


# -------------------------------------------------------------------------- evaluation
def host_local(tree):
  """A replicated tree as this process can compute with alone: in a multi-process run its
  own copy of each array (the arrays themselves on one process)."""
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def host_params(params: dict) -> dict:
  """The encoder's local copy and all of W gathered (evaluation only)."""
  if jax.process_count() == 1:
    return params
  return {"encoder": host_local(params["encoder"]),
          "classifier": distributed.gather_rows(params["classifier"])}


def evaluate_model(embed_fn, params, data: dataset.XCData, config, inv_prop,
                   max_rows: int = 0) -> dict[str, float]:
  params = host_params(params)
  ks = tuple(config.eval.ks)
  n = data.test_labels.num_rows if not max_rows else min(max_rows, data.test_labels.num_rows)
  emb = embed(embed_fn, params["encoder"], data.test_tokens[:n], config.eval.batch_size)
  filt = data.test_filter[data.test_filter[:, 0] < n]
  k = max(ks) + metrics.max_filtered_per_row(filt)
  _, ids = predict.topk(emb, params["classifier"][:data.num_labels], k, config.eval.batch_size,
                        config.eval.label_block)
  ranked = metrics.remove_filtered(ids, filt, max(ks))
  return metrics.as_percent(metrics.compute(ranked, data.test_labels.head(n), inv_prop, ks))


def popularity_baseline(data: dataset.XCData, config, inv_prop) -> dict[str, float]:
  """Every test row gets the most frequent training labels (filter applied)."""
  ks = tuple(config.eval.ks)
  counts = data.train_labels.column_counts()
  k = max(ks) + metrics.max_filtered_per_row(data.test_filter)
  top = np.argsort(-counts, kind="stable")[:k]
  ranked = np.broadcast_to(top, (data.test_labels.num_rows, len(top)))
  ranked = metrics.remove_filtered(ranked, data.test_filter, max(ks))
  return metrics.as_percent(metrics.compute(ranked, data.test_labels, inv_prop, ks))


def knn_diagnostic(embed_fn, params, train_data: dataset.XCData, eval_data: dataset.XCData,
                   config) -> dict[str, float]:
  """`eval.knn_diagnostic` > 0: {"kNN-E P@k": ...}, the vote of that many nearest original
  training rows under the encoder's own embeddings (knn.py); {} when off."""
  k = config.eval.knn_diagnostic
  if not k:
    return {}
  enc = host_params(params)["encoder"]
  bs = config.eval.batch_size
  n_train = train_data.num_train_original
  keys = embed(embed_fn, enc, train_data.train_tokens[np.arange(n_train)], bs)
  queries = embed(embed_fn, enc, eval_data.test_tokens[np.arange(len(eval_data.test_tokens))],
                  bs)
  neighbors, sims = knn.embedding_neighbors(queries, keys, k)
  ks = tuple(config.eval.ks)
  k_out = max(ks) + metrics.max_filtered_per_row(eval_data.test_filter)
  ranked = knn.vote(neighbors, sims, train_data.train_labels.head(n_train), k_out)
  ranked = metrics.remove_filtered(ranked, eval_data.test_filter, max(ks))
  m = metrics.as_percent(metrics.compute(ranked, eval_data.test_labels, None, ks))
  return {f"kNN-E {name}": v for name, v in m.items() if name.startswith("P@")}


def tfidf_baselines(config) -> dict:
  """`eval.tfidf_baseline`: {"tfidf_knn_baseline": metrics} on the test split, when
  scikit-learn is installed ({} otherwise or when off)."""
  if not config.eval.tfidf_baseline:
    return {}
  if not baselines.sklearn_available():
    logging.warning("eval.tfidf_baseline: scikit-learn is not installed; skipped")
    return {}
  texts = baselines.load_texts(config.data.dir, config.data.layout, config.data.use_content)
  return {"tfidf_knn_baseline": baselines.tfidf_knn(texts, tuple(config.eval.ks))}


# ------------------------------------------------------------------------------- loop
class TrainLog:
  """Progress output: a line every `train.log_every_steps` steps and at each epoch's end
  (loss; queries/s and the share of the time the loop waited for input since the last line;
  learning rates; ETA), each also a JSON line in `path` (metrics.jsonl), as are evaluations.

  Steps that dynamic loss scaling skipped (non-finite gradients or loss: float16 overflow;
  the step changed nothing but the scale) are counted per line. A non-finite loss stops the
  run only where nothing skipped it (no dynamic scaling), and skipped steps only when every
  step of a line's window was skipped: then the scale is not recovering."""

  def __init__(self, path: str, config: ml_collections.ConfigDict, batches: TrainBatches,
               total_steps: int):
    self.f = open(path, "a")
    self.config, self.batches, self.total_steps = config, batches, total_steps
    self.every = config.train.log_every_steps  # read every step: not through ConfigDict

  def start(self, step: int, skipped_total: int = 0) -> None:
    """The next line's window opens at `step` (of the epoch), `skipped_total` steps of the
    run skipped so far."""
    self.window_step, self.t, self.waited = step, time.time(), self.batches.wait_seconds
    self.skipped_before = skipped_total

  def due(self, step: int) -> bool:
    return ((step + 1) % self.every == 0
            or step + 1 == self.batches.steps_per_epoch)

  def report(self, epoch: int, step: int, global_step: int, loss_value: float,
             negatives: dict, skipped_total: int = 0) -> None:
    """The line for the window that ends after `step`; `skipped_total`: the run's steps
    skipped by dynamic loss scaling so far. Raises FloatingPointError as the class says."""
    dt = max(time.time() - self.t, 1e-9)
    n = step + 1 - self.window_step
    skipped = skipped_total - self.skipped_before
    qps = n * self.config.train.batch_size / dt
    eta = (self.total_steps - global_step) * dt / max(n, 1)
    lr_e, lr_c = optim.learning_rates(self.config.optim, self.total_steps, global_step)
    input_wait = (self.batches.wait_seconds - self.waited) / dt  # the device idle
    logging.info("epoch %d step %d/%d loss %.4f | %.0f queries/s | input wait %.1f%% | "
                 "lr %.2e/%.2e | negatives %d hard + %d random | ETA %s%s", epoch, step + 1,
                 self.batches.steps_per_epoch, loss_value, qps, 100 * input_wait, lr_e, lr_c,
                 negatives["num_hard"], negatives["num_random"],
                 time.strftime("%H:%M:%S", time.gmtime(eta)),
                 f" | {skipped} of {n} steps skipped (non-finite float16 gradients; loss "
                 "scale lowered)" if skipped else "")
    if skipped >= n:
      raise FloatingPointError(
          f"all {n} steps up to epoch {epoch} step {step + 1} were skipped for non-finite "
          "gradients: dynamic loss scaling is not recovering (try encoder.dtype=float32 or "
          "bfloat16, or a lower learning rate)")
    if not np.isfinite(loss_value) and not skipped:
      raise FloatingPointError(f"loss is {loss_value} at epoch {epoch} step {step + 1}")
    record = dict(kind="train", epoch=epoch, step=global_step,
                  loss=loss_value if np.isfinite(loss_value) else None, queries_per_s=qps,
                  input_wait=round(input_wait, 4))
    if skipped:
      record["skipped_steps"] = skipped
    self.write(**record)
    self.start(step + 1, skipped_total)

  def write(self, **record) -> None:
    self.f.write(json.dumps(record) + "\n")
    self.f.flush()


def final_evaluation(embed_fn, params, data: dataset.XCData, config, inv_prop, workdir: str,
                     global_step: int, checkpointed: bool) -> dict[str, float]:
  """The whole test set's metrics (final_eval.py): resumed from its progress record, and
  stopped by SIGTERM / SIGINT after recording it (checkpoint.Preempted)."""
  host = host_params(params)
  stop = checkpoint.StopSignal()
  try:
    return final_eval.evaluate(
        lambda rows: embed(embed_fn, host["encoder"], data.test_tokens[rows],
                           config.eval.batch_size),
        host["classifier"][:data.num_labels], data, config, inv_prop, workdir, global_step,
        lambda: bool(stop.received))
  except final_eval.EvalInterrupted as e:
    raise _preempted(stop, f"({e})", checkpointed) from None
  finally:
    stop.restore()


def _preempted(stop: checkpoint.StopSignal, where: str, saved: bool) -> checkpoint.Preempted:
  return checkpoint.Preempted(
      f"stopped by signal {stop.received} {where}; "
      + ("checkpoint written; rerun the same command to resume" if saved else
         "no checkpoint (checkpoint.enabled=False)"))


def claim_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Creates the workdir, or refuses one that holds a run of another config: before any long
  work, a rerun must be the same run. Every process compares (the leader writes), and all
  stop with the one line, none at a later collective's timeout."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise InputError(f"--workdir={workdir} is a file, not a directory")
  os.makedirs(workdir, exist_ok=True)
  refused = None
  try:
    checkpoint.check_config(workdir, json.loads(config.to_json()), distributed.is_leader())
  except InputError as e:
    refused = e
  if distributed.any_true([refused is not None])[0]:
    raise refused or InputError(f"{workdir}/config.json: another process refused this "
                                "workdir's config")


def make_steps(config: ml_collections.ConfigDict, graphdef, params: dict, mesh,
               total_steps: int, sparse: bool, steps_per_epoch: int):
  """(params, opt_state, train_step, mining_step): params and optimizer state laid out on
  the mesh, the jitted step, and for `uptodate` the step that mines k_h in the step."""
  nc, strategy = config.negatives, strategies.get(config.negatives.strategy)
  if sparse:
    tx = optim.encoder_optimizer(config.optim, total_steps)
    beta = config.optim.classifier_momentum
    opt_state = init_sparse_opt_state(tx, params, optim.initial_loss_scale(config),
                                      steps_per_epoch if beta else 0)
    params, opt_state = sharding.shard_params(params, opt_state, mesh)
    train_step = make_sparse_train_step(
        graphdef, tx, optim.classifier_schedule(config.optim, total_steps),
        config.optim.classifier_weight_decay, mesh, config.train.batch_size,
        optim.loss_scaling(config), beta)
  else:
    tx = optim.make_optimizer(config.optim, total_steps)
    opt_state = tx.init(params)
    train_step = make_train_step(graphdef, tx, 0,
                                 config.train.full_label_block if strategy.full_loss else 0)
  # uptodate mines k_h in the step from tau_s on (before, the sampler's k_h + k_r random)
  mining_step = make_train_step(graphdef, tx, nc.k_h) if strategy.mined_in_step else None
  return params, opt_state, train_step, mining_step


def make_hard_negatives(config: ml_collections.ConfigDict, schedule: NegativeSchedule,
                        sampler: NegativeSampler, mesh, data: dataset.XCData, dim: int,
                        workdir: str) -> HardNegatives:
  """The refresh manager for the W shards this process holds (each process mines its own)."""
  nc = config.negatives
  local_shards = sharding.local_model_shards(mesh)
  return HardNegatives(
      schedule, workdir if jax.process_count() == 1 else
      os.path.join(workdir, f"process{jax.process_index()}"),
      data.train_labels, dim, nc.index,
      {"num_leaves": nc.scann_leaves, "leaves_to_search": nc.scann_leaves_to_search,
       "reorder": nc.scann_reorder, "rows_per_query": nc.scann_rows_per_query},
      nc.recall_sample, config.train.seed, nc.inject_fault,
      shards=sampler.shard_bounds[local_shards].tolist(), shard_ids=local_shards,
      num_shards=mesh.shape["model"],
      threads=cpu_budget.refresh_threads(nc.refresh_threads, config.train.input_threads))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates and writes the workdir's files (module docstring); returns the
  results.json record. float32 matmuls run at `encoder.matmul_precision` throughout (a
  context, so that it ends with the run: jit keys its compilations on it); the training
  steps under a hang watchdog (`train.hang_timeout_s`, watchdog.py)."""
  config_base.validate(config)
  precision = config.encoder.matmul_precision
  with (jax.default_matmul_precision(None if precision == "default" else precision),
        HangWatchdog(config.train.hang_timeout_s, jax.process_index()) as hang_watchdog):
    return _train_and_evaluate(config, workdir, hang_watchdog)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        hang_watchdog: HangWatchdog) -> dict:
  config = copy.deepcopy(config)  # data preparation fills in derived fields
  claim_workdir(config, workdir)
  t_start = time.time()
  data = prepare_data(config)
  # Periodic evaluations read eval_data: the validation split when there is one.
  eval_data = data
  if config.data.validation_fraction:
    split = validation.carve(data, config.data.validation_fraction, config.data.validation_seed)
    data, eval_data = split.train, split.validation
  seed = config.train.seed
  encoder = build_encoder(config, data.vocab_size, data.pad_id, seed)
  graphdef, enc_params = nnx.split(encoder, nnx.Param)
  d = encoder.cfg.embed_dim
  nc = config.negatives
  strategy = strategies.get(nc.strategy)
  sparse = config.optim.classifier_update == "sparse" and not strategy.dense_update_only
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
  num_devices = mesh.devices.size
  device_check.check_mesh(num_devices)
  if num_devices > 1 and not sparse:
    raise InputError("config.mesh: a multi-device mesh needs optim.classifier_update=sparse "
                     f"and a strategy that is not dense-only ({nc.strategy} is)")
  accum = config.train.grad_accum_steps
  micro_batch = config.train.batch_size // accum
  if config.train.batch_size % accum or micro_batch % num_devices:
    raise InputError(f"config.train.batch_size={config.train.batch_size} must split into "
                     f"grad_accum_steps={accum} micro-batches divisible by the mesh's "
                     f"{num_devices} devices")
  # W's rows padded to a multiple of the model axis; padded rows are never sampled (the
  # sampler draws from each shard's real rows) and never predicted (evaluation reads W[:L]).
  rows = sharding.padded_rows(data.num_labels, mesh)
  embed_fn = make_embed_fn(graphdef)
  w = classifier_init.initial_classifier(
      config, rows, d, seed, data.label_tokens,
      lambda tokens: embed(embed_fn, enc_params, tokens, config.eval.batch_size))
  params = {"encoder": enc_params, "classifier": w}
  schedule = NegativeSchedule.from_config(config)
  if schedule.index_over is IndexOver.LABEL_TEXT and data.label_tokens is None:
    raise InputError(f"config.negatives.strategy={nc.strategy} indexes label-text embeddings, "
                     f"but {data.data_dir} has no label texts")
  sampler = NegativeSampler(
      data.train_labels, nc.k_p, nc.k_h, nc.k_r, mesh.shape["model"],
      per_query_random=nc.random_draws == "per_query",
      all_positives=(max(1, data.train_labels.max_row_length())
                     if strategy.needs_all_positives else 0))
  hard_negatives = make_hard_negatives(config, schedule, sampler, mesh, data, d, workdir)
  batches = TrainBatches(data.train_tokens, sampler, config.train.batch_size, seed,
                         config.train.prefetch, accum,
                         sharding.process_token_rows(mesh, accum, micro_batch),
                         config.train.input_threads)
  steps_per_epoch = batches.steps_per_epoch
  total_steps = steps_per_epoch * config.train.epochs
  params, opt_state, train_step, mining_step = make_steps(config, graphdef, params, mesh,
                                                         total_steps, sparse, steps_per_epoch)

  def fold_classifier():
    """W = scale * V back into V, or every row caught up with its momentum (sparse update
    only); O(L), at epoch ends (the momentum state holds an epoch's steps) and rarely."""
    if sparse and "momentum" in opt_state:
      params["classifier"], opt_state["momentum"] = sparse_momentum.fold(
          params["classifier"], opt_state["momentum"])
    elif sparse:
      params["classifier"], opt_state["scale"] = classifier.fold(params["classifier"],
                                                                 opt_state["scale"])

  # Propensities from the original training rows (label-text rows would add 1 to each n_l).
  inv_prop = metrics.inverse_propensity(data.train_labels.head(data.num_train_original),
                                        config.data.propensity_A, config.data.propensity_B)
  leader = distributed.is_leader()  # writes the run's files; every process logs
  log = TrainLog(os.path.join(workdir, "metrics.jsonl") if leader else os.devnull, config,
                 batches, total_steps)
  n_params = sum(x.size for x in jax.tree.leaves(enc_params))
  logging.info("encoder %s: %d parameters, d=%d; classifier %d x %d; %d steps/epoch x %d epochs",
               encoder.cfg.model_type, n_params, d, data.num_labels, d, steps_per_epoch,
               config.train.epochs)

  base_key = jax.random.key(seed + 2)
  profiler = StepProfiler(graphdef, steps_per_epoch, config.train.epochs,
                          config.train.profile_steps)
  first_step_s = None  # this process's first step: XLA's compilation and one step
  step_times, evals, negatives_per_epoch = [], [], []
  global_step, train_seconds, start_epoch, start_step = 0, 0.0, 0, 0
  degraded = Degraded()

  # Resume: the same command with the same workdir continues from the last checkpoint that
  # restores (damaged ones are set aside).
  ckpt = checkpoint.Checkpoints(workdir, config.checkpoint.keep) if config.checkpoint.enabled else None
  restored = None
  if ckpt is not None:
    restored = ckpt.restore(params, opt_state, accept=lambda progress: (
        hard_negatives.load_state(progress["hard_negatives"],
                                  resumes_at=(progress["epoch"], progress["step"]))))
  if restored is not None:
    params, opt_state, progress = restored
    degraded = Degraded.from_json(progress.get("degraded"))
    degraded.checkpoints_set_aside += len(ckpt.set_aside)
    start_epoch, start_step = progress["epoch"], progress["step"]
    global_step, train_seconds = progress["global_step"], progress["train_seconds"]
    evals, negatives_per_epoch = progress["evals"], progress["negatives_per_epoch"]
    step_times = progress["step_times"]
    profiler.phases = progress.get("phases", profiler.phases)  # (older checkpoints lack it)
    logging.info("resuming at epoch %d step %d (global step %d)", start_epoch, start_step,
                 global_step)
  def skipped_total() -> int:
    """Steps dynamic loss scaling skipped: the optimizer's step counts the applied ones."""
    return global_step - int(opt_state["step"]) if sparse else 0

  if sparse:  # the donated V keeps its buffer, so once covers the run (CPU backend only)
    t = time.time()
    advised = host_memory.back_with_huge_pages(params["classifier"])
    if advised:
      logging.info("classifier: %.2f GB on transparent huge pages (%.1f s)", advised / 1e9,
                   time.time() - t)

  # What a refresh needs from the host, evaluated when called: the label vectors to index
  # (W, or E(z_l) for e_hard) and embeddings of given training rows.
  def vectors_fn():
    """Rows of the shards this process mines for, concatenated (W, or E(z_l) for e_hard)."""
    bounds = hard_negatives.shards
    if schedule.index_over is IndexOver.LABEL_TEXT:
      rows = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
      return embed(embed_fn, host_local(params["encoder"]), data.label_tokens[rows],
                   config.eval.batch_size)
    held = dict(distributed.local_row_shards(params["classifier"]))  # first row -> rows
    return np.concatenate([held[lo][:hi - lo] for lo, hi in bounds])

  def embed_rows(rows):
    order = np.argsort(rows)
    emb = embed(embed_fn, host_local(params["encoder"]), data.train_tokens[rows[order]],
                config.eval.batch_size)
    out = np.empty_like(emb)
    out[order] = emb
    return out

  def save(epoch, step, metrics=None, wait=False):
    """A checkpoint that resumes at (epoch, step); step 0 = before start_epoch(epoch)."""
    progress = {
        "epoch": epoch, "step": step, "global_step": global_step,
        "train_seconds": train_seconds + (time.time() - t_epoch if step else 0.0),
        "evals": evals, "negatives_per_epoch": negatives_per_epoch, "step_times": step_times,
        "phases": profiler.phases,
        "hard_negatives": hard_negatives.state_dict(), "degraded": degraded.to_json()}
    # A copy: the save is asynchronous and the loop goes on appending to these lists.
    ckpt.save(global_step, params, opt_state, json.loads(json.dumps(progress)), metrics)
    if wait:
      ckpt.wait()
    policy.saved()

  stop = checkpoint.StopSignal()
  hard_negatives.stop_requested = lambda: bool(stop.received)
  policy = checkpoint.SavePolicy(stop, config.checkpoint.every_steps,
                                 config.checkpoint.every_minutes, config.train.log_every_steps)
  try:
    for epoch in range(start_epoch, config.train.epochs):
      t_epoch = time.time()
      resumed = epoch == start_epoch and start_step > 0
      if ckpt is not None and epoch in hard_negatives.schedule.refresh_epochs:
        # A refresh deletes the negatives and inputs the previous checkpoint names: the
        # asynchronous save that stops naming them must be on disk first.
        ckpt.wait()
      if hard_negatives.schedule.refresh_collected_in(epoch) is not None:
        # The epoch's query embeddings go to a memory map (and W's snapshot follows).
        faults.require_space(hard_negatives.dir, 4 * d * (data.train_labels.num_rows + rows))
      # Resuming inside an epoch: its negatives are already in place.
      refreshes, pipelined = len(hard_negatives.refreshes), epoch in hard_negatives.pending
      try:
        hard, split = hard_negatives.start_epoch(
            epoch, vectors_fn, embed_rows,
            resumed_rows=batches.rows_before(epoch, start_step) if resumed else None)
      except RefreshInterrupted:  # the checkpoint at (epoch, 0) lists the refresh as pending
        raise _preempted(stop, f"at the start of epoch {epoch} (waiting for its hard-negative "
                         "refresh)", ckpt is not None) from None
      if not resumed:
        note_epoch_start(degraded, hard_negatives, refreshes, epoch, pipelined, split)
        negatives_per_epoch.append({"epoch": epoch, "hard": split["num_hard"],
                                    "random": split["num_random"],
                                    "source": hard_negatives.current_epoch if hard is not None
                                    else None})
      first_step = start_step if resumed else 0
      step_fn = mining_step if mining_step and split["num_hard"] else train_step
      log.start(first_step, skipped_total())
      pending = None  # (rows, device embeddings) of the previous step, fetched one step late
      # At most 2 steps in flight: dispatch stays ahead of the device without the host
      # queueing unboundedly many steps (and their batches) when the input is faster.
      inflight = collections.deque()
      for step, (host_batch, prep_s) in enumerate(
          batches.epoch(epoch, hard, first_step, **split), start=first_step):
        hang_watchdog.kick(f"in epoch {epoch} step {step + 1}")
        key = jax.random.fold_in(base_key, global_step)
        profiling = profiler.wants(global_step)
        t0 = time.perf_counter()
        batch = sharding.shard_batch({k: host_batch[k] for k in _DEVICE_KEYS
                                      if k in host_batch}, mesh)
        if profiling:
          profiler.before_step(t0, prep_s, batch, params["encoder"], params["classifier"],
                               opt_state["scale"] if sparse else jnp.float32(1.0), key)
        params, opt_state, value, pooled = step_fn(params, opt_state, batch, key)
        if first_step_s is None:
          value.block_until_ready()
          first_step_s = round(time.perf_counter() - t0, 3)
          logging.info("first step: %.1f s (XLA compilation included)", first_step_s)
        inflight.append(value)
        if len(inflight) > 2:
          inflight.popleft().block_until_ready()
        if profiling:
          profiler.after_step(value)
        if hard_negatives.collecting:
          if jax.process_count() > 1:  # every process mines for all queries
            hard_negatives.collect(host_batch["rows"], distributed.gather_rows(pooled))
          else:  # fetched one step late, so the copy overlaps the next step
            if pending is not None:
              hard_negatives.collect(pending[0], np.asarray(pending[1]))
            pooled.copy_to_host_async()
            pending = (host_batch["rows"], pooled)
        global_step += 1
        if log.due(step):
          log.report(epoch, step, global_step, float(value), split, skipped_total())
          if sparse and float(opt_state["scale"]) < 1e-2:
            fold_classifier()
        if config.train.stop_after_steps and global_step >= config.train.stop_after_steps:
          stop.received = stop.received or "stop_after_steps"
        due, stop_now = policy.decide(global_step, step)
        last = step + 1 == steps_per_epoch  # the epoch-end save follows
        if ckpt is not None and due and not last:
          if pending is not None:  # everything up to this step is in the memmap
            hard_negatives.collect(pending[0], np.asarray(pending[1]))
            pending = None
          hard_negatives.flush()
          save(epoch, step + 1, wait=stop_now)
        if stop_now and not last:
          raise _preempted(stop, f"at epoch {epoch} step {step + 1}", ckpt is not None)
      hang_watchdog.disarm()  # what follows grows with the data, not a step
      if pending is not None:
        hard_negatives.collect(pending[0], np.asarray(pending[1]))
      fold_classifier()  # from here on params["classifier"] is W itself
      with faults.writing(hard_negatives.dir, 4 * d * (data.train_labels.num_rows + rows)):
        hard_negatives.end_epoch(epoch, vectors_fn, embed_rows)  # the refresh's inputs
      epoch_s = time.time() - t_epoch
      train_seconds += epoch_s
      if not resumed:  # a resumed part of an epoch would add a compilation to fewer steps
        step_times.append(epoch_s / steps_per_epoch)
      every = config.train.eval_every_epochs
      if every and (epoch + 1) % every == 0 and epoch + 1 < config.train.epochs:
        if 0 < config.eval.max_test_rows < eval_data.test_labels.num_rows:
          degraded.note("evals_on_subset", "eval after epoch %d on the first %d of %d test "
                        "rows (eval.max_test_rows)", epoch + 1, config.eval.max_test_rows,
                        eval_data.test_labels.num_rows)
        m = evaluate_model(embed_fn, params, eval_data, config, inv_prop,
                           config.eval.max_test_rows)
        m.update(knn_diagnostic(embed_fn, params, data, eval_data, config))
        evals.append({"epoch": epoch + 1, "train_time_s": round(train_seconds, 2),
                      "split": "validation" if eval_data is not data else "test", **m})
        log.write(kind="eval", **evals[-1])
        logging.info("eval after epoch %d: %s", epoch + 1,
                     ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k.startswith("P@")))
      stop_now = distributed.any_true([bool(stop.received)])[0]
      if ckpt is not None:  # after the last epoch too: a rerun then only evaluates
        fresh = evals and evals[-1]["epoch"] == epoch + 1
        save(epoch + 1, 0, {"P@5": evals[-1]["P@5"]} if fresh and "P@5" in evals[-1] else None,
             wait=stop_now)
      if stop_now and epoch + 1 < config.train.epochs:
        raise _preempted(stop, f"after epoch {epoch}", ckpt is not None)
  finally:
    stop.restore()
    hard_negatives.close()
    if ckpt is not None:
      ckpt.close()

  hard_negatives.finish()
  hang_watchdog.disarm()
  final = final_evaluation(embed_fn, params, data, config, inv_prop, workdir, global_step,
                           ckpt is not None)
  final.update(knn_diagnostic(embed_fn, params, data, data, config))
  with faults.writing(os.path.join(workdir, "model"),
                      sum(x.nbytes for x in jax.tree.leaves(params))):
    save_trained_model(workdir, config, encoder.cfg, params, data, final)
  if eval_data is not data:
    val = evaluate_model(embed_fn, params, eval_data, config, inv_prop)
    val.update(knn_diagnostic(embed_fn, params, data, eval_data, config))
    evals.append({"epoch": config.train.epochs, "train_time_s": round(train_seconds, 2),
                  "split": "validation", **val})
    log.write(kind="eval", **evals[-1])
  evals.append({"epoch": config.train.epochs, "train_time_s": round(train_seconds, 2),
                "split": "test", **final})
  log.write(kind="eval", **evals[-1])
  baseline = popularity_baseline(data, config, inv_prop)
  text_baselines = tfidf_baselines(config) if leader else {}

  breakup = profiler.breakup(step_times, config.train.batch_size)
  if leader:
    write_json(os.path.join(workdir, "time_breakup.json"), breakup)

  results = {
      "data_dir": os.path.abspath(data.data_dir), "strategy": config.negatives.strategy,
      "num_labels": data.num_labels, "num_train": data.num_train_original,
      "num_train_with_label_texts": data.train_labels.num_rows,
      "num_test": data.test_labels.num_rows, "epochs": config.train.epochs,
      "steps": global_step, "train_time_s": round(train_seconds, 2),
      "skipped_steps": skipped_total(), "first_step_s": first_step_s,
      "matmul_precision": config.encoder.matmul_precision,
      "total_time_s": round(time.time() - t_start, 2), "metrics": final, **final,
      "popularity_baseline": baseline, **text_baselines, "evaluations": evals,
      "time_breakup": breakup,
      "negatives": {**hard_negatives.summary(), "per_epoch": negatives_per_epoch},
      "device": str(jax.devices()[0].platform), "num_devices": jax.device_count(),
      "num_processes": jax.process_count(),
      "mesh": dict(mesh.shape), "grad_accum_steps": accum,
      "degraded": degraded.to_json(),
      "encoder": encoder_source.identity(config.encoder, n_params)._asdict(),
      "config": json.loads(config.to_json()),
  }
  if leader:
    write_json(os.path.join(workdir, "results.json"), results)
  final_eval.clear(workdir)
  return results


def write_json(path: str, record: dict) -> None:
  """Atomically; a disk error raises faults.DiskFull naming `path`."""
  text = json.dumps(record, indent=1)
  with faults.writing(path, len(text)), xc_format.atomic_text_writer(path) as f:
    f.write(text)

