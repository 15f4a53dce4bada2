"""Checkpoints (orbax) and exact resume.

A checkpoint is the train state (params: encoder + V; optimizer state: Adam, the
classifier's scale and step, the loss scale) saved with orbax's StandardSave (sharded,
asynchronous, written to a temporary directory and renamed when complete), plus a JSON
`progress` record: epoch, step within the epoch, global step, training seconds, the
evaluations so far and the hard-negative state (file in use, pending refresh, collection).
RNG state needs nothing more: batch i of epoch e and step t's dropout key are pure
functions of (seed, e, i) and (seed, t).

Kept: the last `keep` checkpoints and the best by P@5. W is saved as laid out (rows padded
to a multiple of the 'model' axis, sharded: no gather at save time). Restoring onto a mesh
with another padding reads W replicated once and re-pads and re-splits it (one full copy
of W per device, briefly; same-padding restores read each shard directly).
The workdir's config.json records the run's config; a rerun whose config differs in a key
that changes the computation stops with the keys that differ.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax import distributed
from astra_jax.data import xc_format
from astra_jax.errors import InputError

# Keys a rerun may change. All but mesh.* leave what is computed unchanged; a new mesh
# restores the same W, encoder and optimizer state laid out anew, and the same estimator
# from then on, but other draws (random negatives are drawn per W shard) and, if mesh.model
# changed, random negatives until the next refresh (hard negatives are mined per shard).
FREE_KEYS = ("train.log_every_steps", "train.profile_steps", "train.prefetch",
             "train.input_threads", "eval.",
             "checkpoint.", "mesh.", "negatives.inject_fault", "data.cache_dir",
             "train.stop_after_steps")
_SYNTHETIC_ON = "data.synthetic.enabled"
# Keys added after runs were recorded, each with the value that computes what those runs
# computed: a saved config without the key reads as that value (not as a changed run).
ADDED_KEYS = {"data.synthetic.hidden_own_words": 0, "data.validation_fraction": 0.0,
              "data.validation_seed": 0, "classifier.init": "normal",
              "classifier.init_scale": 1.0}


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _trained(workdir: str) -> bool:
  """Whether the workdir holds anything a run computed: a checkpoint or final results."""
  ck = os.path.join(workdir, "checkpoints")
  return (os.path.exists(os.path.join(workdir, "results.json"))
          or (os.path.isdir(ck) and any(d.isdigit() for d in os.listdir(ck))))


def config_diff(saved: dict, now: dict) -> list[tuple[str, object, object]]:
  """(flattened key, saved value, new value) where two configs' JSON differ, FREE_KEYS
  aside."""
  saved, now = {**ADDED_KEYS, **_flat(saved)}, _flat(now)
  # A real-data run does not read the synthetic generator's fields.
  free = FREE_KEYS if saved.get(_SYNTHETIC_ON) or now.get(_SYNTHETIC_ON) else (
      FREE_KEYS + ("data.synthetic.",))
  return [(k, saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now))
          if saved.get(k) != now.get(k) and not k.startswith(free)]


def check_config(workdir: str, config_json: dict, write: bool = True) -> None:
  """Records the config in a new workdir; in one holding a checkpoint or results, refuses a
  changed computation. (A run that stopped before either, e.g. on missing data, binds
  nothing: its config.json is replaced.) write=False: only the refusal (the processes
  other than the leader)."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      diff = config_diff(json.load(f), config_json)
    if not diff:
      return
    if _trained(workdir):
      shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in diff[:8])
      raise InputError(f"{path}: the workdir holds a run with a different config ({shown}"
                       f"{' ...' if len(diff) > 8 else ''}); use a new --workdir or the same "
                       "config")
    logging.info("%s: nothing trained in this workdir yet; recording the new config", path)
  if write:  # atomically: another process may be reading it
    with xc_format.atomic_text_writer(path) as f:
      json.dump(config_json, f, indent=1)


class Preempted(Exception):
  """Raised after a checkpoint was written because of SIGTERM / SIGINT."""


class StopSignal:
  """SIGTERM / SIGINT set a flag the train loop polls after each step (the handler itself
  must not touch jax or the filesystem). Installed on construction, `restore()` undoes it."""

  def __init__(self):
    self.received: int | str | None = None
    self.previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self.previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    self.received = signum

  def restore(self) -> None:
    for sig, handler in self.previous.items():
      signal.signal(sig, handler)


class SavePolicy:
  """Whether to checkpoint after a step: every `every_steps` steps, every `every_minutes`
  minutes (0: not by that rule) and on a stop signal, after which the run stops. (The train
  loop skips the answer at an epoch's last step, whose epoch-end save follows.) A checkpoint
  is a collective save, so in a multi-process run every process must decide alike: signals
  and clocks are compared across processes only after every `log_every_steps`-th step."""

  def __init__(self, stop: StopSignal, every_steps: int, every_minutes: float,
               log_every_steps: int):
    self.stop, self.every_steps = stop, every_steps
    self.every_s, self.log_every_steps = 60 * every_minutes, log_every_steps
    self.saved()

  def saved(self) -> None:
    self.last_save = time.time()

  def decide(self, global_step: int, step: int) -> tuple[bool, bool]:
    """(save now, stop after it) after `step` of an epoch (0-based), the run's `global_step`."""
    stop_now = bool(self.stop.received)
    time_due = bool(self.every_s and time.time() - self.last_save > self.every_s)
    if jax.process_count() > 1:
      log_step = (step + 1) % self.log_every_steps == 0
      stop_now, time_due = (distributed.any_true([stop_now, time_due]) if log_step
                            else (False, False))
    steps_due = bool(self.every_steps and global_step % self.every_steps == 0)
    return steps_due or time_due or stop_now, stop_now


class Checkpoints:

  def __init__(self, workdir: str, keep: int = 3):
    self.dir = os.path.join(os.path.abspath(workdir), "checkpoints")
    policies = ocp.checkpoint_managers
    self.manager = ocp.CheckpointManager(
        self.dir, item_handlers={"state": ocp.StandardCheckpointHandler(),
                                 "progress": ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(
            enable_async_checkpointing=True, create=True,
            preservation_policy=policies.AnyPreservationPolicy([
                policies.LatestN(n=keep),
                policies.BestN(get_metric_fn=lambda m: m["P@5"], n=1,
                               keep_checkpoints_without_metrics=False)])))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, params: dict, opt_state: dict, progress: dict,
           metrics: dict | None = None) -> None:
    state = {"params": params, "opt_state": opt_state}
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(progress)),
        metrics=metrics, force=True)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore(self, params: dict, opt_state: dict) -> tuple[dict, dict, dict]:
    """The latest checkpoint laid out like `params` / `opt_state` (any mesh)."""
    step = self.latest_step()
    abstract = lambda t: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), t)
    w = params["classifier"]
    saved = self.manager.item_metadata(step)["state"]["params"]["classifier"].shape
    w_target = abstract(w) if tuple(saved) == w.shape else jax.ShapeDtypeStruct(
        tuple(saved), w.dtype, sharding=NamedSharding(w.sharding.mesh, P()))
    target = {"params": {"encoder": abstract(params["encoder"]), "classifier": w_target},
              "opt_state": abstract(opt_state)}
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()))
    state = out["state"]
    rows = state["params"]["classifier"]
    if rows.shape != w.shape:  # padded rows are never read: cut or extend them
      rows = _resize_rows(rows, w.shape[0], w.sharding)
    logging.info("resumed from %s/%d", self.dir, step)
    return ({"encoder": state["params"]["encoder"], "classifier": rows}, state["opt_state"],
            out["progress"])

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _resize_rows(w: jax.Array, rows: int, sharding) -> jax.Array:
  def resize(x):
    x = x[:rows]
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))
  return jax.jit(resize, out_shardings=sharding)(w)
