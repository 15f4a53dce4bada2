"""astra_jax.baselines: popularity by hand, TF-IDF kNN against a dense reference, and the
floors docs/real_data.md reports on the real debian-recommends-20k when $ASTRA_TEST_DATA
names a directory that holds debian-recommends-20k.tar.gz."""

import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from astra_jax.data import xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import baselines

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_DATA_DIR = os.environ.get("ASTRA_TEST_DATA")
REAL_DATA = REAL_DATA_DIR and os.path.join(REAL_DATA_DIR, "debian-recommends-20k.tar.gz")


def _write(d, train, train_y, test, test_y, labels, num_labels):
  os.makedirs(d / "raw_data")
  xc_format.write_texts(d / "raw_data" / "train.raw.txt", train, layout="uid")
  xc_format.write_texts(d / "raw_data" / "test.raw.txt", test, layout="uid")
  xc_format.write_texts(d / "raw_data" / "label.raw.txt", labels, layout="uid")
  xc_format.write_sparse(d / "trn_X_Y.txt", SparseRows.from_lists(train_y, num_labels))
  xc_format.write_sparse(d / "tst_X_Y.txt", SparseRows.from_lists(test_y, num_labels))


def test_popularity_by_hand(tmp_path):
  # Label counts 2: 3 rows, 0: 2 rows, 1: 1 row -> every query gets [2, 0, 1].
  _write(
    tmp_path,
    ["a", "b", "c"],
    [[2, 0], [2, 0], [2, 1]],
    ["x", "y"],
    [[1], [2, 0]],
    ["l0", "l1", "l2"],
    3,
  )
  m = baselines.popularity(baselines.load_texts(str(tmp_path)), ks=(1, 3))
  assert m["P@1"] == pytest.approx(50.0) and m["P@3"] == pytest.approx(100 * 3 / 6)


def test_tfidf_knn_matches_a_dense_reference(tmp_path):
  pytest.importorskip("sklearn")
  from sklearn.feature_extraction.text import TfidfVectorizer

  rng = np.random.default_rng(0)
  words = "emacs python perl ruby lib dev doc tools gtk qt data fonts".split()
  text = lambda: " ".join(rng.choice(words, 3))
  train = [text() for _ in range(60)]
  test = [text() for _ in range(15)]
  train_y = [sorted(set(rng.integers(0, 9, 2).tolist())) for _ in train]
  test_y = [sorted(set(rng.integers(0, 9, 2).tolist())) for _ in test]
  _write(tmp_path, train, train_y, test, test_y, [f"l{i}" for i in range(9)], 9)
  got = baselines.tfidf_knn(baselines.load_texts(str(tmp_path)), ks=(1,), k=5)
  # Dense reference: cosine, top 5 neighbours, votes summed into a dense (n, L) matrix.
  vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True)
  sims = (vec.fit(train).transform(test) @ vec.transform(train).T).toarray()
  Y = SparseRows.from_lists(train_y, 9).to_dense()
  hits = 0
  for i, s in enumerate(sims):
    nb = np.argsort(-s, kind="stable")[:5]
    scores = (s[nb, None] * Y[nb]).sum(0)
    hits += int(np.argmax(scores)) in test_y[i]  # argmax: smallest id among ties
  assert got["P@1"] == pytest.approx(100 * hits / len(test), abs=1e-3)  # as_percent rounds


@pytest.mark.skipif(
  not (REAL_DATA and os.path.exists(REAL_DATA)),
  reason="no debian-recommends-20k.tar.gz in $ASTRA_TEST_DATA",
)
def test_cli_reproduces_the_real_data_floors(tmp_path):
  pytest.importorskip("sklearn")
  with tarfile.open(REAL_DATA) as tar:
    tar.extractall(tmp_path, filter="data")
  data = next(
    os.path.dirname(os.path.join(r, f))
    for r, _, fs in os.walk(tmp_path)
    for f in fs
    if f == "trn_X_Y.txt"
  )
  r = subprocess.run(
    [sys.executable, "-m", "astra_jax.baselines", f"--data={data}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  rows = {
    line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:5]]
    for line in r.stdout.splitlines()
    if line.startswith("| ") and "P@1" not in line
  }
  # The README beside the data (measured independently of this code).
  assert rows["label popularity"] == pytest.approx([6.64, 5.52, 4.33], abs=0.01)
  assert rows["TF-IDF kNN (char 2-4, k=20)"][0] == pytest.approx(34.66, abs=0.5)
