import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpy_bert
import pytest

from astra_jax.ann import exact_topk
from astra_jax.data import xc_format
from astra_jax.evaluation import metrics
from astra_jax.model.weights import hf_name
from astra_jax.serving import export
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train


def test_blocked_topk_equals_dense_ranking():
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(37, 8)).astype(np.float32)
  w = rng.normal(size=(1003, 8)).astype(np.float32)  # not a multiple of the label block
  scores, ids = exact_topk.topk(emb, jnp.asarray(w), k=7, query_block=16, label_block=128)
  dense = emb @ w.T
  want = np.argsort(-dense, axis=1, kind="stable")[:, :7]
  np.testing.assert_array_equal(ids, want)
  np.testing.assert_allclose(scores, np.take_along_axis(dense, want, 1), rtol=1e-5)


def test_k_larger_than_labels():
  s, i = exact_topk.topk(np.ones((2, 3), np.float32), jnp.eye(3, dtype=jnp.float32), k=10)
  assert i.shape == (2, 3) and sorted(i[0]) == [0, 1, 2]


# ---------------------------------------------------------------- a trained tiny demo
@pytest.fixture(scope="module")
def trained(tmp_path_factory, load_config):
  """(workdir, data dir): the demo config shrunk to 200 labels, trained for 2 epochs."""
  root = tmp_path_factory.mktemp("serve")
  c = load_config("experiments/demo.py")
  c.data.dir = str(root / "data")
  c.data.synthetic.num_labels = 200
  c.data.synthetic.num_train = 2000
  c.data.synthetic.num_test = 300
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 2, 64, 0
  c.optim.warmup_steps = 20
  # The final evaluation exact on 200 of the 300 test rows, and all 300 through the index.
  c.eval.search, c.eval.final_max_rows = "scann", 200
  train.train_and_evaluate(c, str(root / "wd"))
  return str(root / "wd"), str(root / "data")


@pytest.fixture(scope="module")
def exact(trained):
  return Predictor.from_workdir(trained[0], index="exact")


@pytest.fixture(scope="module")
def scann(trained):
  return Predictor.from_workdir(trained[0], index="scann")


def _test_texts(data_dir, n=None):
  return xc_format.read_texts(os.path.join(data_dir, "tst_X.txt"))[:n]


@pytest.mark.e2e
def test_training_exports_a_self_contained_model(trained):
  wd, data = trained
  m = os.path.join(wd, "model")
  meta = json.load(open(os.path.join(m, "model.json")))
  assert meta["num_labels"] == 200 and meta["max_len"] == 24 and meta["embed_dim"] == 64
  assert np.load(os.path.join(m, "classifier.npy")).shape == (200, 64)
  assert open(os.path.join(m, "labels.txt")).read() == open(os.path.join(data, "Y.txt")).read()
  for name in os.listdir(os.path.join(data, "tokenizer")):
    assert (
      open(os.path.join(m, "tokenizer", name), "rb").read()
      == open(os.path.join(data, "tokenizer", name), "rb").read()
    )
  assert json.load(open(os.path.join(m, "config.json")))["train"]["epochs"] == 2
  assert not [f for f in os.listdir(wd) if f.startswith(".model")]  # no temporaries left
  # every file readable as the umask allows (safetensors' save_file would make it 0600)
  mode = lambda name: os.stat(os.path.join(m, name)).st_mode & 0o777
  assert mode("encoder.safetensors") == mode("classifier.npy") == mode("model.json")


@pytest.mark.e2e
def test_a_model_with_few_labels_predicts_with_exact_search(exact):
  # ScaNN cannot partition 12 rows into its 16 leaves: such a model is searched exactly.
  small = dataclasses.replace(exact.model, classifier=exact.model.classifier[:12])
  p = Predictor(small, index="scann")
  assert p.index_kind == "exact"
  ids = p.predict(["apple"], k=5).ids
  assert ids.shape == (1, 5) and (ids >= 0).all() and (ids < 12).all()


@pytest.mark.e2e
def test_exact_topk_equals_numpy_bruteforce(trained, exact):
  """Tokens as training cached them, a numpy BERT over the exported weights, a dense
  ranking over the exported W: the predictor's exact path must give the same top-k."""
  wd, data = trained
  from safetensors.numpy import load_file

  texts = _test_texts(data, 12)
  tokens = np.load(os.path.join(data, "astra_cache", "tst_X.L24.tokens.npy"))[:12]
  np.testing.assert_array_equal(exact.to_tokens(texts)[0], tokens)
  meta = json.load(open(os.path.join(wd, "model", "model.json")))
  enc = meta["encoder"]
  hf = {}  # our parameter names -> HF checkpoint names, which numpy_bert reads
  for name, t in load_file(os.path.join(wd, "model", "encoder.safetensors")).items():
    path = name.split("/")
    hf[hf_name(path, "bert")] = t.T if path[-1] == "kernel" else t
  cfg = {
    "hidden_size": enc["hidden_size"],
    "num_attention_heads": enc["num_heads"],
    "num_hidden_layers": enc["num_layers"],
    "layer_norm_eps": enc["layer_norm_eps"],
  }
  emb = numpy_bert.forward(hf, cfg, tokens, meta["pad_id"])
  w = np.load(os.path.join(wd, "model", "classifier.npy")).astype(np.float64)
  dense = emb @ w.T
  want = np.argsort(-dense, axis=1, kind="stable")[:, :5]
  assert exact.seq_buckets == (8, 16, 24)  # the encoder sees 16 or 24 columns here
  got = exact.predict(texts, k=5)
  np.testing.assert_array_equal(got.ids, want)
  np.testing.assert_allclose(got.scores, np.take_along_axis(dense, want, 1), rtol=1e-4, atol=1e-4)
  labels = open(os.path.join(data, "Y.txt")).read().splitlines()
  assert got.labels[3] == [labels[j] for j in want[3]]


@pytest.mark.e2e
def test_scann_precision_within_a_point_of_exact(trained, exact, scann):
  _, data = trained
  texts = _test_texts(data)
  truth = xc_format.read_sparse(os.path.join(data, "tst_X_Y.txt"))
  a, b = exact.predict(texts, k=5), scann.predict(texts, k=5)
  pa, pb = metrics.compute(a.ids, truth, ks=(1, 5)), metrics.compute(b.ids, truth, ks=(1, 5))
  for key in ("P@1", "P@5"):
    assert abs(pa[key] - pb[key]) <= 0.01, (pa, pb)
  same = np.mean([len(set(x) & set(y)) / 5 for x, y in zip(a.ids, b.ids)])
  assert same >= 0.95
  # Scores of the labels both found are the same exact dot products.
  both = a.ids[:, 0] == b.ids[:, 0]
  np.testing.assert_allclose(a.scores[both, 0], b.scores[both, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
def test_the_ann_evaluation_is_what_the_served_model_predicts(trained, scann):
  wd, data = trained
  with open(os.path.join(wd, "results.json")) as f:
    results = json.load(f)
  ann = results["ann_eval"]
  assert ann["index"] == "scann" and ann["rows"] == 300 and ann["sample_rows"] == 200
  assert ann["sample_exact"] == results["metrics"] and results["num_test_evaluated"] == 200
  # Independently: the served Predictor's answers to the raw test texts, scored here.
  truth = xc_format.read_sparse(os.path.join(data, "tst_X_Y.txt"))
  ids = scann.predict(_test_texts(data), k=5).ids
  for rows, got in ((300, ann["metrics"]), (200, ann["sample_ann"])):
    want = metrics.compute(ids[:rows], truth.head(rows), ks=(1, 3, 5))
    for key in ("P@1", "P@5", "nDCG@3"):
      assert abs(100 * want[key] - got[key]) < 1e-3, (rows, key, want[key], got[key])
  assert all(abs(g) <= 2.0 for g in ann["sample_gap"].values()), ann["sample_gap"]


@pytest.mark.e2e
def test_scann_index_is_saved_once_and_reloaded(trained, scann):
  wd, _ = trained
  index_dir = os.path.join(wd, "model", "scann")
  meta_file = os.path.join(index_dir, "astra_index.json")
  mtimes = {f: os.stat(os.path.join(index_dir, f)).st_mtime_ns for f in os.listdir(index_dir)}
  assert "scann_assets.pbtxt" in mtimes and "astra_index.json" in mtimes
  # Built once, by the training run's ANN evaluation (eval.search=scann); both the module's
  # Predictor and this one reload it.
  again = Predictor.from_workdir(wd)
  assert again.index.loaded and scann.index.loaded
  assert mtimes == {
    f: os.stat(os.path.join(index_dir, f)).st_mtime_ns for f in os.listdir(index_dir)
  }
  texts = _test_texts(trained[1], 50)
  np.testing.assert_array_equal(again.predict(texts).ids, scann.predict(texts).ids)
  # Other knobs: rebuilt and saved for them.
  other = Predictor.from_workdir(wd, scann_knobs={"leaves_to_search": 3})
  assert not other.index.loaded
  assert json.load(open(meta_file))["params"]["num_leaves_to_search"] == 3
  # A directory that another process is replacing (here: an asset already gone) is built
  # anew, not a crash.
  os.remove(os.path.join(index_dir, "scann_config.pb"))
  rebuilt = Predictor.from_workdir(wd, scann_knobs={"leaves_to_search": 3})
  assert not rebuilt.index.loaded
  np.testing.assert_array_equal(rebuilt.predict(texts).ids, other.predict(texts).ids)


@pytest.mark.e2e
def test_scann_candidates_are_rescored_exactly_and_short_rows_completed(trained, exact):
  wd, data = trained
  p = Predictor.from_workdir(wd, scann_knobs={"leaves_to_search": 1, "reorder": 10})
  emb = exact.encode(exact.to_tokens(_test_texts(data, 100))[0])
  w = np.load(os.path.join(wd, "model", "classifier.npy"))
  s, i = p.index.search(emb, 5)
  np.testing.assert_allclose(s, np.einsum("nkd,nd->nk", w[i], emb), rtol=1e-5, atol=1e-5)
  assert (np.diff(s, axis=1) <= 0).all()
  # One leaf holds fewer than 60 rows: ScaNN comes back short and exact search completes.
  s, i = p.index.search(emb, 60)
  es, ei = exact.index.search(emb, 60)
  assert all(set(a) == set(b) for a, b in zip(i, ei))
  np.testing.assert_allclose(s, es, rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
def test_scann_build_is_deterministic(trained, exact):
  from astra_jax.ann.index import ScannIndex
  from astra_jax.serving.serve_index import serving_params

  w = np.load(os.path.join(trained[0], "model", "classifier.npy"))
  emb = exact.encode(exact.to_tokens(_test_texts(trained[1], 100))[0])
  params = serving_params(len(w), leaves_to_search=3)
  a, b = ScannIndex(w, 10, params).search(emb, 10), ScannIndex(w, 10, params).search(emb, 10)
  np.testing.assert_array_equal(a, b)


@pytest.mark.e2e
def test_bad_inputs_get_a_message_and_do_not_stop_the_batch(exact):
  good = ["pesi zeka rode", "lelu bemuti kimo"]
  long = " ".join(["pesi zeka rode"] * 5000)
  out = exact.predict([good[0], "", "   ", b"\xff\xfeabc", long, 7, good[1]], k=3)
  assert out.errors[1] == out.errors[2] == "empty query"
  assert out.errors[3].startswith("not valid UTF-8") and "byte 0" in out.errors[3]
  assert out.errors[5] == "expected a string, got int"
  assert (
    out.errors[4] is None
    and "truncated to the trained max_len of 24 tokens (had 15002)" in out.warnings[4]
  )
  for i in (1, 2, 3, 5):
    assert (out.ids[i] == -1).all() and out.record(i) == {"error": out.errors[i]}
  alone = exact.predict(good, k=3)
  np.testing.assert_array_equal(out.ids[[0, 6]], alone.ids)
  # The overlong text predicts as its first max_len tokens.
  cut = exact.predict([" ".join(long.split()[:22])], k=3)  # [CLS] + 22 words + [SEP]
  np.testing.assert_array_equal(out.ids[4], cut.ids[0])
  assert cut.warnings[0] is None
  with pytest.raises(ValueError, match="k must be >= 1"):
    exact.predict(good, k=0)


@pytest.mark.e2e
def test_cli_writes_the_api_predictions(trained, scann, tmp_path, repo_root):
  wd, data = trained
  queries = _test_texts(data, 20)
  lines = (
    [q.encode() for q in queries[:10]]
    + [b"", b"caf\xe9 bad", b"x " * 3000]
    + [q.encode() for q in queries[10:]]
  )
  (tmp_path / "q.txt").write_bytes(b"\n".join(lines) + b"\n")
  cmd = [
    sys.executable,
    "-m",
    "astra_jax.predict",
    f"--workdir={wd}",
    "--k=5",
    f"--input={tmp_path / 'q.txt'}",
    "--batch_size=7",
  ]
  r = subprocess.run(cmd, cwd=repo_root, capture_output=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  got = [json.loads(l) for l in r.stdout.decode().splitlines()]
  want = scann.predict(lines, k=5)
  assert [g["line"] for g in got] == list(range(1, len(lines) + 1))
  for i, g in enumerate(got):
    rec = want.record(i)
    assert g.pop("line") == i + 1
    assert g.keys() == rec.keys()
    if "error" in g:
      assert g == rec
    else:
      assert g["ids"] == rec["ids"] and g["labels"] == rec["labels"]
      np.testing.assert_allclose(g["scores"], rec["scores"], rtol=1e-5, atol=1e-6)
  assert got[10]["error"] == "empty query" and "UTF-8" in got[11]["error"]
  assert "truncated" in got[12]["warning"]
  # stdin, exact search: the same labels as the exact API.
  r = subprocess.run(
    [sys.executable, "-m", "astra_jax.predict", f"--workdir={wd}", "--k=3", "--exact"],
    cwd=repo_root,
    input=b"\n".join(lines[:3]),
    capture_output=True,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  ex = Predictor.from_workdir(wd, index="exact").predict(lines[:3], k=3)
  assert [json.loads(l)["ids"] for l in r.stdout.decode().splitlines()] == ex.ids.tolist()


def test_workdir_without_a_finished_model(tmp_path, repo_root):
  with pytest.raises(export.ModelNotFoundError, match=f"{tmp_path}/model does not exist"):
    Predictor.from_workdir(str(tmp_path))
  (tmp_path / "model").mkdir()  # what a crash before the final rename could never leave,
  (tmp_path / "model" / "classifier.npy").write_bytes(b"")  # but a hand-made one can
  with pytest.raises(export.ModelNotFoundError, match=r"model\.json is missing"):
    Predictor.from_workdir(str(tmp_path))
  r = subprocess.run(
    [sys.executable, "-m", "astra_jax.predict", f"--workdir={tmp_path}"],
    cwd=repo_root,
    input=b"q\n",
    capture_output=True,
    timeout=300,
  )
  assert r.returncode == 1 and b"error: no finished model in workdir" in r.stderr
  assert str(tmp_path).encode() in r.stderr


@pytest.mark.e2e
def test_interrupted_export_leaves_the_previous_model(trained, tmp_path, monkeypatch):
  wd, _ = trained
  model = export.load_model(wd)
  kw = dict(
    encoder_cfg=model.encoder_cfg,
    encoder_params=model.encoder_params,
    tokenizer_dir=model.tokenizer_dir,
    max_len=24,
    pad_id=0,
  )
  export.save_model(str(tmp_path), classifier=np.zeros((200, 64), np.float32), **kw)
  first = export.load_model(str(tmp_path)).model_id

  def crash(*a, **k):
    raise OSError("disk full")

  monkeypatch.setattr(export.xc_format, "write_texts", crash)  # after W, before model.json
  with pytest.raises(OSError, match="disk full"):
    export.save_model(
      str(tmp_path), classifier=np.ones((200, 64), np.float32), label_texts=["a"] * 200, **kw
    )
  again = export.load_model(str(tmp_path))
  assert again.model_id == first and not again.classifier.any()
  assert sorted(os.listdir(tmp_path)) == ["model"]


def test_export_writes_each_shard_of_w_without_gathering_it(tmp_path):
  from jax.sharding import NamedSharding, PartitionSpec as P

  from astra_jax.parallel import sharding

  mesh = sharding.make_mesh(2, 4, jax.devices()[:8])  # two data replicas of each shard
  w = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32)
  path = str(tmp_path / "w.npy")
  export.write_classifier_rows(jax.device_put(w, NamedSharding(mesh, P("model"))), 10, path)
  np.testing.assert_array_equal(np.load(path), w[:10])  # padded rows [10, 12) left out


@pytest.mark.e2e
def test_a_model_that_filtered_own_items_never_predicts_the_query_itself(trained):
  """A run with data.filter_self records it; its Predictor drops the label whose text is the
  query's and otherwise keeps the unfiltered ranking's order."""
  wd, data = trained
  model = export.load_model(wd)
  assert model.meta["filter_self"] is False  # the demo's queries are not its labels
  names = model.label_texts
  queries = [names[3], names[7], "no label has this text"]
  plain = Predictor(model, index="exact").predict(queries, k=6)
  model.meta["filter_self"] = True
  own = Predictor(model, index="exact").predict(queries, k=5)
  for r, label in enumerate([3, 7, None]):
    want = [j for j in plain.ids[r] if j != label][:5]
    assert list(own.ids[r]) == want and label not in own.ids[r]
