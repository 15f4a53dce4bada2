"""Classifier-step time break-up and XLA memory against L: ASTRA's sampled step versus the
full-L BCE (the Renee-style baseline), the parts of an iteration that depend on L.

The encoder's cost does not depend on L and is left out. Shapes default to
benchmarks/step_vs_labels.py's (d=64, B=256, k_p=7, k_h=50, k_r=400). Per method:
  clf_forward_ms   gather + scores (ASTRA); scores + loss fused, in label blocks (full)
  loss_ms          the estimator from the scores (ASTRA); None for full (fused above)
  step_ms          the fused forward + backward + update actually trained with, including
                   dloss/dE(x), which the encoder's backward pass needs
  backward_update_ms = step_ms - clf_forward_ms - loss_ms (None when negative: the parts
                   jitted apart take longer than the fused step)
  temp_bytes       XLA's temporary allocation for the compiled step
  dense_scores_temp_bytes (full only) the same for an unblocked B x L score matrix, as
                   Renee's forward holds it (compiled, never run)
"""

from __future__ import annotations

import functools
import hashlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from astra_jax.data.batch import LabelBatch
from astra_jax.parallel import sharding
from astra_jax.runtime import host_memory
from astra_jax.xc import classifier, loss

B, D, KP, KH, KR, LR, WD = 256, 64, 7, 50, 400, 0.1, 1e-4


@functools.cache
def astra_step():
  """The trainer's sparse classifier step (1 x 1 mesh), W and scale donated."""
  mesh = sharding.make_mesh(1, 1)
  grads, update = classifier.classifier_grads(mesh, B), classifier.classifier_update(mesh, WD)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(v, scale, emb, batch):
    _, d_emb, row_grads = grads(emb, v, scale, batch)
    v, scale = update(v, scale, jax.tree.map(lambda x: x[None], row_grads), jnp.float32(LR))
    return v, scale, d_emb

  return step


@functools.partial(jax.jit, donate_argnums=(0, 1))
def full_step(w, scale, emb, batch):
  d_emb, g = jax.grad(
    lambda e, w: loss.full_bce_chunked(e, w, batch.pos_ids, batch.pos_mask), (0, 1)
  )(emb, w)
  return (1 - LR * WD) * w - LR * g, scale, d_emb


@jax.jit
def _full_dense_step(w, emb, targets):
  g = jax.grad(lambda w: loss.full_bce(emb, w, targets))(w)
  return (1 - LR * WD) * w - LR * g


_astra_fwd = jax.jit(loss.classifier_scores)  # with the step's traced scale (see there)
_astra_loss = jax.jit(loss.batch_loss)
_full_fwd = jax.jit(lambda emb, w, b: loss.full_bce_chunked(emb, w, b.pos_ids, b.pos_mask))


def code_fingerprint() -> str:
  """A hash of the code a measurement runs (this file and the step's modules): a cached
  measurement by other code is stale (astra_jax/reproduce reruns it)."""
  h = hashlib.sha256()
  for module in (sys.modules[__name__], loss, sharding, classifier):
    with open(module.__file__, "rb") as f:
      h.update(f.read())
  return h.hexdigest()[:16]


def make_batch(
  L: int,
  rng: np.random.Generator,
  per_query: bool = True,
  batch_size: int = B,
  k_p: int = KP,
  k_h: int = KH,
  k_r: int = KR,
) -> LabelBatch:
  """Label arrays of one batch (uniform ids: the step's cost does not depend on which);
  random draws per query (the trainer's default) or shared. Shapes default to this
  module's (B, KP, KH, KR)."""
  return LabelBatch(
    pos_ids=jnp.asarray(rng.integers(0, L, (batch_size, k_p)), jnp.int32),
    pos_mask=jnp.ones((batch_size, k_p), bool),
    hard_ids=jnp.asarray(rng.integers(0, L, (batch_size, k_h)), jnp.int32),
    hard_mask=jnp.ones((batch_size, k_h), bool),
    rand_ids=jnp.asarray(rng.integers(0, L, (batch_size, k_r) if per_query else k_r), jnp.int32),
    rand_mask=jnp.ones((batch_size, k_r), bool),
    rand_weight=jnp.full((k_r,), L / k_r, jnp.float32),
  )


def _median_ms(fn, steps: int) -> float:
  times = []
  for i in range(steps + 2):  # 2 warm-up calls
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    if i >= 2:
      times.append(time.perf_counter() - t0)
  return round(1000 * statistics.median(times), 3)


def measure(method: str, num_labels: int, steps: int = 10) -> dict:
  """One method ("astra" or "full") at L = num_labels: times (ms, medians) and bytes."""
  rng = np.random.default_rng(0)
  L = int(num_labels)
  w = 0.02 * jax.random.normal(jax.random.key(0), (L, D), jnp.float32)
  host_memory.back_with_huge_pages(w)  # as the trainer does (CPU backend)
  emb = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
  batch = make_batch(L, rng)
  row = {
    "method": method,
    "num_labels": L,
    "d": D,
    "batch_size": B,
    "k_p": KP,
    "k_h": KH,
    "k_r": KR,
    "device": jax.devices()[0].platform,
    "code": code_fingerprint(),
  }
  if method == "astra":
    step = astra_step()
    one = jnp.float32(1.0)
    row["clf_forward_ms"] = _median_ms(lambda: _astra_fwd(emb, w, batch, one), steps)
    scores = _astra_fwd(emb, w, batch, one)
    row["loss_ms"] = _median_ms(lambda: _astra_loss(scores, batch), steps)
  elif method == "full":
    step = full_step
    row["clf_forward_ms"] = _median_ms(lambda: _full_fwd(emb, w, batch), steps)
    row["loss_ms"] = None
    targets = jax.ShapeDtypeStruct((B, L), jnp.float32)
    dense = _full_dense_step.lower(w, emb, targets).compile()
    row["dense_scores_temp_bytes"] = int(dense.memory_analysis().temp_size_in_bytes)
  else:
    raise ValueError(f"unknown method {method!r}; choose astra or full")
  scale = jnp.float32(1.0)
  row["temp_bytes"] = int(
    step.lower(w, scale, emb, batch).compile().memory_analysis().temp_size_in_bytes
  )
  state = [w, scale]

  def run():  # W and scale are donated: thread them through
    state[0], state[1], d_emb = step(state[0], state[1], emb, batch)
    return state[0], d_emb

  row["step_ms"] = _median_ms(run, steps)
  fwd = row["clf_forward_ms"] + (row["loss_ms"] or 0.0)
  # None where 4 and 5, jitted apart, take longer than the fused step (no honest difference)
  rest = row["step_ms"] - fwd
  row["backward_update_ms"] = round(rest, 3) if rest >= 0 else None
  return row
