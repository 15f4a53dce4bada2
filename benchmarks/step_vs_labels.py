r"""Classifier train-step time and temporary memory against the number of labels.

  python benchmarks/step_vs_labels.py --out=step_vs_labels.jsonl [--num_labels=1e4,1e5,1e6,1e7]

The classifier part of an ASTRA step (d=64, B=256, k_p=7, k_h=50, k_r=400; the encoder's
cost does not depend on L): gather the sampled rows, scores, the estimator, gradients w.r.t.
the rows, and the update of W. Two updates are compared:
  astra         the trainer's own kernels (`sharding.classifier_grads` + `classifier_update`
                on a 1 x 1 mesh): the sparse update of `sparse_sgd.py` into a donated W
  astra_dense   autodiff w.r.t. all of W + dense SGD with decoupled decay (O(L) per step)
  full          the full-L BCE baseline (every label, blocks of 8192) + dense SGD; stops at
                --full_max_labels
One JSON line per (strategy, L): strategy, num_labels, step_ms (median of --steps),
temp_bytes (XLA's temporary allocation for the compiled step).
"""
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from astra_jax import classifier_bench, loss
from astra_jax.classifier_bench import B, D, KH, KP, KR, LR, WD, make_batch

import jsonl  # benchmarks/jsonl.py

flags.DEFINE_list("num_labels", ["1e4", "1e5", "1e6", "1e7"], "label counts")
flags.DEFINE_list("strategies", ["astra", "astra_dense", "full"], "which steps to time")
flags.DEFINE_integer("full_max_labels", 1_000_000, "largest L for the full-L baseline")
flags.DEFINE_integer("steps", 30, "timed steps (after 3 warm-up steps)")
flags.DEFINE_string("out", None, "append JSON lines here")


@functools.partial(jax.jit, donate_argnums=(0, 1))
def astra_dense_step(w, scale, emb, batch):
  g = jax.grad(lambda w: loss.sampled_bce(emb, w, batch))(w)
  return (1 - LR * WD) * w - LR * g, scale


def main(_):
  F = flags.FLAGS
  rng = np.random.default_rng(0)
  for L in (int(float(x)) for x in F.num_labels):
    for strategy in F.strategies:
      if strategy == "full" and L > F.full_max_labels:
        continue
      fn = {"astra": classifier_bench.astra_step(), "astra_dense": astra_dense_step,
            "full": classifier_bench.full_step}[strategy]
      w = 0.02 * jax.random.normal(jax.random.key(0), (L, D), jnp.float32)
      scale = jnp.float32(1.0)
      emb = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
      batches = [make_batch(L, rng) for _ in range(4)]
      compiled = fn.lower(w, scale, emb, batches[0]).compile()
      temp = compiled.memory_analysis().temp_size_in_bytes
      times = []
      for i in range(F.steps + 3):
        t0 = time.perf_counter()
        w, scale = fn(w, scale, emb, batches[i % 4])
        w.block_until_ready()
        if i >= 3:
          times.append(time.perf_counter() - t0)
      row = {"strategy": strategy, "num_labels": L, "step_ms": round(1000 * statistics.median(times), 3),
             "temp_bytes": int(temp), "d": D, "batch_size": B, "k_p": KP, "k_h": KH, "k_r": KR,
             "device": jax.devices()[0].platform}
      jsonl.emit(row, F.out)
      del w


if __name__ == "__main__":
  app.run(main)
