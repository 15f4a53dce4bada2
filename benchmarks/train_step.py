r"""Whole ASTRA train-step throughput, as a share of the machine's dense matmul rate.

  python benchmarks/train_step.py --out=train_step.jsonl [--dtype=float32|bfloat16|float16]

Parts (--parts), all in this one run: after 2 warm-up steps each, --steps rounds in which
every part runs one step and the matmul is timed once, so that all parts see the same
machine load (medians over the rounds; the ratios are what to compare on a shared machine):
  matmul      a dense 2048 x 2048 x 2048 product (--matmul_n) in the compute dtype under
              jit: the machine's reference rate for this run
  encoder     the encoder alone: forward + backward (w.r.t. its parameters, dropout on) +
              AdamW, with a fixed cotangent on E(x) standing in for the loss
  astra_d384  the trainer's own step (`steps.make_sparse_train_step`, 1 x 1 mesh): encoder
              as above, classifier gather + estimator + sparse SGD update of W (L x 384)
  astra_d64   the same with the bottleneck d = 64 (the paper's setting for L >= 1e6)
  pipeline    the real input pipeline (`training.pipeline.TrainBatches` + `NegativeSampler`) feeding
              the astra_d64 step: the share of step time the step waits for a batch

Encoder: the all-MiniLM-L6-v2 shape (6 layers, hidden 384, 12 heads, FFN 1536, vocab
30522), batch 256 x 32 tokens, random weights (no model hub is needed for timing).

Model FLOPs per step (`EncoderConfig.train_step_gflop` plus the classifier; matmuls only;
layer norms, softmax, GELU, embedding scatter, dropout and the optimizer are not counted),
with n = B*T tokens, h hidden, I FFN width, l layers:
  forward  = l * (2*n*4*h*h + 2*n*2*h*I + 2*2*B*T*T*h)   [Q,K,V,O; FFN in/out; QK^T and PV]
           + 2*B*h*d                                        [bottleneck, when d != h]
           + 2*B*(k_p + k_h)*d + 2*B*k_r*d                  [classifier scores, astra only]
  step     = 3 * forward                                    [backward = 2 x forward]
One JSON line per part: part, step_ms, model_gflop, gflops, share_of_matmul (the part's
GFLOP/s over the matmul's in this run), over_encoder (step time / encoder step time - 1),
device, dtype and the shapes; pipeline adds wait_ms / wait_share (time the step loop
blocked on the prefetch queue, per step / of wall time) and prepare_ms (the host thread's
time to build one batch, overlapped with the step).
"""

from __future__ import annotations

import collections
import functools
import statistics
import time

from astra_jax.runtime import host_memory

host_memory.keep_freed_memory()  # as main.py does; before jax starts threads

import jax  # noqa: E402
import jax.numpy as jnp
import jsonl  # benchmarks/jsonl.py
import numpy as np
import optax
from absl import app, flags
from flax import nnx

from astra_jax.config import base as config_base
from astra_jax.data.batch import LabelBatch, TrainBatch
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.parallel import sharding
from astra_jax.training import optim, steps

flags.DEFINE_list(
  "parts", ["matmul", "encoder", "astra_d384", "astra_d64", "pipeline"], "what to time"
)
flags.DEFINE_string("dtype", "float32", "encoder compute dtype: float32 | bfloat16 | float16")
flags.DEFINE_integer("batch_size", 256, "queries per step")
flags.DEFINE_integer("seq_len", 32, "tokens per query")
flags.DEFINE_integer("num_labels", 1_000_000, "L for the astra parts")
flags.DEFINE_integer("num_layers", 6, "encoder layers (6 = MiniLM-L6)")
flags.DEFINE_integer("k_p", 7, "positives per query")
flags.DEFINE_integer("k_h", 50, "hard negatives per query")
flags.DEFINE_integer("k_r", 400, "uniform random negatives per query")
flags.DEFINE_enum(
  "random_draws",
  "per_query",
  ["per_query", "shared"],
  "random negatives drawn per query (the trainer's default) or once per batch",
)
flags.DEFINE_integer("matmul_n", 2048, "matmul size")
flags.DEFINE_integer("steps", 10, "timed steps per part")
flags.DEFINE_string("out", None, "append JSON lines here")
F = flags.FLAGS


def encoder_config(bottleneck: int = 0) -> EncoderConfig:
  return EncoderConfig(num_layers=F.num_layers, bottleneck_dim=bottleneck, dtype=F.dtype)


def model_gflop(cfg: EncoderConfig, classifier: bool) -> float:
  """The formula of the module docstring, in GFLOP per step."""
  gflop = cfg.train_step_gflop(F.batch_size, F.seq_len)
  if classifier:
    b, d = F.batch_size, cfg.embed_dim
    gflop += 3 * (2 * b * (F.k_p + F.k_h) * d + 2 * b * F.k_r * d) / 1e9
  return gflop


def timed_ms(fn) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return 1000 * (time.perf_counter() - t0)


def median_ms(fn, steps: int) -> float:
  for _ in range(2):
    fn()
  return statistics.median(timed_ms(fn) for _ in range(steps))


def matmul() -> tuple:
  """(one n^3 product per call, its GFLOP)."""
  n = F.matmul_n
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(F.dtype))
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(F.dtype))
  f = jax.jit(lambda a, b: a @ b)
  return (lambda: f(a, b)), 2 * n**3 / 1e9


def tokens(rng: np.random.Generator, vocab: int) -> np.ndarray:
  """Token ids with a realistic pad tail (lengths uniform in [T/4, T])."""
  b, t = F.batch_size, F.seq_len
  ids = rng.integers(1000, vocab, (b, t), dtype=np.int32)
  lengths = rng.integers(t // 4, t + 1, b)
  ids[np.arange(t)[None, :] >= lengths[:, None]] = 0
  return ids


def encoder_step(cfg: EncoderConfig):
  """One encoder-alone step per call (state threaded through donated buffers)."""
  graphdef, params = nnx.split(Encoder(cfg, nnx.Rngs(0)))
  tx = optim.encoder_optimizer(config_base.base_config().optim, 1000)
  opt_state = tx.init(params)
  ids = jnp.asarray(tokens(np.random.default_rng(0), cfg.vocab_size))
  cotangent = jnp.full((F.batch_size, cfg.embed_dim), 1.0 / F.batch_size, jnp.float32)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, ids, key):
    emb, vjp, _ = jax.vjp(lambda p: steps.encode(graphdef, p, ids, key), params, has_aux=True)
    (g,) = vjp(cotangent.astype(emb.dtype))
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  state = [params, opt_state]

  def run():
    state[0], state[1] = step(state[0], state[1], ids, jax.random.key(1))
    return state[0]

  return run


def label_batch(rng: np.random.Generator, L: int) -> LabelBatch:
  b = F.batch_size
  return LabelBatch(
    pos_ids=rng.integers(0, L, (1, b, F.k_p)).astype(np.int32),
    pos_mask=np.ones((1, b, F.k_p), bool),
    hard_ids=rng.integers(0, L, (1, b, F.k_h)).astype(np.int32),
    hard_mask=np.ones((1, b, F.k_h), bool),
    rand_ids=rng.integers(
      0, L, (1, b, F.k_r) if F.random_draws == "per_query" else (1, F.k_r)
    ).astype(np.int32),
    rand_mask=np.ones((1, b, F.k_r), bool),
    rand_weight=np.full((1, F.k_r), L / F.k_r, np.float32),
  )


def astra_setup(cfg: EncoderConfig):
  graphdef, enc_params = nnx.split(Encoder(cfg, nnx.Rngs(0)))
  oc = config_base.base_config().optim
  tx = optim.encoder_optimizer(oc, 1000)
  mesh = sharding.make_mesh(1, 1)
  L = F.num_labels
  w = 0.02 * jax.random.normal(jax.random.key(2), (L, cfg.embed_dim), jnp.float32)
  params = {"encoder": enc_params, "classifier": w}
  scaling = "dynamic" if F.dtype == "float16" else "off"
  state = steps.shard_state(
    steps.init_sparse_state(tx, params, 2.0**15 if scaling == "dynamic" else 1.0), mesh
  )
  step = steps.make_sparse_train_step(
    graphdef,
    tx,
    optim.classifier_schedule(oc, 1000),
    oc.classifier_weight_decay,
    mesh,
    F.batch_size,
    scaling,
  )
  return mesh, state, step


def astra_step(cfg: EncoderConfig):
  """One trainer step per call, cycling through 4 batches."""
  mesh, train_state, step = astra_setup(cfg)
  rng = np.random.default_rng(0)
  batches = []
  for _ in range(4):
    b = TrainBatch(tokens(rng, cfg.vocab_size)[None], label_batch(rng, F.num_labels))
    batches.append(sharding.shard_batch(b, mesh))
  state = [train_state, 0]

  def run():
    i = state[1]
    state[0], value, _ = step(state[0], batches[i % 4], jax.random.key(i))
    state[1] = i + 1
    return value

  return run


def pipeline_wait(cfg: EncoderConfig) -> dict:
  """The astra_d64 step fed by the real input pipeline: seconds waiting on the prefetch
  queue (TrainBatches.wait_seconds) against wall time."""
  from astra_jax.data.sparse_rows import SparseRows
  from astra_jax.negatives.sampler import NegativeSampler
  from astra_jax.training.pipeline import TrainBatches

  mesh, state, step = astra_setup(cfg)
  rng = np.random.default_rng(0)
  n = F.batch_size * (F.steps + 3)
  L = F.num_labels
  counts = rng.integers(1, 2 * F.k_p, n)
  indices = np.concatenate([rng.choice(L, c, replace=False) for c in counts]).astype(np.int32)
  labels = SparseRows(
    np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
    indices,
    np.ones(len(indices), np.float32),
    L,
  )
  tok = np.concatenate([tokens(rng, cfg.vocab_size) for _ in range(F.steps + 3)])
  hard = rng.integers(0, L, (n, F.k_h)).astype(np.int32)
  sampler = NegativeSampler(
    labels, F.k_p, F.k_h, F.k_r, per_query_random=F.random_draws == "per_query"
  )
  batches = TrainBatches(tok, sampler, F.batch_size, 0)
  waits, n_steps, t_start, prep = 0.0, 0, None, []
  inflight = collections.deque()
  for i, (host, prep_s) in enumerate(batches.epoch(0, hard)):
    if i == 2:  # after compilation and a warm step
      jax.block_until_ready(state)
      inflight.clear()
      t_start, waits = time.perf_counter(), batches.wait_seconds
    batch = sharding.shard_batch(host.batch, mesh)
    state, value, _ = step(state, batch, jax.random.key(i))
    # As the trainer does: at most 2 steps in flight, so a wait on the queue is time the
    # device would idle, not the host running ahead.
    inflight.append(value)
    if len(inflight) > 2:
      inflight.popleft().block_until_ready()
    n_steps += i >= 2
    prep.append(prep_s)
  jax.block_until_ready(state)
  wall = time.perf_counter() - t_start
  waits = batches.wait_seconds - waits
  return {
    "step_ms": 1000 * wall / n_steps,
    "wait_ms": 1000 * waits / n_steps,
    "wait_share": waits / wall,
    "prepare_ms": 1000 * statistics.median(prep),
  }


def main(_):
  base = {
    "device": jax.devices()[0].device_kind,
    "platform": jax.devices()[0].platform,
    "dtype": F.dtype,
    "batch_size": F.batch_size,
    "seq_len": F.seq_len,
    "num_layers": F.num_layers,
    "jax": jax.__version__,
  }
  rows, runs = {}, {}
  for part in F.parts:
    if part in ("matmul", "pipeline"):
      continue
    if part == "encoder":
      cfg = encoder_config()
      runs[part] = encoder_step(cfg)
      rows[part] = {"part": part, "model_gflop": model_gflop(cfg, classifier=False)}
    elif part in ("astra_d384", "astra_d64"):
      cfg = encoder_config(0 if part == "astra_d384" else 64)
      runs[part] = astra_step(cfg)
      rows[part] = {
        "part": part,
        "num_labels": F.num_labels,
        "d": cfg.embed_dim,
        "k_p": F.k_p,
        "k_h": F.k_h,
        "k_r": F.k_r,
        "model_gflop": model_gflop(cfg, classifier=True),
      }
    else:
      raise app.UsageError(f"unknown part {part!r}")
  for run in runs.values():  # compile and warm up
    for _ in range(2):
      jax.block_until_ready(run())
  # Round robin: step i of every part (and a matmul) runs under the same machine load, so
  # the ratios between parts hold on a noisy shared machine; medians over the rounds.
  mm_run, mm_gflop = matmul()
  mm_samples, times = [], {part: [] for part in runs}
  for _ in range(F.steps):
    mm_samples.append(median_ms(mm_run, 10))
    for part, run in runs.items():
      times[part].append(timed_ms(run))
  mm_ms = statistics.median(mm_samples)
  mm_rate = mm_gflop / mm_ms * 1e3
  for part in runs:
    rows[part]["step_ms"] = statistics.median(times[part])
    rows[part]["step_ms_samples"] = [round(t, 1) for t in times[part]]
  runs.clear()
  if "pipeline" in F.parts:
    p = pipeline_wait(encoder_config(64))
    rows["pipeline"] = {
      "part": "pipeline",
      "num_labels": F.num_labels,
      "d": 64,
      "model_gflop": model_gflop(encoder_config(64), classifier=True),
      **p,
    }
  out = []
  if "matmul" in F.parts:
    out.append(
      {
        "part": "matmul",
        "step_ms": mm_ms,
        "model_gflop": mm_gflop,
        "n": F.matmul_n,
        "gflops_samples": [round(mm_gflop / m * 1e3, 1) for m in mm_samples],
      }
    )
  out += [rows[p] for p in F.parts if p in rows]
  enc = rows.get("encoder", {}).get("step_ms")
  for row in out:
    row["gflops"] = row["model_gflop"] / row["step_ms"] * 1e3
    row["share_of_matmul"] = row["gflops"] / mm_rate
    if enc and row["part"] not in ("matmul", "encoder"):
      row["over_encoder"] = row["step_ms"] / enc - 1
    row.update(base)
    jsonl.emit(row, F.out, digits=4)


if __name__ == "__main__":
  app.run(main)
