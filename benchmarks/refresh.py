r"""Cost of one hard-negative refresh, and what it does to training throughput.

  python benchmarks/refresh.py --out=refresh.jsonl [--num_labels=100000,1000000]

For each L: label vectors shaped like trained classifier rows (groups of confusable labels
around shared centres, d=64) and 100k training queries near their positives' rows. Runs the
refresh job exactly as training does (worker process, ScaNN with default knobs, k_h=50),
and measures the demo model's train-step throughput outside a refresh and while one runs.
One JSON line per L: num_labels, num_queries, build_s, search_s, recall,
steps_per_s_idle, steps_per_s_during_refresh.
"""

import os
import tempfile
import time

import jax
import jax.numpy as jnp
import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags
from flax import nnx

from astra_jax.config.base import base_config
from astra_jax.data.batch import LabelBatch, TrainBatch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.negatives.refresh import RefreshJob, RefreshWorker, save_labels
from astra_jax.parallel import sharding
from astra_jax.training import optim
from astra_jax.training.steps import init_sparse_state, make_sparse_train_step, shard_state

flags.DEFINE_list("num_labels", ["100000", "1000000"], "label counts")
flags.DEFINE_integer("num_queries", 100_000, "training queries mined per refresh")
flags.DEFINE_integer("k_h", 50, "hard negatives per query")
flags.DEFINE_string("backend", "scann", "index backend")
flags.DEFINE_string("out", None, "append JSON lines here")


def label_vectors(L, d, rng):
  centres = rng.normal(size=(max(L // 8, 1), d)).astype(np.float32)
  return centres[np.arange(L) // 8] + 0.5 * rng.normal(size=(L, d)).astype(np.float32)


def step_throughput(step, state, batch, seconds, stop=None):
  """Steps per second over `seconds` (or until stop() is true)."""
  n, t0 = 0, time.time()
  while time.time() - t0 < seconds and not (stop and stop()):
    state, loss, _ = step(state, batch, jax.random.key(n))
    loss.block_until_ready()
    n += 1
  return n / (time.time() - t0), state


def main(_):
  F = flags.FLAGS
  rng = np.random.default_rng(0)
  # The demo's train step (tiny BERT, B=128, 16 hard + 256 random negatives drawn per
  # query, the sparse classifier update on one device).
  cfg = EncoderConfig(
    vocab_size=8005,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    intermediate_size=128,
    embedding_dropout=0.2,
  )
  graphdef, enc = nnx.split(Encoder(cfg, nnx.Rngs(0)), nnx.Param)
  B, L_step = 128, 2000
  params = {"encoder": enc, "classifier": 0.02 * jax.random.normal(jax.random.key(1), (L_step, 64))}
  c = base_config()
  tx = optim.encoder_optimizer(c.optim, 10_000)
  mesh = sharding.make_mesh(1, 1)
  step = make_sparse_train_step(
    graphdef,
    tx,
    optim.classifier_schedule(c.optim, 10_000),
    c.optim.classifier_weight_decay,
    mesh,
    B,
  )
  labels = LabelBatch(
    pos_ids=jnp.zeros((B, 7), jnp.int32),
    pos_mask=jnp.ones((B, 7), bool),
    hard_ids=jnp.asarray(rng.integers(0, L_step, (B, 16)), jnp.int32),
    hard_mask=jnp.ones((B, 16), bool),
    rand_ids=jnp.asarray(rng.integers(0, L_step, (B, 256)), jnp.int32),
    rand_mask=jnp.ones((B, 256), bool),
    rand_weight=jnp.full((256,), L_step / 256, jnp.float32),
  )
  batch = TrainBatch(jnp.asarray(rng.integers(5, 8000, (B, 24)), jnp.int32), labels)
  batch = jax.tree.map(lambda v: v[None], batch)  # one micro-batch: (A, B/A, ...)
  state = shard_state(init_sparse_state(tx, params), mesh)
  _, state = step_throughput(step, state, batch, 3)  # compile + warm up

  for L in map(int, F.num_labels):
    with tempfile.TemporaryDirectory() as d:
      w = label_vectors(L, 64, rng)
      pos = rng.integers(0, L, F.num_queries)
      q = (w[pos] + 0.3 * rng.normal(size=(F.num_queries, 64))).astype(np.float32)
      np.save(os.path.join(d, "w.npy"), w)
      np.save(os.path.join(d, "q.npy"), q)
      save_labels(
        os.path.join(d, "labels.npz"),
        SparseRows(
          np.arange(F.num_queries + 1, dtype=np.int64),
          pos.astype(np.int32),
          np.ones(F.num_queries, np.float32),
          L,
        ),
      )
      del w, q
      idle, state = step_throughput(step, state, batch, 10)
      job = RefreshJob(
        0,
        os.path.join(d, "w.npy"),
        os.path.join(d, "q.npy"),
        os.path.join(d, "labels.npz"),
        os.path.join(d, "out.npy"),
        os.path.join(d, "stats.json"),
        F.k_h,
        F.backend,
      )
      worker = RefreshWorker()
      t0 = time.time()
      worker.start(job, os.path.join(d, "job.json"))
      busy, state = step_throughput(
        step, state, batch, 1e9, stop=lambda worker=worker: worker.proc.poll() is not None
      )
      stats = worker.wait()
      row = {
        "num_labels": L,
        "num_queries": F.num_queries,
        "k_h": F.k_h,
        "backend": F.backend,
        "build_s": stats["build_s"],
        "search_s": stats["search_s"],
        "recall": stats["recall"],
        "refresh_wall_s": round(time.time() - t0, 2),
        "steps_per_s_idle": round(idle, 2),
        "steps_per_s_during_refresh": round(busy, 2),
        "cpu_cores": os.cpu_count(),
      }
      jsonl.emit(row, F.out)


if __name__ == "__main__":
  app.run(main)
