r"""The sparse classifier step with and without momentum, on a 1 x 1 mesh.

  python benchmarks/momentum_step.py --num_labels=1e4,1e6 --out=momentum_step.jsonl

classifier_bench's shapes (d=64, B=256, k_p=7, k_h=50, k_r=400, per-query draws). The
steps run interleaved, so the machine's load reaches them alike: plain SGD, momentum as the
trainer takes it (classifier_momentum_step: each block of queries' rows updated right after
it scored them) and momentum in two passes (the kernel, then the update: the trainer's path
with dynamic loss scaling). One JSON line per L: num_labels, plain_ms, momentum_ms and
momentum_two_pass_ms (medians after 20 warm-up steps), each compiled step's temporary bytes,
the O(L) re-base that begins a momentum period (period_ms, the median of 5) and the steps a
period holds; momentum_with_periods_ms adds the re-base's share of a step, and ratio is
that over plain_ms.
"""

import functools
import statistics
import time

from astra_jax.runtime import host_memory

host_memory.keep_freed_memory()  # as main.py does; before jax starts threads

import jax
import jax.numpy as jnp
import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.parallel import sharding
from astra_jax.reproduce.classifier_bench import LR, WD, B, D, make_batch
from astra_jax.xc import classifier, sparse_momentum

flags.DEFINE_list("num_labels", ["1e4", "1e5", "1e6"], "label counts")
flags.DEFINE_integer("steps", 100, "timed steps of each, after 20 warm-up steps")
flags.DEFINE_float("beta", 0.9, "momentum")
flags.DEFINE_string("out", None, "append JSON lines here")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  mesh = sharding.make_mesh(1, 1)
  grads = classifier.classifier_grads(mesh, B)
  plain_update = classifier.classifier_update(mesh, WD)
  momentum_update = classifier.classifier_momentum_update(mesh)
  begin = jax.jit(
    lambda w, state: sparse_momentum.begin_period(
      w, state, lambda t: jnp.float32(LR), jnp.int32(0), WD, FLAGS.beta
    ),
    donate_argnums=(0, 1),
  )
  capacity = sparse_momentum.period_capacity(FLAGS.beta)
  if FLAGS.steps + 20 > capacity:
    raise app.UsageError(f"--steps: at most {capacity - 20} (one momentum period)")

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def plain(v, scale, emb, batch):
    _, d_emb, rg = grads(emb, v, scale, batch)
    v, scale = plain_update(v, scale, jax.tree.map(lambda x: x[None], rg), jnp.float32(LR))
    return v, scale, d_emb

  momentum_step = classifier.classifier_momentum_step(mesh, B)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def momentum(v, state, emb, batch):
    _, d_emb, v, state = momentum_step(emb, v, state, batch)
    return v, sparse_momentum.begin_step(state), d_emb

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def momentum_two_pass(v, state, emb, batch):
    _, d_emb, rg = grads(emb, v, jnp.float32(1.0), batch, state)
    v, state = momentum_update(v, state, jax.tree.map(lambda x: x[None], rg), True)
    return v, state, d_emb

  for L in (int(float(x)) for x in FLAGS.num_labels):
    rng = np.random.default_rng(0)
    emb = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    batch = make_batch(L, rng)
    w = lambda L=L: 0.02 * jax.random.normal(jax.random.key(0), (L, D))
    start = lambda L=L, w=w: list(begin(w(), sparse_momentum.init(L, D, capacity)))
    cases = {
      "plain": (plain, [w(), jnp.float32(1.0)]),
      "momentum": (momentum, start()),
      "momentum_two_pass": (momentum_two_pass, start()),
    }
    # W and the velocity on huge pages, as the trainer puts them (CPU backend).
    for name, (_, state) in cases.items():
      host_memory.back_with_huge_pages(state[0])
      if name != "plain":
        host_memory.back_with_huge_pages(state[1].velocity)
    row = {"num_labels": L, "beta": FLAGS.beta}
    for name, (fn, state) in cases.items():
      row[f"{name}_temp_bytes"] = int(
        fn.lower(*state, emb, batch).compile().memory_analysis().temp_size_in_bytes
      )
    times = {name: [] for name in cases}
    for i in range(FLAGS.steps + 20):
      for name, (fn, state) in cases.items():
        t0 = time.perf_counter()
        state[0], state[1], d_emb = fn(state[0], state[1], emb, batch)
        jax.block_until_ready((state[0], d_emb))
        if i >= 20:
          times[name].append(1000 * (time.perf_counter() - t0))
    row.update({f"{name}_ms": round(statistics.median(t), 2) for name, t in times.items()})
    period = []
    for _ in range(5):  # the steps above stay inside the period: re-base a copy
      w_copy, state_copy = (jax.tree.map(jnp.copy, x) for x in cases["momentum"][1])
      jax.block_until_ready((w_copy, state_copy))
      t0 = time.perf_counter()
      jax.block_until_ready(begin(w_copy, state_copy))
      period.append(1000 * (time.perf_counter() - t0))
    row["period_ms"] = round(statistics.median(period), 2)
    row["period_steps"] = capacity
    row["momentum_with_periods_ms"] = round(row["momentum_ms"] + row["period_ms"] / capacity, 2)
    row["ratio"] = round(row["momentum_with_periods_ms"] / row["plain_ms"], 2)
    jsonl.emit(row, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
