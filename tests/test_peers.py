"""The XC libraries users compare with (evaluation/peers.py, peer_runner.py): every peer on a
dataset whose answer is known by construction, through the baselines command, and what a
user without the peers' environment is told. The peers run in .venv-peers (`make peers`,
which `make test` builds first); without it these tests skip and say so."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from astra_jax.data import xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import baselines, peers
from astra_jax.runtime.errors import InputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYWORDS = ["emacs", "python", "perl", "ruby", "golang", "haskell", "fonts", "java"]
FILLER = "tool library for the data files with support and extra utilities".split()


def _peers_python() -> str:
  try:
    return peers.peers_python()
  except InputError as e:
    pytest.skip(f"no peers' environment: {e}")


def _keyword_dataset(d, seed: int = 0) -> None:
  """Label j is keyword j: a row names its 1-2 labels' keywords among filler words, so a
  linear model over word features ranks exactly its labels first."""
  rng = np.random.default_rng(seed)

  def rows(n):
    texts, labels = [], []
    for _ in range(n):
      pos = sorted(rng.choice(len(KEYWORDS), rng.integers(1, 3), replace=False).tolist())
      words = [KEYWORDS[p] for p in pos] + list(rng.choice(FILLER, 3))
      rng.shuffle(words)
      texts.append(" ".join(words))
      labels.append(pos)
    return texts, SparseRows.from_lists(labels, len(KEYWORDS))

  os.makedirs(d / "raw_data")
  for split, n, name in (("train", 300, "trn"), ("test", 40, "tst")):
    texts, labels = rows(n)
    xc_format.write_texts(d / "raw_data" / f"{split}.raw.txt", texts, layout="uid")
    xc_format.write_sparse(d / f"{name}_X_Y.txt", labels)
  xc_format.write_texts(d / "raw_data" / "label.raw.txt", KEYWORDS, layout="uid")


def test_features_are_unit_rows_of_two_equal_blocks():
  pytest.importorskip("sklearn")
  train, test = peers.features(["python tools", "perl data"], ["python data", "zzz"])
  assert train.shape[1] == test.shape[1]
  norms = np.sqrt(np.asarray(train.multiply(train).sum(1))).ravel()
  np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
  # The word block comes first: 1-2-grams "data", "perl", "perl data", "python", "python
  # tools", "tools" (6 columns), half of each row's squared norm; the characters the rest.
  for row in train.toarray():
    assert (row[:6] ** 2).sum() == pytest.approx(0.5, rel=1e-5)
  # A test text with no known n-gram is an all-zero row, not a NaN one.
  assert np.isfinite(test.toarray()).all() and test[1].nnz == 0


@pytest.mark.parametrize("method", sorted(peers.PEERS))
def test_each_peer_ranks_the_keyword_labels_first(tmp_path, method):
  python = _peers_python()
  _keyword_dataset(tmp_path)
  data = baselines.load_texts(str(tmp_path))
  got = peers.rank(
    [method], data.train_texts, data.train_labels, data.test_texts, python, threads=1
  )[method]
  assert got.top.shape == (40, peers.RANKED) and got.train_seconds > 0
  for i in range(data.test_labels.num_rows):
    truth = set(data.test_labels.row(i).tolist())
    assert set(got.top[i, : len(truth)].tolist()) == truth, (method, i)


def test_cli_prints_the_peers_beside_the_floors(tmp_path):
  python = _peers_python()
  _keyword_dataset(tmp_path / "ds")
  out = tmp_path / "results.json"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.baselines",
      f"--data={tmp_path / 'ds'}",
      "--methods=popularity,bonsai",
      f"--peers_python={python}",
      f"--output={out}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert "| label popularity |" in r.stdout and "| Bonsai (omikuji 0.5.2) |" in r.stdout
  assert "PSP@5" in r.stdout and "train + predict s" in r.stdout
  results = json.loads(out.read_text())
  assert results["Bonsai (omikuji 0.5.2)"]["P@1"] == pytest.approx(100.0)
  assert results["label popularity"]["P@1"] < 50


def test_a_missing_environment_says_how_to_build_it(tmp_path, monkeypatch):
  monkeypatch.delenv("ASTRA_PEERS_PYTHON", raising=False)
  with pytest.raises(InputError, match="make peers"):
    peers.peers_python(str(tmp_path / "no" / "python"))
  _keyword_dataset(tmp_path / "ds")
  data = baselines.load_texts(str(tmp_path / "ds"))
  with pytest.raises(InputError, match="unknown"):
    baselines.run_all(data, methods=("popularity", "svm"))


def test_a_training_run_records_the_peers_on_its_test_split(tmp_path, load_config, monkeypatch):
  python = _peers_python()
  _keyword_dataset(tmp_path / "ds")
  c = load_config("experiments/xc_text.py", "ngram")
  c.data.dir = str(tmp_path / "ds")
  c.eval.peers = "plt"
  monkeypatch.setenv("ASTRA_PEERS_PYTHON", python)
  got = baselines.for_training_run(c)
  (plt,) = got["peer_baselines"].values()
  assert plt["P@1"] == pytest.approx(100.0) and "PSP@5" in plt and plt["train_seconds"] > 0
  assert "tfidf_knn_baseline" not in got  # eval.tfidf_baseline is off
