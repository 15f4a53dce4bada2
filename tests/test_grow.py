"""Growing a trained model with new labels (serving/grow.py, `python -m astra_jax.extend`):
old ids and rows unchanged, new rows from their texts, retired labels masked, and every bad
input one error with nothing written."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from child_env import REPO, cpu_child_env
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.data import xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.parallel import sharding
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export, grow
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train

NEW = ["a label nobody trained", "another one, with its own words"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, load_config):
  """A workdir with the demo config shrunk to 100 labels, trained for 1 epoch."""
  root = tmp_path_factory.mktemp("grow")
  c = load_config("experiments/demo.py")
  c.data.dir = str(root / "data")
  c.data.synthetic.num_labels, c.data.synthetic.num_train = 100, 800
  c.data.synthetic.num_test = 50
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 64, 0
  c.optim.warmup_steps, c.negatives.k_r = 5, 32
  train.train_and_evaluate(c, str(root / "wd"))
  return str(root / "wd")


def _ranking(p: Predictor, texts: list[str]) -> np.ndarray:
  return p.predict(texts, k=p.num_labels).ids


@pytest.mark.e2e
def test_growing_appends_rows_from_texts_and_keeps_every_old_label(trained, tmp_path):
  old = Predictor.from_workdir(trained, index="exact")
  report = grow.grow_model(trained, NEW, str(tmp_path / "grown"))
  grown = Predictor.from_workdir(str(tmp_path / "grown"), index="exact")
  w_old, w_new = np.asarray(old.model.classifier), np.asarray(grown.model.classifier)
  assert report.old_labels == 100 and report.new_labels == 2 and w_new.shape[0] == 102
  np.testing.assert_array_equal(w_new[:100], w_old)  # bit for bit
  assert grown.model.label_texts == old.model.label_texts + NEW
  # Each new row: the ridge map from unit text embeddings to trained rows, fitted on all
  # 100 trained labels, applied to the new text's embedding (a least-squares reference:
  # the penalty as extra rows of the system).
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  z = np.c_[unit(old.encode(old.to_tokens(old.model.label_texts)[0])), np.ones(100)]
  lam = grow.RIDGE * np.trace(z.T @ z) / z.shape[1]
  system = np.r_[z, np.sqrt(lam) * np.eye(z.shape[1])]
  target = np.r_[w_old, np.zeros((z.shape[1], w_old.shape[1]))]
  mapping = np.linalg.lstsq(system, target, rcond=None)[0]
  want = np.c_[unit(old.encode(old.to_tokens(NEW)[0])), np.ones(2)] @ mapping
  np.testing.assert_allclose(w_new[100:], want, rtol=1e-3, atol=1e-4)
  assert report.fit_labels == 100 and 0 < report.fit_r2 <= 1
  # Old labels rank as before among themselves: the full ranking minus the new ids.
  texts = old.model.label_texts[:5]
  before, after = _ranking(old, texts), _ranking(grown, texts)
  for b, a in zip(before, after):
    np.testing.assert_array_equal(a[a < 100], b)
  meta = grown.model.meta
  assert meta["grown_from"] == {
    "model_id": old.model.meta["model_id"],
    "num_labels": 100,
    "trained_labels": 100,
  }


@pytest.mark.e2e
def test_a_retired_label_is_never_predicted_and_keeps_its_id(trained, tmp_path):
  old = Predictor.from_workdir(trained, index="exact")
  texts = old.model.label_texts[:4]
  before = _ranking(old, texts)
  top = int(before[0, 0])
  grow.grow_model(trained, [], str(tmp_path / "g"), retire=[top])
  grown = Predictor.from_workdir(str(tmp_path / "g"), index="exact")
  after = grown.predict(texts, k=10).ids
  assert top not in after
  for b, a in zip(before, after):
    np.testing.assert_array_equal(a, b[b != top][:10])
  assert grown.model.meta["retired"] == [top] and grown.num_labels == 100


@pytest.mark.e2e
@pytest.mark.parametrize(
  "lines, retire, message",
  [
    (["fresh", ""], [], r"new\.txt:2: an empty label text"),
    (["fresh", "fresh"], [], r"new\.txt:2: 'fresh' repeats line 1's"),
    (None, [], r"new\.txt:1: .* repeats label 3's text"),
    (["fresh"], [101], r"retired label id 101 is outside the grown model's ids 0\.\.100"),
  ],
)
def test_bad_input_is_one_error_and_writes_nothing(trained, tmp_path, lines, retire, message):
  if lines is None:  # an existing label's text
    lines = [export.load_model(trained).label_texts[3]]
  path = tmp_path / "new.txt"
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(InputError, match=message):
    texts = grow.read_label_texts(str(path))
    grow.grow_model(trained, texts, str(tmp_path / "out"), retire, source_name=str(path))
  assert not os.path.exists(tmp_path / "out" / "model")


@pytest.mark.e2e
def test_a_model_of_another_format_is_refused(trained, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(trained + "/model", copy / "model")
  meta_path = copy / "model" / "model.json"
  meta = json.loads(meta_path.read_text())
  meta_path.write_text(json.dumps({**meta, "format_version": 99}))
  with pytest.raises(InputError, match="format_version 99"):
    grow.grow_model(str(copy), ["fresh"], str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out" / "model")


@pytest.mark.e2e
def test_the_command_grows_and_reports_errors_in_one_line(trained, tmp_path):
  new = tmp_path / "new.txt"
  new.write_text("\n".join(NEW) + "\n")
  cmd = [sys.executable, "-m", "astra_jax.extend", f"--workdir={trained}", f"--out={tmp_path}/g"]
  env = cpu_child_env(1)
  ok = subprocess.run(cmd + [f"--labels={new}"], env=env, cwd=REPO, capture_output=True, text=True)
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "grown: 100 labels + 2 new (ids 100..101)" in ok.stderr
  assert export.load_model(str(tmp_path / "g")).classifier.shape[0] == 102
  bad = tmp_path / "bad.txt"
  bad.write_text(NEW[0] + "\n")  # now an existing label of the grown model
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.extend",
      f"--workdir={tmp_path}/g",
      f"--labels={bad}",
      f"--out={tmp_path}/h",
    ],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert r.returncode != 0
  errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "repeats label 100's text" in errors[0]
  assert not os.path.exists(tmp_path / "h" / "model")


def _union_data(trained: str, out) -> str:
  """The trained run's dataset with NEW appended to its labels, each the positive of 10
  training rows: the data a few-shot update of the model grown by NEW trains on."""
  with open(os.path.join(trained, "config.json")) as f:
    src = json.load(f)["data"]["dir"]
  dst = str(out / "union")
  shutil.copytree(src, dst, ignore=shutil.ignore_patterns("astra_cache"))
  texts = xc_format.read_texts(os.path.join(dst, "Y.txt"))
  xc_format.write_texts(os.path.join(dst, "Y.txt"), texts + NEW, "lines")
  y = xc_format.read_sparse(os.path.join(dst, "trn_X_Y.txt"), 100)
  rows = [
    y.row(i).tolist() + ([100] if i < 10 else [101] if i < 20 else []) for i in range(y.num_rows)
  ]
  xc_format.write_sparse(os.path.join(dst, "trn_X_Y.txt"), SparseRows.from_lists(rows, 102))
  t = xc_format.read_sparse(os.path.join(dst, "tst_X_Y.txt"), 100)
  xc_format.write_sparse(
    os.path.join(dst, "tst_X_Y.txt"),
    SparseRows.from_lists([t.row(i).tolist() for i in range(t.num_rows)], 102),
  )
  return dst


@pytest.mark.e2e
def test_the_command_grows_then_trains_the_new_rows_alone(trained, tmp_path):
  data = _union_data(trained, tmp_path)
  new = tmp_path / "new.txt"
  new.write_text("\n".join(NEW) + "\n")
  out = tmp_path / "out"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.extend",
      f"--workdir={trained}",
      f"--labels={new}",
      f"--out={out}",
      f"--train_data={data}",
    ],
    env=cpu_child_env(1),
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "few-shot update (new_rows, 1 epochs)" in r.stderr
  with open(out / "results.json") as f:
    assert json.load(f)["trained"] == {"encoder": False, "classifier_rows": 2}
  before, grown = export.load_model(trained), export.load_model(str(out / "grown"))
  after = export.load_model(str(out))
  assert after.label_texts == before.label_texts + NEW
  w, w0 = np.asarray(after.classifier), np.asarray(grown.classifier)
  np.testing.assert_array_equal(w[:100], np.asarray(before.classifier))  # bit for bit
  assert not np.allclose(w[100:], w0[100:])  # the new rows trained
  for (p, a), (_, b) in zip(
    nnx_flat(after.encoder_params), nnx_flat(before.encoder_params), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(p))


def test_a_bad_few_shot_flag_is_one_error_before_anything_is_written(trained, tmp_path):
  from astra_jax.training import few_shot

  with pytest.raises(InputError, match="--update=everything: use one of new_rows, classifier, all"):
    few_shot.update_config(trained, "data", str(tmp_path / "g"), 1, "everything")
  with pytest.raises(InputError, match=r"config\.json does not exist"):
    few_shot.update_config(str(tmp_path), "data", str(tmp_path / "g"), 1, "new_rows")
  assert not os.listdir(tmp_path)


@pytest.mark.e2e
def test_continuing_maps_rows_by_text_and_needs_every_exported_label(trained, tmp_path):
  from astra_jax.training import export_start

  grow.grow_model(trained, NEW, str(tmp_path / "g"))
  grown = export.load_model(str(tmp_path / "g"))
  texts = grown.label_texts  # 102: the 100 trained labels, then NEW
  order = np.random.default_rng(0).permutation(102)
  data_texts = [texts[i] for i in order] + ["a label the export has never seen"]
  source, w, trained = export_start.export_rows(str(tmp_path / "g"), data_texts)
  np.testing.assert_array_equal(source, np.r_[order, -1])
  assert trained == 100  # the 2 grown rows were never trained
  # W padded past L and split over two devices of the mesh, as training holds it.
  mesh = sharding.make_mesh(4, 2)  # the 8 fake CPU devices: W in two row shards
  w0 = jax.device_put(np.zeros((104, w.shape[1]), np.float32), NamedSharding(mesh, P("model")))
  start = export_start.continue_classifier(w0, source, w)
  assert start.sharding == w0.sharding
  start = np.asarray(start)
  np.testing.assert_array_equal(start[:102], np.asarray(w)[order])
  assert not start[102:].any()  # the new label keeps its own start (here zero), and padding
  with pytest.raises(InputError, match=r"the export's label 7 .* and 0 more are not among"):
    export_start.export_rows(str(tmp_path / "g"), [t for t in texts if t != texts[7]])


def test_labels_that_share_a_text_are_matched_in_order(monkeypatch):
  from astra_jax.training import export_start

  fake = type(
    "Fake",
    (),
    {"label_texts": ["a", "b", "a", "c"], "meta": {}, "classifier": None, "trained_labels": 4},
  )
  monkeypatch.setattr(export, "load_model", lambda workdir: fake)
  # The data's first "a" gets the export's first "a" (row 0), its second the second (row 2).
  source, _, _ = export_start.export_rows("wd", ["c", "a", "a", "b", "new"])
  np.testing.assert_array_equal(source, [3, 0, 2, 1, -1])
  # A third "a" in the data is a new label; an "a" the data drops is a missing one.
  source, _, _ = export_start.export_rows("wd", ["a", "b", "a", "c", "a"])
  np.testing.assert_array_equal(source, [0, 1, 2, 3, -1])
  with pytest.raises(InputError, match=r"the export's label 2 \('a'\) and 0 more"):
    export_start.export_rows("wd", ["a", "b", "c"])


def test_the_rows_a_frozen_run_trains_are_those_the_export_never_trained():
  from astra_jax.training import export_start

  mesh = sharding.make_mesh(4, 2)
  # Data labels from export rows 3, (none), 0, 5, 1; the export trained rows 0..3 and was
  # grown with 4 and 5. Rows 5..7 pad W to the mesh.
  mask = export_start.new_rows(np.array([3, -1, 0, 5, 1]), 4, 8, NamedSharding(mesh, P("model")))
  assert mask.sharding.spec == P("model")
  np.testing.assert_array_equal(np.asarray(mask), [0, 1, 0, 1, 0, 0, 0, 0])


@pytest.mark.e2e
def test_a_model_grown_twice_counts_only_its_trained_rows(trained, tmp_path):
  grow.grow_model(trained, NEW[:1], str(tmp_path / "once"))
  grow.grow_model(str(tmp_path / "once"), NEW[1:], str(tmp_path / "twice"))
  assert export.load_model(trained).trained_labels == 100
  assert export.load_model(str(tmp_path / "once")).trained_labels == 100
  twice = export.load_model(str(tmp_path / "twice"))
  assert twice.meta["grown_from"]["num_labels"] == 101 and twice.trained_labels == 100


@pytest.mark.e2e
def test_continuing_with_zero_learning_rates_reproduces_the_model(trained, load_config, tmp_path):
  """A run from the export that changes nothing exports the same encoder and W."""
  c = load_config("experiments/demo.py")
  with open(os.path.join(trained, "config.json")) as f:
    data_dir = json.load(f)["data"]["dir"]
  c.data.dir = data_dir
  c.data.synthetic.num_labels, c.data.synthetic.num_train = 100, 800
  c.data.synthetic.num_test = 50
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 64, 0
  c.optim.warmup_steps, c.negatives.k_r = 5, 32
  c.train.init_from = trained
  c.optim.encoder_lr = c.optim.classifier_lr = 0.0
  c.optim.classifier_weight_decay = 0.0
  train.train_and_evaluate(c, str(tmp_path / "again"))
  before, after = export.load_model(trained), export.load_model(str(tmp_path / "again"))
  np.testing.assert_array_equal(np.asarray(after.classifier), np.asarray(before.classifier))
  for (p, a), (_, b) in zip(
    nnx_flat(after.encoder_params), nnx_flat(before.encoder_params), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(p))


def nnx_flat(params):
  from flax import nnx

  return [(p, v.get_value()) for p, v in nnx.to_flat_state(params)]
