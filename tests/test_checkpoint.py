"""Checkpoints: exact resume after SIGTERM and SIGKILL, restore onto other meshes, refusal
of a workdir holding another config."""

import copy
import json
import os
import random
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
from flax import nnx

from astra_jax.config import base as config_base
from astra_jax.model import factory
from astra_jax.parallel import sharding
from astra_jax.runtime.errors import InputError
from astra_jax.training import checkpoint, optim, run_config, steps, train


def _start(demo, workdir, data_dir):
  return subprocess.Popen(
    demo.command(workdir, data_dir),
    cwd=demo.cwd,
    env=demo.env,
    text=True,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )


def _wait_for_checkpoint(workdir, proc, after=()):
  ckdir = os.path.join(workdir, "checkpoints")
  while proc.poll() is None:
    done = [d for d in os.listdir(ckdir) if d.isdigit()] if os.path.isdir(ckdir) else []
    if set(done) - set(after):
      return done
    time.sleep(0.2)
  raise AssertionError(proc.stdout.read()[-3000:])


@pytest.mark.slow
def test_sigterm_and_sigkill_then_resume_give_the_uninterrupted_metrics(tmp_path, demo_command):
  # The reference runs beside the interrupted one.
  ref = _start(demo_command, tmp_path / "ref", tmp_path / "data_ref")
  wd, data = tmp_path / "run", tmp_path / "data"
  p = _start(demo_command, wd, data)
  _wait_for_checkpoint(wd, p)
  p.send_signal(signal.SIGTERM)
  out = p.communicate(timeout=300)[0]
  assert p.returncode == 75, out[-2000:]
  assert "rerun the same command to resume" in out
  assert (wd / "PREEMPTED").exists()  # what launch/slurm.sbatch requeues on
  p = _start(demo_command, wd, data)  # resumes; killed at a random moment after its next checkpoint
  before = os.listdir(wd / "checkpoints")
  _wait_for_checkpoint(wd, p, before)
  time.sleep(random.Random(0).uniform(0, 2))
  p.kill()
  p.wait()
  p = _start(demo_command, wd, data)
  out = p.communicate(timeout=600)[0]
  assert p.returncode == 0, out[-3000:]
  assert "resuming at epoch" in out
  assert not (wd / "PREEMPTED").exists()
  out_ref = ref.communicate(timeout=600)[0]
  assert ref.returncode == 0, out_ref[-3000:]
  a = json.load(open(tmp_path / "ref" / "results.json"))
  b = json.load(open(wd / "results.json"))
  assert b["metrics"] == a["metrics"]  # bitwise on CPU
  assert [r["ok"] for r in b["negatives"]["refreshes"]] == [True]  # epoch 2's refresh
  assert b["negatives"]["per_epoch"] == a["negatives"]["per_epoch"]


@pytest.mark.slow
def test_a_crash_while_the_epoch_end_save_is_in_flight_resumes_the_refreshes(
  tmp_path, monkeypatch, small_synthetic
):
  """The epoch-end save is asynchronous; the next refresh deletes the hard negatives and
  refresh inputs the previous checkpoint names. A crash before the save finishes must still
  leave a checkpoint whose files exist (tau_r = 1: a refresh at every epoch from 2)."""
  from astra_jax.negatives import manager

  class Saves(checkpoint.Checkpoints):  # which save had not finished when the crash came
    last = None

    def __init__(self, *a, **k):
      super().__init__(*a, **k)
      Saves.last, self.unfinished = self, None

    def save(self, step, *a, **k):
      super().save(step, *a, **k)  # orbax finishes the previous save first
      self.unfinished = step

    def wait(self):
      super().wait()
      self.unfinished = None

  class Crash(Exception):
    pass

  crash = {"at": 3, "unfinished": None}
  start_epoch = manager.HardNegatives.start_epoch

  def crashing_start_epoch(self, epoch, *a, **k):
    out = start_epoch(self, epoch, *a, **k)
    if epoch == crash["at"]:
      crash["at"], crash["unfinished"] = None, Saves.last.unfinished
      raise Crash
    return out

  monkeypatch.setattr(checkpoint, "Checkpoints", Saves)
  monkeypatch.setattr(manager.HardNegatives, "start_epoch", crashing_start_epoch)
  c = small_synthetic(tau_s=2, tau_r=1)
  c.train.profile_steps = 2  # in epoch 1: the time break-up must survive the resume too
  wd = tmp_path / "wd"
  with pytest.raises(Crash):
    train.train_and_evaluate(c, str(wd))
  if crash["unfinished"] is not None:  # the killed process never finalised that save
    shutil.rmtree(wd / "checkpoints" / str(crash["unfinished"]))
  r = train.train_and_evaluate(c, str(wd))
  assert r["time_breakup"]["steps_profiled"] == 2 and r["time_breakup"]["step"] > 0
  neg = r["negatives"]
  assert [x["epoch"] for x in neg["refreshes"]] == [2, 3]
  assert all(x["ok"] for x in neg["refreshes"]), neg["refreshes"]
  assert [e["source"] for e in neg["per_epoch"]] == [None, None, 2, 3]


@pytest.mark.slow
def test_checkpoint_moves_between_meshes(tmp_path, small_synthetic):
  c = small_synthetic(strategy="random")
  c.train.epochs = 1
  c.mesh.data, c.mesh.model = 2, 4
  c.train.stop_after_steps = 30
  with pytest.raises(checkpoint.Preempted):
    train.train_and_evaluate(c, str(tmp_path / "a"))
  saved = {}
  for shape in ((2, 4), (1, 8), (1, 1)):
    wd = tmp_path / f"m{shape[0]}x{shape[1]}"
    shutil.copytree(tmp_path / "a", wd)
    c.mesh.data, c.mesh.model = shape
    c.train.stop_after_steps = 0
    # The restored state, laid out on this mesh, is the saved one.
    mesh = sharding.make_mesh(*shape)
    rows = sharding.padded_rows(300, mesh)
    ck = checkpoint.Checkpoints(str(wd))
    params, opt_state = _templates(c, mesh, rows)
    p, o, progress = ck.restore(params, opt_state)
    ck.close()
    assert progress["global_step"] == 30
    assert p["classifier"].shape == (rows, 64)
    saved[shape] = (
      np.asarray(p["classifier"])[:300],
      float(o["scale"]),
      jax.tree.leaves(jax.device_get(p["encoder"])),
    )
    if shape == (1, 8):  # and training continues from it
      r = train.train_and_evaluate(c, str(wd))
      assert r["steps"] == (2000 + 300) // 64 and r["P@1"] > 30
  ref = saved[(2, 4)]
  for shape in ((1, 8), (1, 1)):
    np.testing.assert_array_equal(saved[shape][0], ref[0])
    assert saved[shape][1] == ref[1]
    for x, y in zip(saved[shape][2], ref[2]):
      np.testing.assert_array_equal(x, y)


def _templates(c, mesh, rows):
  """Fresh params / optimizer state of the run's shapes on `mesh` (as the trainer builds)."""
  data = train.prepare_data(copy.deepcopy(c))
  enc = factory.build_encoder(c, data.vocab_size, data.pad_id, 0)
  _, enc_params = nnx.split(enc, nnx.Param)
  params = {"encoder": enc_params, "classifier": jax.numpy.zeros((rows, enc.cfg.embed_dim))}
  tx = optim.encoder_optimizer(c.optim, 100)
  return steps.saved_layout(steps.shard_state(steps.init_sparse_state(tx, params), mesh))


def test_a_workdir_with_another_config_is_refused(tmp_path, small_synthetic):
  c = small_synthetic()
  run_config.check_config(str(tmp_path), json.loads(c.to_json()))
  c.data.dir = "elsewhere"  # the first run stopped before training (e.g. no data): accepted
  run_config.check_config(str(tmp_path), json.loads(c.to_json()))
  assert json.loads((tmp_path / "config.json").read_text())["data"]["dir"] == "elsewhere"
  (tmp_path / "checkpoints" / "40").mkdir(parents=True)  # now it has trained
  c.negatives.k_r = 99
  c.train.log_every_steps = 7  # free to change
  with pytest.raises(InputError, match=r"config.json: .*negatives.k_r: 256 -> 99"):
    run_config.check_config(str(tmp_path), json.loads(c.to_json()))


def test_synthetic_data_of_another_generator_is_another_run(tmp_path, small_synthetic):
  c = small_synthetic()
  saved = json.loads(c.to_json())
  del saved["data"]["synthetic"]["generator"]  # a run on the first generator's data
  diff = run_config.config_diff(saved, json.loads(c.to_json()))
  assert [k for k, _, _ in diff] == ["data.synthetic.generator"]
  # A real-data run reads none of the generator's fields: they bind nothing there.
  saved["data"]["synthetic"]["enabled"] = False
  c.data.synthetic.enabled = False
  c.data.synthetic.num_labels += 1
  assert run_config.config_diff(saved, json.loads(c.to_json())) == []


def test_a_config_recorded_before_a_key_was_added_reads_as_its_old_behaviour(
  tmp_path, small_synthetic
):
  c = small_synthetic()
  saved = json.loads(c.to_json())
  del saved["data"]["synthetic"]["hidden_own_words"]  # recorded before the key existed
  assert run_config.config_diff(saved, json.loads(c.to_json())) == []
  c.data.synthetic.hidden_own_words = 1  # other data: another run
  assert run_config.config_diff(saved, json.loads(c.to_json())) == [
    ("data.synthetic.hidden_own_words", 0, 1)
  ]
  del saved["optim"]["classifier_momentum"]  # a run recorded without it had none
  assert run_config.config_diff(saved, json.loads(c.to_json())) == [
    ("data.synthetic.hidden_own_words", 0, 1)
  ]


def test_keeps_the_last_n_and_the_best_by_p5(tmp_path):
  ck = checkpoint.Checkpoints(str(tmp_path), keep=2)
  params = {"encoder": {"w": jax.numpy.ones(3)}, "classifier": jax.numpy.zeros((4, 2))}
  state = {"scale": jax.numpy.float32(1.0)}
  for step, p5 in [(1, 30.0), (2, 50.0), (3, None), (4, 40.0), (5, None)]:
    ck.save(step, params, state, {"step": step}, {"P@5": p5} if p5 else None)
  ck.wait()
  assert sorted(ck.manager.all_steps()) == [2, 4, 5]  # best (50.0) + the last two
  # Saves are atomic: nothing but finished step directories is listed.
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4", "5"]
  ck.close()


def test_save_policy_by_steps_minutes_and_signal(monkeypatch):
  stop = checkpoint.StopSignal()
  try:
    now = [1000.0]
    monkeypatch.setattr(checkpoint.time, "time", lambda: now[0])
    by_steps = checkpoint.SavePolicy(stop, every_steps=3, every_minutes=0, log_every_steps=10)
    assert [by_steps.decide(g, g - 1) for g in range(1, 7)] == [
      (False, False),
      (False, False),
      (True, False),
    ] * 2
    by_time = checkpoint.SavePolicy(stop, every_steps=0, every_minutes=2, log_every_steps=10)
    now[0] += 119
    assert by_time.decide(1, 0) == (False, False)
    now[0] += 2  # 121 s since the policy's start (a save)
    assert by_time.decide(2, 1) == (True, False)
    by_time.saved()
    assert by_time.decide(3, 2) == (False, False)
    stop.received = 15  # SIGTERM: save now, then stop
    assert by_time.decide(4, 3) == (True, True)
  finally:
    stop.restore()


def test_save_policy_decides_alike_across_processes_at_log_steps_only(monkeypatch):
  stop = checkpoint.StopSignal()
  try:
    calls = []

    def any_true(flags):  # another process saw a stop signal
      calls.append(flags)
      return [True, False]

    monkeypatch.setattr(checkpoint.jax, "process_count", lambda: 2)
    monkeypatch.setattr(checkpoint.distributed, "any_true", any_true)
    policy = checkpoint.SavePolicy(stop, every_steps=0, every_minutes=30, log_every_steps=4)
    decisions = [policy.decide(g, g - 1) for g in range(1, 9)]
    # This process received nothing; it stops with the others after steps 4 and 8.
    assert decisions == [(False, False)] * 3 + [(True, True)] + [(False, False)] * 3 + [
      (True, True)
    ]
    assert calls == [[False, False]] * 2
  finally:
    stop.restore()


@pytest.mark.e2e
def test_a_dense_step_run_resumes(tmp_path, small_synthetic):
  """uptodate and full train with optax's own state (not the sparse step's dict)."""
  c = small_synthetic(strategy="full")
  c.train.epochs, c.train.stop_after_steps = 1, 10
  with pytest.raises(checkpoint.Preempted):
    train.train_and_evaluate(c, str(tmp_path / "wd"))
  c.train.stop_after_steps = 0
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert r["steps"] == (2000 + 300) // 64  # the queries and the label-text rows, one epoch


def test_has_complete_step_needs_every_commit_marker(tmp_path):
  from astra_jax.training import checkpoint as ck

  assert not ck.has_complete_step(str(tmp_path))  # no checkpoints/ at all
  step = tmp_path / "checkpoints" / "12"
  for where in ("", *ck.ITEMS):
    (step / where).mkdir(parents=True, exist_ok=True)
  (step / ck.COMMIT_MARKER).write_text("")
  assert not ck.has_complete_step(str(tmp_path))  # the items' markers missing
  for where in ck.ITEMS:
    (step / where / ck.COMMIT_MARKER).write_text("")
  assert ck.has_complete_step(str(tmp_path))
  (tmp_path / "checkpoints" / "damaged").mkdir()  # not a step
  assert ck.has_complete_step(str(tmp_path))


def test_a_step_deleted_while_it_is_inspected_reads_as_incomplete(tmp_path, monkeypatch):
  """A monitor inspecting a live run's checkpoints races its retention policy: a file gone
  between the walk's listing and its stat is a missing file, not a crash."""
  from astra_jax.training import checkpoint as ck

  step = tmp_path / "4"
  for where in ("", *ck.ITEMS):
    (step / where).mkdir(parents=True, exist_ok=True)
    (step / where / ck.COMMIT_MARKER).write_text("")
  (step / "progress" / "metadata").write_text("{}")
  (step / ck.MANIFEST).write_text(json.dumps(ck.step_files(str(step))))
  assert ck.damage(str(step)) is None

  getsize = os.path.getsize

  def deleted_meanwhile(path):
    if path.endswith(os.path.join("progress", "metadata")):
      raise FileNotFoundError(path)
    return getsize(path)

  monkeypatch.setattr(os.path, "getsize", deleted_meanwhile)
  assert ck.damage(str(step)) == os.path.join("progress", "metadata") + " is missing"


def test_a_config_recorded_with_the_flat_index_keys_is_the_same_run():
  now = json.loads(config_base.base_config().to_json())
  now["negatives"]["index"]["group_rows"] = 80_000
  # The layout before negatives.index became a sub-config, written out by hand.
  old = json.loads(json.dumps(now))
  index = old["negatives"].pop("index")
  old["negatives"]["index"] = index.pop("kind")
  old["negatives"]["scann_leaves"] = index.pop("num_leaves")
  for name, value in index.items():
    old["negatives"][f"scann_{name}"] = value
  assert run_config.config_diff(old, now) == []
  old["negatives"]["scann_group_rows"] = 0
  assert run_config.config_diff(old, now) == [("negatives.index.group_rows", 0, 80_000)]


def test_a_recorded_config_reads_back_with_renamed_and_added_keys(tmp_path):
  now = json.loads(config_base.base_config().to_json())
  now["negatives"]["index"]["group_rows"] = 80_000
  old = json.loads(json.dumps(now))
  index = old["negatives"].pop("index")  # the flat layout, as in the test above
  old["negatives"]["index"] = index.pop("kind")
  old["negatives"]["scann_leaves"] = index.pop("num_leaves")
  for name, value in index.items():
    old["negatives"][f"scann_{name}"] = value
  del old["train"]["freeze_old_rows"]  # written before the key existed
  (tmp_path / "config.json").write_text(json.dumps(old))
  back = run_config.saved_config(str(tmp_path))
  assert json.loads(back.to_json()) == now
  with pytest.raises(InputError, match=r"config\.json does not exist"):
    run_config.saved_config(str(tmp_path / "nowhere"))
