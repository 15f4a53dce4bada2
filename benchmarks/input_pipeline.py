r"""Host time per batch of the input pipeline at a paper config's shapes, against threads.

  python benchmarks/input_pipeline.py --out=input_pipeline.jsonl \
      [--configs=experiments/lf_amazontitles_131k.py,experiments/ss20m.py] [--threads=1,2] \
      [--data_groups=1,4]

The trainer's own TrainBatches + NegativeSampler (tokens, positives, hard negatives, the
random draws and their masks) on synthetic arrays of the config's shapes: its batch size,
micro-batches, k_p, k_h, k_r, W shards (mesh.model), random_draws, label count and labels
per point (catalog), max_len; --rows training rows (the cost of a batch does not depend on
how many rows there are to choose from). Batches of an epoch with hard negatives (the
costlier phase). One JSON line per (config, threads): ms_per_batch (wall time over
--batches batches / their number: what the device waits for when its step is faster),
prepare_ms (median time of one batch in one thread), speedup over one thread. With
--data_groups G > 1 (mesh.data), two layouts each: one process building every group's
label side ("held": G, a single process feeding all devices) and one building one group's
("held": 1, a process on one data group of a multi-process mesh).
"""

import os
import statistics
import time

import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.config import base as config_base
from astra_jax.data import catalog
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.training.pipeline import TrainBatches

flags.DEFINE_list(
  "configs",
  ["experiments/lf_amazontitles_131k.py", "experiments/ss20m.py"],
  "experiment configs whose shapes to use",
)
flags.DEFINE_list("threads", ["1", "2"], "train.input_threads values")
flags.DEFINE_list("data_groups", ["1"], "mesh.data values (the batch's query groups)")
flags.DEFINE_integer("rows", 100_000, "synthetic training rows")
flags.DEFINE_integer("batches", 24, "batches timed per (config, threads), after 2 warm-up")
flags.DEFINE_string("out", None, "append JSON lines here")


def synthetic_inputs(c, rows: int, rng: np.random.Generator):
  """Tokens and a label matrix of the config's shapes (label count, labels per point)."""
  ds = catalog.DATASETS[c.data.name]
  counts = 1 + rng.poisson(ds.labels_per_point - 1, rows)
  indptr = np.concatenate([[0], np.cumsum(counts)])
  labels = SparseRows(
    indptr,
    rng.integers(0, ds.num_labels, indptr[-1]).astype(np.int32),
    np.ones(indptr[-1], np.float32),
    ds.num_labels,
  )
  tokens = rng.integers(0, 30_000, (rows, c.data.max_len), dtype=np.int32)
  return tokens, labels


def main(_):
  F = flags.FLAGS
  rng = np.random.default_rng(0)
  for path in F.configs:
    c = config_base.load_config(path)
    nc, shards = c.negatives, c.mesh.model
    tokens, labels = synthetic_inputs(c, F.rows, rng)
    sampler = NegativeSampler(
      labels, nc.k_p, nc.k_h, nc.k_r, shards, per_query_random=nc.random_draws == "per_query"
    )
    lo, hi = sampler.shard_bounds[:, 0], sampler.shard_bounds[:, 1]
    hard = np.concatenate(
      [rng.integers(l, h, (F.rows, nc.k_h), dtype=np.int32) for l, h in zip(lo, hi)], 1
    )
    layouts = [(1, None)] + [
      (g, held) for g in (int(x) for x in F.data_groups) if g > 1 for held in (None, [0])
    ]
    for groups, held in layouts:
      base = None
      for threads in (int(t) for t in F.threads):
        batches = TrainBatches(
          tokens,
          sampler,
          c.train.batch_size,
          seed=0,
          prefetch=max(4, 2 * threads),
          micro_batches=c.train.grad_accum_steps,
          threads=threads,
          data_groups=groups,
          held_groups=held,
        )
        it = batches.epoch(1, hard)
        for _ in range(2):
          next(it)
        prep, t0 = [], time.perf_counter()
        for _ in range(F.batches):
          prep.append(next(it)[1])
        wall = (time.perf_counter() - t0) / F.batches
        it.close()
        base = base or wall
        jsonl.emit(
          {
            "config": os.path.basename(path),
            "dataset": c.data.name,
            "batch_size": c.train.batch_size,
            "micro_batches": c.train.grad_accum_steps,
            "k_p": nc.k_p,
            "k_h": nc.k_h,
            "k_r": nc.k_r,
            "shards": shards,
            "random_draws": nc.random_draws,
            "data_groups": groups,
            "held": groups if held is None else len(held),
            "threads": threads,
            "ms_per_batch": 1000 * wall,
            "prepare_ms": 1000 * statistics.median(prep),
            "speedup": base / wall,
            "cpus": os.cpu_count(),
          },
          F.out,
          digits=2,
        )


if __name__ == "__main__":
  app.run(main)
