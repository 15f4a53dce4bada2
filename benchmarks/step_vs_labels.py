r"""Classifier train-step time and temporary memory against the number of labels.

  python benchmarks/step_vs_labels.py --out=step_vs_labels.jsonl [--num_labels=1e4,1e5,1e6,1e7]

The classifier part of an ASTRA step (d=64, B=256, k_p=7, k_h=50, k_r=400; the encoder's
cost does not depend on L): gather the sampled rows, scores, the estimator, gradients w.r.t.
the rows, and the update of W. Compared:
  astra         the trainer's own kernels (`classifier.classifier_grads` + `classifier_update`
                on a 1 x 1 mesh): the sparse update of `classifier.py` into a donated W,
                random negatives drawn per query (the default: B k_r rows per step)
  astra_shared  the same with one shared draw of k_r for the batch
                (negatives.random_draws=shared: k_r rows)
  astra_dense   autodiff w.r.t. all of W + dense SGD with decoupled decay (O(L) per step)
  full          the full-L BCE baseline (every label, blocks of 8192) + dense SGD; stops at
                --full_max_labels (astra_dense at --dense_max_labels)
  rows_touch    not a training step: the memory traffic any sparse step must do, on the
                per-query step's row ids (B (k_p + k_h + k_r) rows): read each row once
                (a gather fused with a multiply, XLA:CPU's fastest gather) and scatter-add
                into each once, into a donated W. What it gains from 1e4 to 1e7 is the
                machine's cost of random rows out of DRAM instead of the caches: a floor
                under the growth of `astra` that no kernel of the same step avoids.
Every (strategy, L) keeps its W and is timed in --rounds passes over all of them (each pass:
3 warm-up steps, then --steps timed), so slow drifts of the machine's load reach every case
alike. One JSON line per (strategy, L): strategy, num_labels, step_ms (median of all timed
steps), steps_timed, temp_bytes (XLA's temporary allocation for the compiled step),
huge_page_bytes (W's bytes on transparent huge pages, as the trainer does on the CPU
backend: host_memory.py).
"""

import functools
import statistics
import time

from astra_jax.runtime import host_memory

host_memory.keep_freed_memory()  # as main.py does; before jax starts threads

import jax  # noqa: E402
import jax.numpy as jnp
import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.reproduce import classifier_bench
from astra_jax.reproduce.classifier_bench import KH, KP, KR, LR, WD, B, D, make_batch
from astra_jax.xc import loss

flags.DEFINE_list("num_labels", ["1e4", "1e5", "1e6", "1e7"], "label counts")
flags.DEFINE_list(
  "strategies",
  ["astra", "astra_shared", "astra_dense", "full", "rows_touch"],
  "which steps to time",
)
flags.DEFINE_integer("full_max_labels", 1_000_000, "largest L for the full-L baseline")
flags.DEFINE_integer(
  "dense_max_labels",
  1_000_000,
  "largest L for astra_dense (its dense W gradient; every case's W stays "
  "alive, and at 1e7 a dense case alone holds ~8 GB)",
)
flags.DEFINE_integer(
  "steps",
  100,
  "timed steps per (strategy, L) and round, after 3 "
  "warm-up steps; fewer where a round would pass --round_seconds",
)
flags.DEFINE_integer(
  "rounds",
  3,
  "passes over every (strategy, L): the machine's load drifts, "
  "and each case gets a share of every period",
)
flags.DEFINE_float("round_seconds", 10.0, "time budget of one case in one round")
flags.DEFINE_string("out", None, "append JSON lines here")


# Every step returns (W, scale, dloss/dE(x)): the encoder's backward pass needs the last, and
# a step that dropped it would let XLA skip that part of the work.
@functools.partial(jax.jit, donate_argnums=(0, 1))
def astra_dense_step(w, scale, emb, batch):
  d_emb, g = jax.grad(lambda e, w: loss.sampled_bce(e, w, batch), (0, 1))(emb, w)
  return (1 - LR * WD) * w - LR * g, scale, d_emb


@functools.partial(jax.jit, donate_argnums=(0, 1))
def rows_touch(w, scale, emb, batch):
  ids = jnp.concatenate([x.reshape(-1) for x in (batch.pos_ids, batch.hard_ids, batch.rand_ids)])
  rows = w[ids] * scale  # the multiply makes XLA:CPU fuse the gather (2-6x faster alone)
  return w.at[ids].add(1e-7 * rows, mode="drop"), scale, jnp.zeros_like(emb)


class Case:
  """One (strategy, L): its step, its W (kept across rounds: the huge-page advice and the
  donated buffer stay), its batches and the step times so far."""

  def __init__(self, strategy: str, L: int, rng: np.random.Generator):
    self.strategy, self.L = strategy, L
    astra = classifier_bench.astra_step()
    self.fn = {
      "astra": astra,
      "astra_shared": astra,
      "astra_dense": astra_dense_step,
      "full": classifier_bench.full_step,
      "rows_touch": rows_touch,
    }[strategy]
    self.w = 0.02 * jax.random.normal(jax.random.key(0), (L, D), jnp.float32)
    self.huge = host_memory.back_with_huge_pages(self.w)
    self.scale = jnp.float32(1.0)
    self.emb = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    self.batches = [make_batch(L, rng, per_query=strategy != "astra_shared") for _ in range(4)]
    compiled = self.fn.lower(self.w, self.scale, self.emb, self.batches[0]).compile()
    self.temp = int(compiled.memory_analysis().temp_size_in_bytes)
    self.times = []

  def step(self, i: int) -> float:
    t0 = time.perf_counter()
    self.w, self.scale, d_emb = self.fn(self.w, self.scale, self.emb, self.batches[i % 4])
    jax.block_until_ready((self.w, d_emb))
    return time.perf_counter() - t0

  def run_round(self, steps: int, seconds: float) -> None:
    warm = [self.step(i) for i in range(3)]  # W back into the caches, as in training
    n = max(3, min(steps, int(seconds / max(min(warm), 1e-6))))
    self.times += [self.step(i) for i in range(n)]

  def row(self) -> dict:
    return {
      "strategy": self.strategy,
      "num_labels": self.L,
      "step_ms": round(1000 * statistics.median(self.times), 3),
      "temp_bytes": self.temp,
      "huge_page_bytes": self.huge,
      "steps_timed": len(self.times),
      "d": D,
      "batch_size": B,
      "k_p": KP,
      "k_h": KH,
      "k_r": KR,
      "device": jax.devices()[0].platform,
    }


def main(_):
  F = flags.FLAGS
  rng = np.random.default_rng(0)
  cases = [
    Case(strategy, L, rng)
    for L in (int(float(x)) for x in F.num_labels)
    for strategy in F.strategies
    if not (strategy == "full" and L > F.full_max_labels)
    and not (strategy == "astra_dense" and L > F.dense_max_labels)
  ]
  for r in range(F.rounds):
    for case in cases:
      case.run_round(F.steps, F.round_seconds)
    print(
      f"round {r + 1}/{F.rounds}: "
      + ", ".join(
        f"{c.strategy}@{c.L:.0e} {1000 * statistics.median(c.times):.2f} ms" for c in cases
      ),
      flush=True,
    )
  for case in cases:
    jsonl.emit(case.row(), F.out)


if __name__ == "__main__":
  app.run(main)
