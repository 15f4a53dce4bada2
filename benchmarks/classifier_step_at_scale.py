r"""The trainer's classifier step at SS-scale label counts and batch shapes, on one device.

  python benchmarks/classifier_step_at_scale.py --num_labels=2e7 --batch_size=2048 --d=64 \
      --k_p=32 --k_h=120 --k_r=800 --out=clf_scale.jsonl

The paper's tab:timebreakup gives ASTRA's classifier forward pass on SS-20M as 1.6 ms on a
V100 (loss 0.3 ms, backward 32.2 ms with the encoder's). This times the same parts of the
trainer's own sharded kernels (`classifier.classifier_grads` + `classifier_update` on a 1 x 1
mesh, W donated), at shapes given by flags rather than `classifier_bench`'s fixed small
ones:
  clf_forward_ms  gather of the sampled rows + their scores (`loss.classifier_scores`)
  loss_ms         the estimator from those scores (`loss.batch_loss`)
  step_ms         the fused classifier step the trainer runs: forward, estimator,
                  dloss/dscores, dloss/dE(x) and the sparse update of W's touched rows
  temp_bytes      XLA's temporary allocation for the compiled step
  w_bytes         W itself (L x d float32)
One JSON line per (L, random_draws). Medians of --steps timed calls after 3 warm-ups.
"""

import statistics
import time

from astra_jax.runtime import host_memory

host_memory.keep_freed_memory()  # as main.py does; before jax starts threads

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jsonl  # noqa: E402  (benchmarks/jsonl.py)
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from astra_jax.parallel import sharding  # noqa: E402
from astra_jax.reproduce import classifier_bench  # noqa: E402
from astra_jax.xc import classifier, loss  # noqa: E402

flags.DEFINE_list("num_labels", ["2e7"], "label counts L")
flags.DEFINE_integer("batch_size", 2048, "queries per step (B)")
flags.DEFINE_integer("d", 64, "embedding size")
flags.DEFINE_integer("k_p", 32, "positives per query (padded)")
flags.DEFINE_integer("k_h", 120, "hard negatives per query")
flags.DEFINE_integer("k_r", 800, "random negatives per query")
flags.DEFINE_list("random_draws", ["per_query", "shared"], "per_query and/or shared")
flags.DEFINE_integer("steps", 30, "timed calls per part")
flags.DEFINE_string("out", None, "append JSON lines here")
FLAGS = flags.FLAGS

LR, WD = 0.1, 1e-4


def median_ms(fn, steps: int) -> float:
  times = []
  for i in range(steps + 3):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    if i >= 3:
      times.append(time.perf_counter() - t0)
  return round(1000 * statistics.median(times), 3)


def measure(L: int, per_query: bool) -> dict:
  mesh = sharding.make_mesh(1, 1)
  B = FLAGS.batch_size
  grads, update = classifier.classifier_grads(mesh, B), classifier.classifier_update(mesh, WD)

  def step(v, scale, emb, batch):
    _, d_emb, row_grads = grads(emb, v, scale, batch)
    v, scale = update(v, scale, jax.tree.map(lambda x: x[None], row_grads), jnp.float32(LR))
    return v, scale, d_emb

  step = jax.jit(step, donate_argnums=(0, 1))
  rng = np.random.default_rng(0)
  w = jax.jit(lambda k: 0.02 * jax.random.normal(k, (L, FLAGS.d), jnp.float32))(jax.random.key(0))
  emb = jnp.asarray(rng.normal(size=(B, FLAGS.d)), jnp.float32)
  batch = classifier_bench.make_batch(L, rng, per_query, B, FLAGS.k_p, FLAGS.k_h, FLAGS.k_r)
  one = jnp.float32(1.0)
  fwd, loss_fn = jax.jit(loss.classifier_scores), jax.jit(loss.batch_loss)
  row = {
    "num_labels": L,
    "batch_size": B,
    "d": FLAGS.d,
    "k_p": FLAGS.k_p,
    "k_h": FLAGS.k_h,
    "k_r": FLAGS.k_r,
    "random_draws": "per_query" if per_query else "shared",
    "device": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
    "w_bytes": int(w.size * 4),
  }
  row["clf_forward_ms"] = median_ms(lambda: fwd(emb, w, batch, one), FLAGS.steps)
  scores = fwd(emb, w, batch, one)
  row["loss_ms"] = median_ms(lambda: loss_fn(scores, batch), FLAGS.steps)
  t0 = time.perf_counter()
  compiled = step.lower(w, one, emb, batch).compile()
  row["compile_s"] = round(time.perf_counter() - t0, 2)
  row["temp_bytes"] = int(compiled.memory_analysis().temp_size_in_bytes)
  state = [w, one]

  def run():  # W and scale are donated: thread them through
    state[0], state[1], d_emb = step(state[0], state[1], emb, batch)
    return state[0], d_emb

  row["step_ms"] = median_ms(run, FLAGS.steps)
  return row


def main(argv):
  del argv
  for L in (int(float(x)) for x in FLAGS.num_labels):
    for draws in FLAGS.random_draws:
      jsonl.emit(measure(L, draws == "per_query"), FLAGS.out)


if __name__ == "__main__":
  app.run(main)
