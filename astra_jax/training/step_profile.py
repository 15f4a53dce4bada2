"""The paper's iteration-time break-up (tab:timebreakup): a few warm steps timed by phase.

On a profiled step the loop times the batch's transfer, then the first micro-batch's
encoder forward, classifier forward and loss as separately compiled functions, then the
fused step it actually trains with; backward + update is the step minus those forwards.
"""

from __future__ import annotations

import statistics
import time

import jax
from flax import nnx

from astra_jax.data.batch import TrainBatch
from astra_jax.xc import classifier, loss

PHASES = ("data_prep", "host_to_device", "encoder_forward", "classifier_forward", "loss", "step")


def _median_ms(xs: list[float]) -> float | None:
  return round(1000 * statistics.median(xs), 3) if xs else None


class StepProfiler:
  """Times `profile_steps` warm steps (the second epoch's when there is one: compilation and
  first-touch effects stay out). `phases` (seconds per phase) is saved in checkpoints."""

  def __init__(
    self,
    graphdef,
    steps_per_epoch: int,
    epochs: int,
    profile_steps: int,
    mesh: jax.sharding.Mesh | None = None,
  ):
    self._encoder = jax.jit(lambda p, ids, key: nnx.merge(graphdef, p)(ids, dropout_key=key))
    # The classifier's forward as the step runs it: each shard scores its own rows.
    self._scores = (
      jax.jit(loss.classifier_scores) if mesh is None else classifier.classifier_forward(mesh)
    )
    self._loss = jax.jit(loss.batch_loss)
    first = steps_per_epoch + 2 if epochs > 1 else min(3, steps_per_epoch - 1)
    self._at = set(range(first, first + profile_steps))
    self.phases: dict[str, list[float]] = {k: [] for k in PHASES}
    self._pending: tuple | None = None

  def wants(self, global_step: int) -> bool:
    return global_step in self._at

  def before_step(
    self,
    t_start: float,
    prep_s: float,
    batch: TrainBatch,
    encoder_params,
    classifier: jax.Array,
    w_scale: jax.Array,
    key: jax.Array,
  ) -> None:
    """Times the transfer of `batch` (started at `t_start`) and the forward phases of its
    first micro-batch. w_scale: W = w_scale * classifier (the sparse step's V; traced, so
    the gather fuses as in the step)."""
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    micro = jax.tree.map(lambda x: x[0], batch)
    emb = jax.block_until_ready(self._encoder(encoder_params, micro.input_ids, key))
    t2 = time.perf_counter()
    scores = jax.block_until_ready(self._scores(emb, classifier, micro.labels, w_scale))
    t3 = time.perf_counter()
    jax.block_until_ready(self._loss(scores, micro.labels))
    t4 = time.perf_counter()
    self._pending = (prep_s, t1 - t_start, t2 - t1, t3 - t2, t4 - t3, t4)

  def after_step(self, value: jax.Array) -> None:
    """Ends the step whose forwards `before_step` timed (`value`: its loss)."""
    value.block_until_ready()
    *durations, t4 = self._pending
    for name, dt in zip(PHASES, (*durations, time.perf_counter() - t4)):
      self.phases[name].append(dt)
    self._pending = None

  def breakup(self, step_times: list[float], batch_size: int) -> dict:
    """time_breakup.json: median ms per phase, and the median wall time per step."""
    out = {k: _median_ms(v) for k, v in self.phases.items()}
    if out["step"] is not None:
      fwd = sum(out[k] for k in ("encoder_forward", "classifier_forward", "loss"))
      out["backward_update"] = round(max(out["step"] - fwd, 0.0), 3)
    return {
      "unit": "ms (median over profiled steps)",
      "steps_profiled": len(self.phases["step"]),
      "batch_size": batch_size,
      **out,
      "mean_step_wall_ms": _median_ms(step_times),
      "note": "step = the fused forward+backward+update actually used; backward_update ="
      " step - (encoder_forward + classifier_forward + loss)",
    }
