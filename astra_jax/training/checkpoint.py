"""Checkpoints (orbax) and exact resume.

A checkpoint is the train state (params: encoder + V; optimizer state: Adam, the
classifier's scale and step, the loss scale, with classifier momentum its velocity and its
period's step and coefficients, sparse_momentum.py) saved with orbax's
StandardSave (sharded, asynchronous, written to a temporary directory and renamed when
complete), plus a JSON `progress` record: epoch, step within the epoch, global step,
training seconds, the evaluations so far and the hard-negative state (file in use, pending
refresh, collection).
RNG state needs nothing more: batch i of epoch e and step t's dropout key are pure
functions of (seed, e, i) and (seed, t).

Kept: the last `keep` checkpoints and the best by P@5. W is saved as laid out (rows padded
to a multiple of the 'model' axis, sharded: no gather at save time). Restoring onto a mesh
with another padding reads W replicated once and re-pads and re-splits it (one full copy
of W per device, briefly; same-padding restores read each shard directly).
The workdir's config.json records the run's config; a rerun whose config differs in a key
that changes the computation stops with the keys that differ (run_config.py).

Damaged checkpoints: once a save is complete, its step directory gets a list of the files in
it and their sizes (MANIFEST). On resume, a step whose commit marker is missing, whose files
differ from that list, or whose restore fails is reported in one warning line, moved to
`checkpoints/damaged/` (kept, not deleted) and the next older one is tried. All processes
try the same steps in the same order and agree on each (one that fails anywhere is damaged).
A save that cannot be written (a full disk) raises faults.DiskFull; the checkpoints before it
stay as they were.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.data import xc_format
from astra_jax.runtime import distributed, faults
from astra_jax.runtime.errors import InputError


def has_complete_step(workdir: str) -> bool:
  """Whether a checkpoint under workdir/checkpoints is complete (`damage` finds nothing in
  it): a run started in this workdir restores it."""
  ck = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ck) and any(
    d.isdigit() and damage(os.path.join(ck, d)) is None for d in os.listdir(ck)
  )


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

  def __init__(
    self, stop: StopSignal, every_steps: int, every_minutes: float, log_every_steps: int
  ):
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
      stop_now, time_due = (
        distributed.any_true([stop_now, time_due]) if log_step else (False, False)
      )
    steps_due = bool(self.every_steps and global_step % self.every_steps == 0)
    return steps_due or time_due or stop_now, stop_now


MANIFEST = "astra_files.json"  # {path relative to the step directory: size in bytes}
COMMIT_MARKER = "commit_success.txt"  # orbax writes it last, in the step and in each item
ITEMS = ("state", "progress")
DAMAGED = "damaged"
SPACE_MARGIN = 1.05  # free space a save asks for, over its arrays' bytes


def step_files(step_dir: str) -> dict[str, int]:
  """Every file under a step directory (the manifest aside) and its size. A file that
  vanishes during the walk is left out: a live run's retention policy may be deleting the
  step while another process (a monitor, a benchmark) inspects it."""
  out = {}
  for root, _, files in os.walk(step_dir):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, step_dir)
      if rel == MANIFEST:
        continue
      try:
        out[rel] = os.path.getsize(path)
      except FileNotFoundError:
        continue
  return dict(sorted(out.items()))


def damage(step_dir: str) -> str | None:
  """What is wrong with a step directory as its files tell (None: nothing found). A step
  saved before manifests existed, or sealed by no one (the run was killed between the
  save's commit and its seal), is checked for its commit markers only; its restore decides."""
  for where in ("", *ITEMS):
    if not os.path.exists(os.path.join(step_dir, where, COMMIT_MARKER)):
      return f"{os.path.join(where, COMMIT_MARKER)} is missing (the save never completed)"
  manifest = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(manifest):
    return None
  try:
    with open(manifest) as f:
      expected = json.load(f)
  except (OSError, ValueError) as e:
    return f"{MANIFEST} is unreadable ({e})"
  found = step_files(step_dir)
  for rel, size in expected.items():
    if rel not in found:
      return f"{rel} is missing"
    if found[rel] != size:
      return f"{rel} has {found[rel]} bytes, {size} were written"
  return None


def _one_line(e: BaseException) -> str:
  """An exception's gist: the innermost cause's message, without the pages of JSON spec
  TensorStore appends."""
  while e.__cause__ is not None:
    e = e.__cause__
  text = " ".join(str(e).split()).split(" See full TensorStore details")[0]
  return f"{type(e).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


@contextlib.contextmanager
def _quiet():
  """Silences what a failed restore prints besides its exception: orbax's log lines and the
  unraisable-exception reports of TensorStore reads it abandoned."""
  hook, level = sys.unraisablehook, logging.get_verbosity()
  sys.unraisablehook = lambda unraisable: None
  logging.set_verbosity(logging.FATAL)
  try:
    yield
  finally:
    sys.unraisablehook = hook
    logging.set_verbosity(level)


class Checkpoints:
  """The workdir's orbax checkpoints: asynchronous saves, each sealed with its MANIFEST once
  on disk; restore of the newest whole one (see the module docstring). Steps found damaged
  when it opens are set aside at once, before orbax reads their metadata."""

  def __init__(self, workdir: str, keep: int = 3):
    self.workdir = os.path.abspath(workdir)
    self.dir = os.path.join(self.workdir, "checkpoints")
    self.set_aside: list[tuple[int, str]] = []  # (step, what was wrong) moved to damaged/
    self._unsealed: int | None = None  # the step of the save in flight
    self._save_bytes = 0
    # Before orbax reads the steps' metadata (for the best P@5): its log of a damaged file
    # would be a second line.
    self._set_aside_damaged_files()
    policies = ocp.checkpoint_managers
    self.manager = ocp.CheckpointManager(
      self.dir,
      item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "progress": ocp.JsonCheckpointHandler(),
      },
      options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=True,
        create=True,
        preservation_policy=policies.AnyPreservationPolicy(
          [
            policies.LatestN(n=keep),
            policies.BestN(
              get_metric_fn=lambda m: m["P@5"], n=1, keep_checkpoints_without_metrics=False
            ),
          ]
        ),
      ),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.dir, str(step))

  # -------------------------------------------------------------------------- saving
  def save(
    self, step: int, params: dict, opt_state: dict, progress: dict, metrics: dict | None = None
  ) -> None:
    """Starts an asynchronous save (the previous one is finished and sealed first)."""
    self.wait()
    state = {"params": params, "opt_state": opt_state}
    # Uncompressed, and a margin for orbax's metadata: zstd shrinks random floats little.
    self._save_bytes = int(
      SPACE_MARGIN * sum(x.nbytes for x in jax.tree.leaves(state))
      + len(json.dumps(progress))
      + (1 << 20)
    )
    faults.require_space(self._step_dir(step), self._save_bytes)
    with self._writing(step):
      self.manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(progress)
        ),
        metrics=metrics,
        force=True,
      )
    self._unsealed = step

  def wait(self) -> None:
    """Until the save in flight is on disk, and sealed (its MANIFEST written)."""
    step = self._unsealed
    with self._writing(step):
      self.manager.wait_until_finished()
      if step is not None and distributed.is_leader() and os.path.isdir(self._step_dir(step)):
        files = step_files(self._step_dir(step))
        with xc_format.atomic_text_writer(os.path.join(self._step_dir(step), MANIFEST)) as f:
          json.dump(files, f, indent=0)
    self._unsealed = None

  @contextlib.contextmanager
  def _writing(self, step: int | None):
    """A disk error in a save: its partial temporary directory is removed (the space it
    took is the user's again) and DiskFull raised; earlier checkpoints are untouched."""
    try:
      with faults.writing(self.dir if step is None else self._step_dir(step), self._save_bytes):
        yield
    except faults.DiskFull:
      self._unsealed = None
      if distributed.is_leader() and step is not None:
        for tmp in glob.glob(glob.escape(self._step_dir(step)) + ".orbax-checkpoint-tmp*"):
          shutil.rmtree(tmp, ignore_errors=True)
      raise

  # ------------------------------------------------------------------------ restoring
  def _set_aside(self, step: int, problem: str) -> None:
    """Moves a damaged step to damaged/ (by the leader, all processes waiting)."""
    dest = os.path.join(self.dir, DAMAGED, str(step))
    n = 1
    while os.path.exists(dest):  # the same step damaged before, in an earlier rerun
      dest, n = os.path.join(self.dir, DAMAGED, f"{step}.{n}"), n + 1
    logging.warning(
      "checkpoint %d is damaged (%s): moved to %s; trying the next older one", step, problem, dest
    )
    distributed.barrier(f"checkpoint {step} checked")
    if distributed.is_leader():
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      os.replace(self._step_dir(step), dest)
    distributed.barrier(f"checkpoint {step} set aside")
    self.set_aside.append((step, problem))

  def _set_aside_damaged_files(self) -> None:
    steps = (
      sorted((int(d) for d in os.listdir(self.dir) if d.isdigit()), reverse=True)
      if os.path.isdir(self.dir)
      else []
    )
    for step in steps:
      problem = damage(self._step_dir(step))
      if distributed.any_true([problem is not None])[0]:
        self._set_aside(step, problem or "damaged as another process sees it")

  def restore(
    self, params: dict, opt_state: dict, accept: Callable[[dict], None] | None = None
  ) -> tuple[dict, dict, dict] | None:
    """The newest checkpoint that restores, laid out like `params` / `opt_state` (any
    mesh), as (params, opt_state, progress); None when there is none. Damaged ones are set
    aside on the way (`set_aside`). accept(progress): applies the progress record elsewhere
    (the hard negatives it names); raising there makes the checkpoint unusable too.
    Raises InputError when checkpoints exist and none restores."""
    steps = sorted(self.manager.all_steps(), reverse=True)
    for step in steps:
      problem, out = damage(self._step_dir(step)), None
      if problem is None:
        try:
          with _quiet():
            out = self._restore_step(step, params, opt_state)
          if accept is not None:
            accept(out[2])
        except Exception as e:  # whatever orbax or TensorStore raise for a damaged file
          problem = _one_line(e)
      if distributed.all_true(problem is None):
        logging.info("resumed from %s/%d", self.dir, step)
        return out
      self._set_aside(step, problem or "another process could not restore it")
      self.manager.reload()
    damaged = os.path.join(self.dir, DAMAGED)
    if steps or self.set_aside or (os.path.isdir(damaged) and os.listdir(damaged)):
      raise InputError(
        f"{self.workdir}: no checkpoint restores (each moved to {self.dir}/{DAMAGED}, the "
        "warnings above say why); to train from the start, rerun with a new --workdir or "
        f"move {self.dir} away"
      )
    return None

  def _restore_step(self, step: int, params: dict, opt_state: dict) -> tuple[dict, dict, dict]:
    abstract = lambda t: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), t
    )
    w = params["classifier"]
    saved = self.manager.item_metadata(step)["state"]["params"]["classifier"].shape
    w_target = (
      abstract(w)
      if tuple(saved) == w.shape
      else jax.ShapeDtypeStruct(tuple(saved), w.dtype, sharding=NamedSharding(w.sharding.mesh, P()))
    )
    opt_target = abstract(opt_state)
    # The sparse step's state is a dict whose momentum is padded like W; the dense step's
    # is optax's own state.
    per_row = opt_state.get("momentum") if isinstance(opt_state, dict) else None
    if per_row is not None and tuple(saved) != w.shape:
      opt_target["momentum"] = opt_target["momentum"]._replace(
        **{
          k: jax.ShapeDtypeStruct((saved[0],) + x.shape[1:], x.dtype, sharding=w_target.sharding)
          for k, x in (("velocity", per_row.velocity),)
        }
      )
    target = {
      "params": {"encoder": abstract(params["encoder"]), "classifier": w_target},
      "opt_state": opt_target,
    }
    out = self.manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), progress=ocp.args.JsonRestore()
      ),
    )
    state = out["state"]
    rows = state["params"]["classifier"]
    if rows.shape != w.shape:  # padded rows are never read: cut or extend them
      rows = _resize_rows(rows, w.shape[0], w.sharding)
      if per_row is not None:  # padded rows: zero in both coordinates
        restored = state["opt_state"]["momentum"]
        state["opt_state"]["momentum"] = restored._replace(
          velocity=_resize_rows(restored.velocity, w.shape[0], per_row.velocity.sharding)
        )
    return (
      {"encoder": state["params"]["encoder"], "classifier": rows},
      state["opt_state"],
      out["progress"],
    )

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()


def _resize_rows(w: jax.Array, rows: int, sharding) -> jax.Array:
  def resize(x):
    x = x[:rows]
    return jnp.pad(x, ((0, rows - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))

  return jax.jit(resize, out_shardings=sharding)(w)
