"""train_and_evaluate(config, workdir): data -> encoder + classifier -> train -> evaluate.

The train step is one jitted pure function of (params, opt_state, batch, key) with params
and optimizer state donated. Outputs in the workdir: results.json, time_breakup.json,
metrics.jsonl (one JSON object per log line / evaluation).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from astra_jax import config_base, loss, metrics, optim, predict, sharding, sparse_sgd
from astra_jax.data import dataset, synthetic, xc_format
from astra_jax.data.pipeline import TrainBatches
from astra_jax.errors import InputError
from astra_jax.export import save_trained_model
from astra_jax.model import pretrained
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.model.weights import load_hf_weights
from astra_jax.negatives.manager import HardNegatives
from astra_jax.negatives.schedule import NegativeSchedule
from astra_jax.sampler import NegativeSampler

_DEVICE_KEYS = ("input_ids", "pos_ids", "pos_mask", "hard_ids", "hard_mask", "rand_ids",
                "rand_mask", "rand_weight")


# ------------------------------------------------------------------------------- data
def prepare_data(config: ml_collections.ConfigDict) -> dataset.XCData:
  """Generates the synthetic dataset when asked (cached by its spec), then loads."""
  dc = config.data
  if dc.synthetic.enabled:
    s = dc.synthetic
    spec = synthetic.SyntheticSpec(
        num_labels=s.num_labels, num_train=s.num_train, num_test=s.num_test,
        group_size=s.group_size, vocab_size=s.vocab_size, zipf_exponent=s.zipf_exponent,
        mean_labels=s.mean_labels, max_labels=s.max_labels, same_group_prob=s.same_group_prob,
        own_word_prob=s.own_word_prob, noise_words=s.noise_words, seed=s.seed)
    stats_path = os.path.join(dc.dir, "synthetic.json")
    have = None
    if os.path.exists(stats_path):
      with open(stats_path) as f:
        have = json.load(f).get("spec")
    if have != dataclasses.asdict(spec):
      logging.info("generating synthetic dataset into %s", dc.dir)
      synthetic.generate(dc.dir, spec)
    with dc.unlocked():
      if not dc.tokenizer_dir:
        dc.tokenizer_dir = os.path.join(dc.dir, "tokenizer")
  with dc.unlocked():
    dc.tokenizer_dir = pretrained.resolve(dc.tokenizer_dir)
  return dataset.load(dc)


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
  weights = os.path.join(hf_dir, "model.safetensors") if hf_dir else ""
  if weights and ec.load_weights and os.path.exists(weights):
    load_hf_weights(model, weights)
    logging.info("loaded encoder weights from %s", weights)
  elif hf_dir:
    logging.warning("no weights at %s: encoder randomly initialised", weights)
  return model


# ------------------------------------------------------------------------------- steps
def mine_in_step(emb: jax.Array, w: jax.Array, batch: dict, k: int) -> dict:
  """The `uptodate` oracle: each query's k top-scoring non-positive labels under the current
  W and E(x), exact over all L (O(B L) per step: small L only)."""
  scores = jax.lax.stop_gradient(emb @ w.T)
  rows = jnp.arange(emb.shape[0])[:, None]
  pos = jnp.where(batch["pos_mask"], batch["pos_ids"], w.shape[0])  # masked -> out of range
  scores = scores.at[rows, pos].set(-jnp.inf, mode="drop")
  _, hard = jax.lax.top_k(scores, k)
  hit = (batch["rand_ids"][None, :, None] == hard[:, None, :]).any(-1)
  return dict(batch, hard_ids=hard.astype(jnp.int32), hard_mask=jnp.ones_like(hard, bool),
              rand_mask=batch["rand_mask"] & ~hit)


def encode(graphdef, enc_params, ids: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Training-mode E(x): (after the embedding dropout, before it). The pre-dropout
  embeddings are what the hard-negative refresh collects."""
  encoder = nnx.merge(graphdef, enc_params)
  pooled = encoder.pooled(ids, dropout_key=key)
  return encoder.embedding_dropout(pooled, key), pooled


def make_train_step(graphdef, tx: optax.GradientTransformation, uptodate_k: int = 0,
                    full_block: int = 0):
  """One jitted step. Returns (params, opt_state, loss, E(x) before embedding dropout); the
  embeddings feed the hard-negative refresh at no extra forward pass. full_block > 0: the
  full-L BCE baseline (all labels, in blocks of that many) instead of the estimator."""

  def loss_fn(params, batch, key):
    emb, pooled = encode(graphdef, params["encoder"], batch["input_ids"], key)
    if full_block:
      return loss.full_bce_chunked(emb, params["classifier"], batch["pos_ids"],
                                   batch["pos_mask"], full_block), pooled
    if uptodate_k:
      batch = mine_in_step(pooled, params["classifier"], batch, uptodate_k)
    return loss.sampled_bce(emb, params["classifier"], batch), pooled

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, key):
    (value, pooled), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value, pooled

  return train_step


def make_sparse_train_step(graphdef, tx_encoder: optax.GradientTransformation, lr_schedule,
                           weight_decay: float):
  """The same step with the classifier updated in O(rows touched): gradients are taken
  w.r.t. the gathered rows of W = scale * V, never w.r.t. the (L, d) matrix, and applied by
  `sparse_sgd.sgd_update` into the donated V. opt_state: {"encoder", "scale", "step"}."""

  def loss_fn(enc_params, rows, batch, key):
    emb, pooled = encode(graphdef, enc_params, batch["input_ids"], key)
    return loss.batch_loss(loss.scores_from_rows(emb, *rows), batch), pooled

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, key):
    v, scale = params["classifier"], opt_state["scale"]
    ids = (batch["pos_ids"], batch["hard_ids"], batch["rand_ids"])
    rows = tuple(scale * v[i].astype(jnp.float32) for i in ids)
    (value, pooled), (g_enc, g_rows) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
        params["encoder"], rows, batch, key)
    updates, enc_state = tx_encoder.update(g_enc, opt_state["encoder"], params["encoder"])
    v, scale = sparse_sgd.sgd_update(
        v, scale, jnp.concatenate([i.reshape(-1) for i in ids]),
        jnp.concatenate([g.reshape(-1, g.shape[-1]) for g in g_rows]),
        lr_schedule(opt_state["step"]), weight_decay)
    return ({"encoder": optax.apply_updates(params["encoder"], updates), "classifier": v},
            {"encoder": enc_state, "scale": scale, "step": opt_state["step"] + 1}, value, pooled)

  return train_step


def make_sharded_train_step(graphdef, tx_encoder: optax.GradientTransformation, lr_schedule,
                            weight_decay: float, mesh, global_batch: int):
  """The sparse step on a (data, model) mesh: the encoder runs data-parallel under jit's
  automatic partitioning, the classifier through `sharding.classifier_kernel`; the encoder's
  gradient is the VJP of its forward pass with the kernel's dloss/dE(x)."""
  kernel = sharding.classifier_kernel(mesh, global_batch, weight_decay)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, key):
    emb, enc_vjp, pooled = jax.vjp(lambda p: encode(graphdef, p, batch["input_ids"], key),
                                   params["encoder"], has_aux=True)
    labels = {k: v for k, v in batch.items() if k != "input_ids"}
    value, d_emb, v, scale = kernel(emb, params["classifier"], opt_state["scale"], labels,
                                    lr_schedule(opt_state["step"]))
    (g_enc,) = enc_vjp(d_emb)
    updates, enc_state = tx_encoder.update(g_enc, opt_state["encoder"], params["encoder"])
    return ({"encoder": optax.apply_updates(params["encoder"], updates), "classifier": v},
            {"encoder": enc_state, "scale": scale, "step": opt_state["step"] + 1}, value, pooled)

  return train_step


def init_sparse_opt_state(tx_encoder: optax.GradientTransformation, params) -> dict:
  return {"encoder": tx_encoder.init(params["encoder"]), "scale": jnp.float32(1.0),
          "step": jnp.int32(0)}


def make_phase_fns(graphdef):
  """Separately compiled pieces of the step, timed for the iteration-time break-up."""
  enc_fwd = jax.jit(lambda p, ids, key: nnx.merge(graphdef, p)(ids, dropout_key=key))
  clf_fwd = jax.jit(loss.classifier_scores)
  loss_fn = jax.jit(loss.batch_loss)
  return enc_fwd, clf_fwd, loss_fn


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
def evaluate_model(embed_fn, params, data: dataset.XCData, config, inv_prop,
                   max_rows: int = 0) -> dict[str, float]:
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


# ------------------------------------------------------------------------------- loop
class _JsonLines:

  def __init__(self, path: str):
    self.f = open(path, "a")

  def write(self, **record):
    self.f.write(json.dumps(record) + "\n")
    self.f.flush()


def _median_ms(xs):
  return round(1000 * statistics.median(xs), 3) if xs else None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  config_base.validate(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.time()
  data = prepare_data(config)
  seed = config.train.seed
  encoder = build_encoder(config, data.vocab_size, data.pad_id, seed)
  graphdef, enc_params = nnx.split(encoder, nnx.Param)
  d = encoder.cfg.embed_dim
  nc = config.negatives
  mesh = None
  if config.mesh.data * config.mesh.model != 1:
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
    if config.optim.classifier_update != "sparse" or nc.strategy in ("uptodate", "full"):
      raise InputError("config.mesh: a multi-device mesh needs optim.classifier_update=sparse "
                       "and a strategy other than uptodate or full")
    if config.train.batch_size % mesh.shape["data"]:
      raise InputError(f"config.train.batch_size={config.train.batch_size} is not divisible by "
                       f"the mesh's data axis ({mesh.shape['data']})")
  # W's rows padded to a multiple of the model axis; padded rows are never sampled (the
  # sampler draws from [0, L)) and never predicted (evaluation reads W[:L]).
  rows = sharding.padded_rows(data.num_labels, mesh) if mesh else data.num_labels
  w = config.train.classifier_init_std * jax.random.normal(
      jax.random.key(seed + 1), (rows, d), jnp.float32)
  params = {"encoder": enc_params, "classifier": w}
  schedule = NegativeSchedule(nc.strategy, nc.k_h, nc.k_r, nc.tau_s, nc.tau_r,
                              config.train.epochs, nc.curriculum_final_hard_fraction)
  if schedule.uses_index and schedule.index_over == "E" and data.label_tokens is None:
    raise InputError(f"config.negatives.strategy={nc.strategy} indexes label-text embeddings, "
                     f"but {data.data_dir} has no label texts")
  hard_negatives = HardNegatives(
      schedule, workdir, data.train_labels, encoder.cfg.embed_dim, nc.index,
      {"num_leaves": nc.scann_leaves, "leaves_to_search": nc.scann_leaves_to_search,
       "reorder": nc.scann_reorder}, nc.recall_sample, seed, nc.inject_fault)
  sampler = NegativeSampler(data.train_labels, nc.k_p, nc.k_h, nc.k_r)
  batches = TrainBatches(data.train_tokens, sampler, config.train.batch_size, seed,
                         config.train.prefetch)
  steps_per_epoch = batches.steps_per_epoch
  total_steps = steps_per_epoch * config.train.epochs
  # The sparse O(touched rows) classifier update, except for the uptodate oracle (which
  # scores all L labels every step anyway) or when asked for the dense optax chain.
  sparse = config.optim.classifier_update == "sparse" and nc.strategy not in ("uptodate", "full")
  if sparse:
    tx = optim.encoder_optimizer(config.optim, total_steps)
    opt_state = init_sparse_opt_state(tx, params)
    lr_c = optim.classifier_schedule(config.optim, total_steps)
    if mesh is not None:
      params, opt_state = sharding.shard_params(params, opt_state, mesh)
      train_step = make_sharded_train_step(graphdef, tx, lr_c, config.optim.classifier_weight_decay,
                                           mesh, config.train.batch_size)
    else:
      train_step = make_sparse_train_step(graphdef, tx, lr_c, config.optim.classifier_weight_decay)
  else:
    tx = optim.make_optimizer(config.optim, total_steps)
    opt_state = tx.init(params)
    train_step = make_train_step(graphdef, tx, nc.k_h if nc.strategy == "uptodate" else 0,
                                 config.train.full_label_block if nc.strategy == "full" else 0)

  def fold_classifier():
    """W = scale * V back into V (sparse update only); O(L), at epoch ends and rarely."""
    if sparse:
      params["classifier"], opt_state["scale"] = sparse_sgd.fold(params["classifier"],
                                                                 opt_state["scale"])

  embed_fn = make_embed_fn(graphdef)
  enc_fwd, clf_fwd, loss_only = make_phase_fns(graphdef)
  # Propensities from the original training rows (label-text rows would add 1 to each n_l).
  inv_prop = metrics.inverse_propensity(data.train_labels.head(data.num_train_original),
                                        config.data.propensity_A, config.data.propensity_B)
  log = _JsonLines(os.path.join(workdir, "metrics.jsonl"))
  n_params = sum(x.size for x in jax.tree.leaves(enc_params))
  logging.info("encoder %s: %d parameters, d=%d; classifier %d x %d; %d steps/epoch x %d epochs",
               encoder.cfg.model_type, n_params, d, data.num_labels, d, steps_per_epoch,
               config.train.epochs)

  base_key = jax.random.key(seed + 2)
  phases = {k: [] for k in ("data_prep", "host_to_device", "encoder_forward",
                            "classifier_forward", "loss", "step")}
  step_times, evals, negatives_per_epoch = [], [], []
  # Profile warm steps (second epoch when there is one): compile time and first-touch
  # effects stay out of the break-up.
  first = steps_per_epoch + 2 if config.train.epochs > 1 else min(3, steps_per_epoch - 1)
  profile_at = set(range(first, first + config.train.profile_steps))
  global_step, train_seconds = 0, 0.0

  # What a refresh needs from the host, evaluated when called: the label vectors to index
  # (W, or E(z_l) for e_hard) and embeddings of given training rows.
  def vectors_fn():
    if schedule.index_over == "E":
      return embed(embed_fn, params["encoder"], data.label_tokens, config.eval.batch_size)
    return np.asarray(params["classifier"])[:data.num_labels]

  def embed_rows(rows):
    order = np.argsort(rows)
    emb = embed(embed_fn, params["encoder"], data.train_tokens[rows[order]],
                config.eval.batch_size)
    out = np.empty_like(emb)
    out[order] = emb
    return out

  try:
    for epoch in range(config.train.epochs):
      t_epoch = time.time()
      hard, n_hard, n_random = hard_negatives.start_epoch(epoch, vectors_fn, embed_rows)
      negatives_per_epoch.append({"epoch": epoch, "hard": n_hard, "random": n_random,
                                  "source": hard_negatives.current_epoch if hard is not None
                                  else None})
      window_n, t_window = 0, time.time()
      pending = None  # (rows, device embeddings) of the previous step, fetched one step late
      for step, (host_batch, prep_s) in enumerate(batches.epoch(epoch, hard, 0, n_random)):
        key = jax.random.fold_in(base_key, global_step)
        profiling = global_step in profile_at
        t0 = time.perf_counter()
        batch = {k: host_batch[k] for k in _DEVICE_KEYS}
        batch = sharding.shard_batch(batch, mesh) if mesh else jax.device_put(batch)
        if profiling:
          jax.block_until_ready(batch)
          t1 = time.perf_counter()
          emb = jax.block_until_ready(enc_fwd(params["encoder"], batch["input_ids"], key))
          t2 = time.perf_counter()
          scores = jax.block_until_ready(clf_fwd(emb, params["classifier"], batch))
          t3 = time.perf_counter()
          jax.block_until_ready(loss_only(scores, batch))
          t4 = time.perf_counter()
        params, opt_state, value, pooled = train_step(params, opt_state, batch, key)
        if profiling:
          value.block_until_ready()
          t5 = time.perf_counter()
          for name, dt in (("data_prep", prep_s), ("host_to_device", t1 - t0),
                           ("encoder_forward", t2 - t1), ("classifier_forward", t3 - t2),
                           ("loss", t4 - t3), ("step", t5 - t4)):
            phases[name].append(dt)
        if hard_negatives.collecting:
          if pending is not None:
            hard_negatives.collect(pending[0], np.asarray(pending[1]))
          pooled.copy_to_host_async()
          pending = (host_batch["rows"], pooled)
        global_step += 1
        if (step + 1) % config.train.log_every_steps == 0 or step + 1 == steps_per_epoch:
          value = float(value)
          dt = time.time() - t_window
          n_steps = step + 1 - window_n
          qps = n_steps * config.train.batch_size / max(dt, 1e-9)
          eta = (total_steps - global_step) * dt / max(n_steps, 1)
          lr_e, lr_c = optim.learning_rates(config.optim, total_steps, global_step)
          logging.info("epoch %d step %d/%d loss %.4f | %.0f queries/s | lr %.2e/%.2e | "
                       "negatives %d hard + %d random | ETA %s", epoch, step + 1,
                       steps_per_epoch, value, qps, lr_e, lr_c, n_hard, n_random,
                       time.strftime("%H:%M:%S", time.gmtime(eta)))
          if not np.isfinite(value):
            raise FloatingPointError(f"loss is {value} at epoch {epoch} step {step + 1}")
          log.write(kind="train", epoch=epoch, step=global_step, loss=value, queries_per_s=qps)
          window_n, t_window = step + 1, time.time()
          if sparse and float(opt_state["scale"]) < 1e-2:
            fold_classifier()
      if pending is not None:
        hard_negatives.collect(pending[0], np.asarray(pending[1]))
      fold_classifier()  # from here on params["classifier"] is W itself
      hard_negatives.end_epoch(epoch, vectors_fn, embed_rows)
      epoch_s = time.time() - t_epoch
      train_seconds += epoch_s
      step_times.append(epoch_s / steps_per_epoch)
      every = config.train.eval_every_epochs
      if every and (epoch + 1) % every == 0 and epoch + 1 < config.train.epochs:
        m = evaluate_model(embed_fn, params, data, config, inv_prop, config.eval.max_test_rows)
        evals.append({"epoch": epoch + 1, "train_time_s": round(train_seconds, 2), **m})
        log.write(kind="eval", **evals[-1])
        logging.info("eval after epoch %d: %s", epoch + 1,
                     ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k.startswith("P@")))
  finally:
    hard_negatives.close()

  final = evaluate_model(embed_fn, params, data, config, inv_prop)
  save_trained_model(workdir, config, encoder.cfg, params, data, final)
  evals.append({"epoch": config.train.epochs, "train_time_s": round(train_seconds, 2), **final})
  log.write(kind="eval", **evals[-1])
  baseline = popularity_baseline(data, config, inv_prop)

  breakup = {k: _median_ms(v) for k, v in phases.items()}
  if breakup["step"] is not None:
    fwd = sum(breakup[k] for k in ("encoder_forward", "classifier_forward", "loss"))
    breakup["backward_update"] = round(max(breakup["step"] - fwd, 0.0), 3)
  breakup = {"unit": "ms (median over profiled steps)", "steps_profiled": len(phases["step"]),
             "batch_size": config.train.batch_size, **breakup,
             "mean_step_wall_ms": round(1000 * statistics.median(step_times), 3),
             "note": "step = the fused forward+backward+update actually used; backward_update ="
                     " step - (encoder_forward + classifier_forward + loss)"}
  with xc_format.atomic_text_writer(os.path.join(workdir, "time_breakup.json")) as f:
    json.dump(breakup, f, indent=1)

  results = {
      "data_dir": os.path.abspath(data.data_dir), "strategy": config.negatives.strategy,
      "num_labels": data.num_labels, "num_train": data.num_train_original,
      "num_train_with_label_texts": data.train_labels.num_rows,
      "num_test": data.test_labels.num_rows, "epochs": config.train.epochs,
      "steps": global_step, "train_time_s": round(train_seconds, 2),
      "total_time_s": round(time.time() - t_start, 2), "metrics": final, **final,
      "popularity_baseline": baseline, "evaluations": evals, "time_breakup": breakup,
      "negatives": {**hard_negatives.summary(), "per_epoch": negatives_per_epoch},
      "device": str(jax.devices()[0].platform), "num_devices": jax.device_count(),
      "mesh": dict(mesh.shape) if mesh else {"data": 1, "model": 1},
      "config": json.loads(config.to_json()),
  }
  with xc_format.atomic_text_writer(os.path.join(workdir, "results.json")) as f:
    json.dump(results, f, indent=1)
  return results
