"""Metrics against two hand-computed golden cases (the second with test rows of different
|y|) and a naive per-row implementation written from pyxclib's definitions (loops, no
vectorisation, nothing shared with astra_jax.evaluation.metrics)."""

import math
import subprocess
import sys

import numpy as np
import pytest

from astra_jax import evaluate
from astra_jax.data import xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import metrics

TRAIN = [[0, 1], [0], [0, 2], [0, 1], [3], [0, 4]]
TEST = [[0, 2], [3, 4], []]
SCORES = [{0: 0.9, 1: 0.8, 2: 0.1}, {0: 0.2, 3: 0.7, 4: 0.6}, {0: 0.5, 1: 0.4, 2: 0.3}]
GOLDEN = {
  "P": [0.6667, 0.5, 0.4444],
  "nDCG": [0.6667, 0.5377, 0.6399],
  "PSP": [0.9097, 0.7382, 1.0],
  "PSnDCG": [0.9097, 0.7784, 0.9372],
}
# The second golden case: test rows with 1, 4 and 2 labels, where PSnDCG's per-row
# normaliser matters (a ratio of plain means gives .6453, .6004, .5349 at k = 1, 2, 3).
TEST_MIXED = [[0], [1, 2, 3, 4], [3, 4]]
GOLDEN_MIXED = {
  "P": [0.6667, 0.5, 0.3333],
  "nDCG": [0.6667, 0.6667, 0.5885],
  "PSP": [0.6453, 0.5850, 0.4845],
  "PSnDCG": [0.6453, 0.6453, 0.5621],
}


@pytest.mark.parametrize(
  "test_rows,golden",
  [(TEST, GOLDEN), (TEST_MIXED, GOLDEN_MIXED)],
  ids=["same_sizes", "mixed_sizes"],
)
def test_golden_case(test_rows, golden):
  train = SparseRows.from_lists(TRAIN, 5)
  inv = metrics.inverse_propensity(train, 0.55, 1.5)
  np.testing.assert_allclose(inv, [1.4681, 1.6580, 1.7918, 1.7918, 1.7918], atol=1e-4)
  pred = np.array([sorted(s, key=lambda l: -s[l]) for s in SCORES])
  m = metrics.compute(pred, SparseRows.from_lists(test_rows, 5), inv, ks=(1, 2, 3))
  for name, values in golden.items():
    for k, v in zip((1, 2, 3), values):
      assert m[f"{name}@{k}"] == pytest.approx(v, abs=1e-4), (name, k)


def test_rows_without_labels_stay_in_the_denominators():
  # Two more test rows without labels: P@k and nDCG@k are means over 5 rows instead of 3;
  # the PS metrics are ratios of means, whose 0 / 0 rows change nothing.
  train = SparseRows.from_lists(TRAIN, 5)
  inv = metrics.inverse_propensity(train, 0.55, 1.5)
  pred = np.array([sorted(s, key=lambda l: -s[l]) for s in SCORES] + [[0, 1, 2]] * 2)
  m = metrics.compute(pred, SparseRows.from_lists(TEST_MIXED + [[], []], 5), inv, ks=(1, 2, 3))
  for name, values in GOLDEN_MIXED.items():
    for k, v in zip((1, 2, 3), values):
      want = v * 3 / 5 if name in ("P", "nDCG") else v
      assert m[f"{name}@{k}"] == pytest.approx(want, abs=1e-4), (name, k)


def naive(pred, truth, train, A, B, k):
  N, L = len(train), 1 + max([l for r in train + truth for l in r] + [0])
  n = [sum(l in r for r in train) for l in range(L)]
  C = (math.log(N) - 1) * (B + 1) ** A
  w = [1 + C * (n[l] + B) ** -A for l in range(L)]
  p = nd = psp_num = psp_den = psn_num = psn_den = 0.0
  for row, y in zip(pred, truth):
    y = set(y)
    top = list(row[:k])
    hits = [1.0 if l in y else 0.0 for l in top] + [0.0] * (k - len(top))
    p += sum(hits) / k
    dcg = sum(h / math.log2(r + 2) for r, h in enumerate(hits))
    idcg = sum(1 / math.log2(r + 2) for r in range(min(k, len(y))))
    nd += dcg / idcg if idcg else 0.0
    psp_num += sum(h * w[l] for h, l in zip(hits, top)) / k
    best = sorted((w[l] for l in y), reverse=True)[:k]
    psp_den += sum(best) / k
    # pyxclib's psndcg: both DCGs over the row's own nDCG normaliser before the means.
    if idcg:
      psn_num += sum(h * w[l] / math.log2(r + 2) for r, (h, l) in enumerate(zip(hits, top))) / idcg
      psn_den += sum(b / math.log2(r + 2) for r, b in enumerate(best)) / idcg
  t = len(truth)
  return {
    f"P@{k}": p / t,
    f"nDCG@{k}": nd / t,
    f"PSP@{k}": psp_num / psp_den,
    f"PSnDCG@{k}": psn_num / psn_den,
  }


@pytest.mark.parametrize("seed", range(5))
def test_random_cases_match_naive_implementation(seed):
  rng = np.random.default_rng(seed)
  L, n_train, n_test = 40, 120, 60
  row = lambda lo, hi: sorted(rng.choice(L, rng.integers(lo, hi), replace=False).tolist())
  train = [row(1, 6) for _ in range(n_train)]
  test = [row(0, 7) for _ in range(n_test)]
  pred = np.array([rng.permutation(L)[:5] for _ in range(n_test)])
  pred[rng.random(pred.shape) < 0.1] = -1  # some missing predictions
  pred_lists = [[l for l in r if l >= 0] for r in pred]
  for i, r in enumerate(pred):  # missing predictions are misses at their rank
    pred_lists[i] = [l if l >= 0 else -1 for l in r]
  inv = metrics.inverse_propensity(SparseRows.from_lists(train, L), 0.6, 2.6)
  ours = metrics.compute(pred, SparseRows.from_lists(test, L), inv, ks=(1, 3, 5))
  for k in (1, 3, 5):
    ref = naive(pred_lists, test, train, 0.6, 2.6, k)
    for name, v in ref.items():
      assert ours[name] == pytest.approx(v, rel=1e-9, abs=1e-12), name


def test_filter_removes_pairs_before_top_k():
  pred = np.array([[4, 3, 2, 1, 0], [0, 1, 2, 3, 4]])
  filt = np.array([[0, 4], [0, 2], [1, 3]])
  out = metrics.remove_filtered(pred, filt, 3)
  np.testing.assert_array_equal(out, [[3, 1, 0], [0, 1, 2]])


def _golden_files(tmp_path, with_filter=False, test_rows=TEST):
  train = SparseRows.from_lists(TRAIN, 5)
  test = SparseRows.from_lists(test_rows, 5)
  xc_format.write_sparse(tmp_path / "trn_X_Y.txt", train)
  xc_format.write_sparse(tmp_path / "tst_X_Y.txt", test)
  scores = SparseRows.from_lists([list(s) for s in SCORES], 5, [list(s.values()) for s in SCORES])
  xc_format.write_sparse(tmp_path / "scores.txt", scores)
  if with_filter:
    (tmp_path / "filter.txt").write_text("0 0\n")
  return tmp_path


def test_evaluate_files_golden(tmp_path):
  d = _golden_files(tmp_path)
  m = evaluate.evaluate_files(
    str(d / "scores.txt"),
    str(d / "tst_X_Y.txt"),
    str(d / "trn_X_Y.txt"),
    None,
    0.55,
    1.5,
    ks=(1, 2, 3),
  )
  assert m["P@1"] == pytest.approx(66.67, abs=0.01)
  assert m["PSnDCG@2"] == pytest.approx(77.84, abs=0.01)
  _golden_files(tmp_path, test_rows=TEST_MIXED)
  m = evaluate.evaluate_files(
    str(d / "scores.txt"),
    str(d / "tst_X_Y.txt"),
    str(d / "trn_X_Y.txt"),
    None,
    0.55,
    1.5,
    ks=(1, 2, 3),
  )
  for name, values in GOLDEN_MIXED.items():
    for k, v in zip((1, 2, 3), values):
      assert m[f"{name}@{k}"] == pytest.approx(100 * v, abs=0.01), (name, k)
  # Filtering (0, 0) removes row 0's top prediction: its ranking becomes 1, 2.
  _golden_files(tmp_path, with_filter=True)
  m = evaluate.evaluate_files(
    str(d / "scores.txt"),
    str(d / "tst_X_Y.txt"),
    str(d / "trn_X_Y.txt"),
    str(d / "filter.txt"),
    0.55,
    1.5,
    ks=(1, 2),
  )
  assert m["P@1"] == pytest.approx(100 / 3, abs=0.01)  # only row 1 hits at rank 1
  assert m["P@2"] == pytest.approx(100 * (0.5 + 1.0) / 3, abs=0.01)


def test_evaluate_cli(tmp_path):
  d = _golden_files(tmp_path)
  out = d / "m.json"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.evaluate",
      f"--pred={d}/scores.txt",
      f"--truth={d}/tst_X_Y.txt",
      f"--train={d}/trn_X_Y.txt",
      f"--out={out}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr
  assert "P@1" in r.stdout and "66.67" in r.stdout
  import json

  m = json.loads(out.read_text())
  assert set(m) >= {"P@1", "nDCG@3", "PSP@5", "PSnDCG@5"}
  assert m["PSP@1"] == pytest.approx(90.97, abs=0.01)
  (d / "scores.txt").write_text("3 5\n0:0.9\n1:x\n\n")
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.evaluate",
      f"--pred={d}/scores.txt",
      f"--truth={d}/tst_X_Y.txt",
      f"--train={d}/trn_X_Y.txt",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode != 0 and "scores.txt:3: malformed pair '1:x'" in r.stderr


def test_evaluate_cli_mixed_sizes(tmp_path):
  # The second golden case through the command line, every metric at k = 1, 2, 3.
  d = _golden_files(tmp_path, test_rows=TEST_MIXED)
  out = d / "m.json"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.evaluate",
      f"--pred={d}/scores.txt",
      f"--truth={d}/tst_X_Y.txt",
      f"--train={d}/trn_X_Y.txt",
      f"--out={out}",
      "--k=1",
      "--k=2",
      "--k=3",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr
  import json

  m = json.loads(out.read_text())
  for name, values in GOLDEN_MIXED.items():
    for k, v in zip((1, 2, 3), values):
      assert m[f"{name}@{k}"] == pytest.approx(100 * v, abs=0.01), (name, k)
