"""Faults a long run meets: a damaged checkpoint, a full disk, a refresh that fails. Each is
survived (the run resumes from what is whole and ends with the uninterrupted run's metrics)
or named in one line; none ends in a traceback. (benchmarks/faults.py tries every file of
a checkpoint.)"""

import errno
import hashlib
import json
import os
import random
import shutil
import subprocess

import jax
import numpy as np
import pytest

from astra_jax.data import xc_format
from astra_jax.runtime import faults
from astra_jax.runtime.degraded import Degraded
from astra_jax.runtime.errors import InputError
from astra_jax.training import checkpoint, train


def _run(demo, workdir, data_dir, *extra):
  p = subprocess.run(
    demo.command(workdir, data_dir) + list(extra),
    cwd=demo.cwd,
    env=demo.env,
    text=True,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    timeout=600,
  )
  return p.returncode, p.stdout


def _digests(directory) -> dict:
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      out[os.path.relpath(path, directory)] = hashlib.md5(open(path, "rb").read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_command):
  """An uninterrupted run of the `demo_command` fixture's command: (workdir, data dir)."""
  base = tmp_path_factory.mktemp("faults")
  rc, out = _run(demo_command, base / "ref", base / "data")
  assert rc == 0, out[-3000:]
  return base / "ref", base / "data"


def _tiny_checkpoints(directory, steps=(1, 2)) -> checkpoint.Checkpoints:
  ck = checkpoint.Checkpoints(str(directory))
  params = {"encoder": {"w": jax.numpy.arange(1000.0)}, "classifier": jax.numpy.ones((50, 8))}
  for step in steps:
    ck.save(step, params, {"scale": jax.numpy.float32(step)}, {"step": step})
  ck.wait()
  return ck


# ------------------------------------------------------------------ damaged checkpoints
def test_every_truncated_or_deleted_file_of_a_checkpoint_is_named(tmp_path):
  ck = _tiny_checkpoints(tmp_path / "wd")
  ck.close()
  step_dir = tmp_path / "wd" / "checkpoints" / "2"
  files = checkpoint.step_files(str(step_dir))
  assert "commit_success.txt" in files and any(f.startswith("state/") for f in files)
  assert checkpoint.damage(str(step_dir)) is None
  for rel, size in files.items():
    for how in ("truncate", "delete"):
      broken = tmp_path / f"broken_{how}"
      shutil.rmtree(broken, ignore_errors=True)
      shutil.copytree(step_dir, broken)
      if how == "delete":
        os.remove(broken / rel)
      else:
        os.truncate(broken / rel, size // 2)
      problem = checkpoint.damage(str(broken))
      if rel.endswith("commit_success.txt") and how == "delete":
        assert problem and "commit_success.txt is missing" in problem, (rel, problem)
      elif size:  # (an empty file truncated is the same file)
        assert problem and rel in problem, (rel, how, problem)


def test_the_newest_whole_checkpoint_is_restored_and_the_damaged_ones_set_aside(tmp_path):
  ck = _tiny_checkpoints(tmp_path, steps=(1, 2, 3))
  ck.close()
  os.remove(tmp_path / "checkpoints" / "3" / "commit_success.txt")
  # 2 has no manifest (sealed by no one) and a file its restore needs truncated.
  os.remove(tmp_path / "checkpoints" / "2" / checkpoint.MANIFEST)
  with open(tmp_path / "checkpoints" / "2" / "state" / "_METADATA", "r+") as f:
    f.truncate(10)
  ck = checkpoint.Checkpoints(str(tmp_path))
  params = {"encoder": {"w": jax.numpy.zeros(1000)}, "classifier": jax.numpy.zeros((50, 8))}
  p, o, progress = ck.restore(params, {"scale": jax.numpy.float32(0)})
  ck.close()
  assert progress == {"step": 1} and float(o["scale"]) == 1.0
  np.testing.assert_array_equal(p["encoder"]["w"], np.arange(1000.0))
  assert [s for s, _ in ck.set_aside] == [3, 2]
  assert sorted(os.listdir(tmp_path / "checkpoints" / "damaged")) == ["2", "3"]
  assert "JSONDecodeError" in ck.set_aside[1][1]


def test_when_no_checkpoint_restores_the_run_stops_naming_the_workdir(tmp_path):
  _tiny_checkpoints(tmp_path, steps=(1,)).close()
  os.remove(tmp_path / "checkpoints" / "1" / "state" / "_METADATA")
  params = {"encoder": {"w": jax.numpy.zeros(1000)}, "classifier": jax.numpy.zeros((50, 8))}
  for _ in range(2):  # and a rerun does not quietly start over
    ck = checkpoint.Checkpoints(str(tmp_path))
    with pytest.raises(InputError, match=f"{tmp_path}: no checkpoint restores"):
      ck.restore(params, {"scale": jax.numpy.float32(0)})
    ck.close()
  assert os.listdir(tmp_path / "checkpoints" / "damaged") == ["1"]


@pytest.mark.slow
def test_a_truncated_file_or_a_missing_commit_marker_resumes_from_the_previous_checkpoint(
  reference, tmp_path, demo_command
):
  ref, data = reference
  wd = tmp_path / "wd"
  shutil.copytree(ref, wd)
  want = json.load(open(ref / "results.json"))["metrics"]
  rng = random.Random(25)
  for fault in ("truncate", "no commit marker"):
    *_, previous, latest = sorted(int(d) for d in os.listdir(wd / "checkpoints") if d.isdigit())
    step_dir = wd / "checkpoints" / str(latest)
    if fault == "truncate":
      files = [f for f, size in checkpoint.step_files(str(step_dir)).items() if size]
      victim = rng.choice(sorted(files))
      os.truncate(step_dir / victim, os.path.getsize(step_dir / victim) // 2)
    else:
      os.remove(step_dir / "commit_success.txt")
    rc, out = _run(demo_command, wd, data)
    assert rc == 0, out[-3000:]
    warnings = [line for line in out.splitlines() if "is damaged" in line]
    assert len(warnings) == 1 and f"checkpoint {latest} is damaged" in warnings[0], warnings
    assert "Traceback" not in out
    assert f"resumed from {wd}/checkpoints/{previous}\n" in out
    r = json.load(open(wd / "results.json"))
    assert r["metrics"] == want  # bitwise on CPU
    assert os.path.isdir(wd / "checkpoints" / "damaged" / str(latest))
  assert r["degraded"]["checkpoints_set_aside"] == 1  # this run's, after its own resume


# -------------------------------------------------------------------------- a full disk
def _mount_tmpfs(path, size: str) -> bool:
  os.makedirs(path, exist_ok=True)
  return (
    subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode
    == 0
  )


@pytest.mark.slow
def test_a_full_disk_stops_in_one_line_and_the_same_command_finishes_once_space_is_freed(
  reference, tmp_path, demo_command
):
  ref, data = reference
  disk = tmp_path / "disk"
  if not _mount_tmpfs(disk, "40m"):
    pytest.skip("mounting a size-limited tmpfs is not permitted here")
  try:
    wd = disk / "wd"
    rc, out = _run(demo_command, wd, data, "--config.train.stop_after_steps=12")
    assert rc == 75, out[-3000:]
    intact = _digests(wd / "checkpoints")
    filler = disk / "filler"  # leaves less than a checkpoint needs
    with open(filler, "wb") as f:
      f.write(b"\0" * (faults.free_bytes(str(disk)) - 2_500_000))
    rc, out = _run(demo_command, wd, data)
    assert rc not in (0, 75), out[-3000:]
    assert "Traceback" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: ") and "cannot write (no space left" in last, last
    assert "needed about" in last and str(wd) in last
    assert _digests(wd / "checkpoints") == intact
    os.remove(filler)
    rc, out = _run(demo_command, wd, data)
    assert rc == 0, out[-3000:]
    assert (
      json.load(open(wd / "results.json"))["metrics"]
      == json.load(open(ref / "results.json"))["metrics"]
    )
  finally:
    subprocess.run(["umount", str(disk)], capture_output=True)


def test_disk_errors_are_recognised_through_the_libraries_that_wrap_them(tmp_path):
  wrapped = ValueError(
    'RESOURCE_EXHAUSTED: Error writing "x": Failed to write 9 bytes to '
    f"file 9: {os.strerror(errno.ENOSPC)} [OS error: 28]"
  )
  assert faults.disk_error_code(RuntimeError("save failed").with_traceback(None)) is None
  try:
    try:
      raise wrapped
    except ValueError as e:
      raise RuntimeError("Save Finalize thread failed") from e
  except RuntimeError as e:
    assert faults.disk_error_code(e) == (errno.ENOSPC, None)
  ro = OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "a.json"))
  with pytest.raises(
    faults.DiskFull,
    match=r"a\.json: cannot write \(read-only file "
    r"system\): it needed about 1\.5 KB \(estimate\).*make it writable",
  ):
    with faults.writing(str(tmp_path), 1500):
      raise ro
  with pytest.raises(KeyError):  # anything else passes through
    with faults.writing(str(tmp_path), 1):
      raise KeyError("x")


def test_a_checkpoint_that_cannot_be_written_leaves_the_previous_one_as_it_was(
  tmp_path, monkeypatch
):
  ck = _tiny_checkpoints(tmp_path, steps=(1,))
  before = _digests(tmp_path / "checkpoints")
  monkeypatch.setattr(faults, "free_bytes", lambda path: 1000)  # a nearly full disk
  params = {"encoder": {"w": jax.numpy.arange(1000.0)}, "classifier": jax.numpy.ones((50, 8))}
  with pytest.raises(
    faults.DiskFull,
    match=r"checkpoints/2: cannot write .* needed about "
    r"1\.1 MB \(estimate\), 1\.0 KB free",
  ):
    ck.save(2, params, {"scale": jax.numpy.float32(2)}, {"step": 2})
  ck.close()
  assert _digests(tmp_path / "checkpoints") == before


# ------------------------------------------------------------------- no silent fallback
@pytest.mark.e2e
def test_fallbacks_are_counted_and_survive_resume_and_results_that_cannot_be_written(
  tmp_path, monkeypatch, small_synthetic
):
  c = small_synthetic(tau_s=2, tau_r=1, inject_fault="raise")  # epoch 2's fails
  c.train.epochs, c.train.eval_every_epochs, c.eval.max_test_rows = 3, 1, 100
  wd = tmp_path / "wd"
  real = xc_format.atomic_text_writer

  def full_disk(path, *a, **k):  # the write call of results.json fails
    if os.fspath(path).endswith("results.json"):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{path}.tmp-1")
    return real(path, *a, **k)

  monkeypatch.setattr(xc_format, "atomic_text_writer", full_disk)
  with pytest.raises(faults.DiskFull, match=r"results\.json\.tmp-1: cannot write"):
    train.train_and_evaluate(c, str(wd))
  assert not (wd / "results.json").exists()
  monkeypatch.setattr(xc_format, "atomic_text_writer", real)  # space freed
  r = train.train_and_evaluate(c, str(wd))  # resumes from the final checkpoint
  assert [x["ok"] for x in r["negatives"]["refreshes"]] == [False]
  # Epoch 2 trains with random negatives in place of hard ones, two periodic evaluations on
  # 100 of 500 test rows; counted in the first run, kept through the rerun's resume.
  assert r["degraded"] == {
    **Degraded().to_json(),
    "refreshes_failed": 1,
    "epochs_random_for_hard": 1,
    "epochs_without_their_refresh": 1,
    "evals_on_subset": 2,
  }
  assert json.load(open(wd / "results.json"))["degraded"] == r["degraded"]


def test_a_degraded_record_of_an_older_checkpoint_reads_as_zeros():
  assert Degraded.from_json(None) == Degraded()
  assert Degraded.from_json({"refreshes_failed": 2, "a_later_field": 1}).refreshes_failed == 2


class _Schedule:
  """Refreshes due at epochs 2 and 3; an epoch wants 4 hard negatives."""

  refresh_epochs = (2, 3)

  def split(self, epoch, have):
    return 4, 0


class _Negatives:
  def __init__(self, refreshes, current_epoch):
    self.refreshes, self.current_epoch = refreshes, current_epoch
    self.schedule, self.shards, self.num_rows, self.dir = _Schedule(), [[0, 10]], 5, "negs"


def test_every_epoch_without_its_refresh_is_counted_and_fail_stops_in_one_line():
  from astra_jax.negatives.schedule import NegativeSplit
  from astra_jax.runtime.degraded import RefreshFailedStop, note_epoch_start

  failed = {"epoch": 2, "ok": False, "error": "killed by signal 9"}
  d = Degraded()
  # Epoch 2's refresh failed (random negatives in place of hard ones); epoch 3's too, with
  # no older negatives; epoch 4 still lacks its newest (epoch 3's) refresh.
  note_epoch_start(d, _Negatives([failed], None), 0, 2, True, NegativeSplit(0, 8, 8))
  note_epoch_start(
    d, _Negatives([failed, dict(failed, epoch=3)], None), 1, 3, True, NegativeSplit(0, 8, 8)
  )
  note_epoch_start(
    d, _Negatives([failed, dict(failed, epoch=3)], None), 2, 4, False, NegativeSplit(0, 8, 8)
  )
  assert (d.refreshes_failed, d.epochs_without_their_refresh, d.epochs_random_for_hard) == (2, 3, 3)
  # A later refresh that succeeded ends the count; an epoch before any refresh is not one.
  ok = {"epoch": 3, "ok": True, "wait_s": 0.0}
  note_epoch_start(d, _Negatives([ok], 3), 0, 3, True, NegativeSplit(4, 4, 4))
  note_epoch_start(d, _Negatives([], None), 0, 1, False, NegativeSplit(0, 8, 8))
  assert d.epochs_without_their_refresh == 3
  with pytest.raises(
    RefreshFailedStop,
    match=r"the refresh for epoch 2 failed \(killed by "
    r"signal 9\); negatives.on_refresh_failure=fail stops the run",
  ):
    note_epoch_start(
      Degraded(), _Negatives([failed], None), 0, 2, True, NegativeSplit(0, 8, 8), on_failure="fail"
    )
