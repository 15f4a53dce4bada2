"""The checkpoint's progress record: typed, versioned, and checkpoints written before it had
a version (commit e26d41d's layout) still resume to the same run."""

import json
import shutil

import jax
import pytest

from astra_jax.runtime.degraded import Degraded
from astra_jax.runtime.errors import InputError
from astra_jax.training import checkpoint, train
from astra_jax.training.progress import VERSION, Progress

# The keys of the progress dict train.py saved before the record had a version, as that
# code wrote it (`save` in train_and_evaluate at e26d41d), listed here independently of
# progress.py.
UNVERSIONED_KEYS = (
  "epoch",
  "step",
  "global_step",
  "train_seconds",
  "evals",
  "negatives_per_epoch",
  "step_times",
  "phases",
  "hard_negatives",
  "degraded",
)
# The sparse step's optimizer state as checkpoints have always held it.
SPARSE_OPT_KEYS = {"encoder", "scale", "step", "loss_scale"}


def test_round_trip_and_copy():
  p = Progress(
    epoch=2,
    step=5,
    global_step=41,
    train_seconds=1.5,
    evals=[{"epoch": 1, "P@1": 10.0}],
    step_times=[0.1],
    degraded=Degraded(refreshes_late=2),
  )
  record = p.to_json()
  assert record["version"] == VERSION
  p.evals.append({"epoch": 2})  # the loop goes on while an asynchronous save writes
  assert len(record["evals"]) == 1
  back = Progress.from_json(json.loads(json.dumps(record)))
  assert back.global_step == 41 and back.degraded.refreshes_late == 2
  assert back.evals == [{"epoch": 1, "P@1": 10.0}]


def test_unversioned_record_without_the_later_fields():
  # The oldest records lack "phases" and "degraded" (and every record before VERSION 1 the
  # version): they read as version 0 with those fields at their defaults.
  old = {
    "epoch": 1,
    "step": 0,
    "global_step": 47,
    "train_seconds": 3.0,
    "evals": [],
    "negatives_per_epoch": [{"epoch": 0, "hard": 0, "random": 256, "source": None}],
    "step_times": [0.05],
    "hard_negatives": {"refreshes": []},
  }
  p = Progress.from_json(old)
  assert (p.epoch, p.step, p.global_step) == (1, 0, 47)
  assert p.phases is None and p.degraded == Degraded()


def test_a_newer_record_is_refused():
  with pytest.raises(InputError, match="version 99"):
    Progress.from_json({"version": 99, "epoch": 0})


@pytest.mark.e2e
def test_a_checkpoint_of_the_unversioned_layout_resumes_to_the_same_run(tmp_path, small_synthetic):
  c = small_synthetic(strategy="random")
  c.train.epochs = 2
  c.train.stop_after_steps = 30
  new = tmp_path / "new"
  with pytest.raises(checkpoint.Preempted):
    train.train_and_evaluate(c, str(new))
  # The same checkpoint rewritten as e26d41d's code wrote it: the same arrays, the progress
  # dict of UNVERSIONED_KEYS without "version".
  old = tmp_path / "old"
  shutil.copytree(new, old)
  shutil.rmtree(old / "checkpoints")
  ck = checkpoint.Checkpoints(str(new))
  (step,) = ck.manager.all_steps()
  meta = ck.manager.item_metadata(step)["state"]
  template = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)
  restored = ck.manager.restore(
    step,
    args=checkpoint.ocp.args.Composite(
      state=checkpoint.ocp.args.StandardRestore(template),
      progress=checkpoint.ocp.args.JsonRestore(),
    ),
  )
  ck.close()
  assert set(restored["state"]["opt_state"]) == SPARSE_OPT_KEYS  # the layout is unchanged
  record = restored["progress"]
  assert record["version"] == VERSION and record["global_step"] == 30
  ck = checkpoint.Checkpoints(str(old))
  ck.save(
    step,
    restored["state"]["params"],
    restored["state"]["opt_state"],
    {k: record[k] for k in UNVERSIONED_KEYS},
  )
  ck.close()

  c.train.stop_after_steps = 0
  from_new = train.train_and_evaluate(c, str(new))
  from_old = train.train_and_evaluate(c, str(old))
  assert from_old["steps"] == from_new["steps"] > 30
  assert from_old["metrics"] == from_new["metrics"]

  def drop_time(evals):  # the runs' wall-clock times differ
    return [{k: v for k, v in e.items() if k != "train_time_s"} for e in evals]

  assert drop_time(from_old["evaluations"]) == drop_time(from_new["evaluations"])
  assert from_old["negatives"]["per_epoch"] == from_new["negatives"]["per_epoch"]
