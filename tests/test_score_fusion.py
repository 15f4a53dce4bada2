"""The label-text fused score: the blocked top-k against a dense reference."""

import os
import time

import ml_collections
import numpy as np
import pytest

from astra_jax.ann import exact_topk
from astra_jax.config import base as config_base
from astra_jax.runtime.errors import InputError
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train
from astra_jax.xc import score_fusion

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sigmoid(x):
  return 0.5 * (1.0 + np.tanh(0.5 * x))  # sigmoid without exp overflow


def test_fused_topk_equals_the_dense_formula():
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(37, 6)).astype(np.float32)
  w = rng.normal(size=(203, 6)).astype(np.float32)
  z = rng.normal(size=(203, 6)).astype(np.float32)
  fusion = score_fusion.LabelTextFusion(text_weight=0.4, text_scale=5.0, dim=6)
  scores, ids = exact_topk.topk(
    fusion.query_rows(emb), fusion.label_rows(w, z), 7, query_block=16, label_block=64, score=fusion
  )
  cos = (emb / np.linalg.norm(emb, axis=1, keepdims=True)) @ (
    z / np.linalg.norm(z, axis=1, keepdims=True)
  ).T
  dense = 0.6 * _sigmoid(emb @ w.T) + 0.4 * _sigmoid(5.0 * cos)
  want = np.argsort(-dense, axis=1, kind="stable")[:, :7]
  np.testing.assert_array_equal(ids, want)
  np.testing.assert_allclose(scores, np.take_along_axis(dense, want, 1), rtol=1e-5)


def test_zero_text_weight_ranks_as_the_classifiers():
  rng = np.random.default_rng(1)
  emb = rng.normal(size=(20, 4)).astype(np.float32)
  w = rng.normal(size=(50, 4)).astype(np.float32)
  off = score_fusion.LabelTextFusion(text_weight=0.0, text_scale=5.0, dim=4)
  _, fused = exact_topk.topk(
    off.query_rows(emb), off.label_rows(w, rng.normal(size=(50, 4))), 5, 8, 16, score=off
  )
  _, plain = exact_topk.topk(emb, w, 5, 8, 16)
  np.testing.assert_array_equal(fused, plain)


def test_from_config():
  import ml_collections

  c = ml_collections.ConfigDict({"scoring": {"label_text_weight": 0.0, "label_text_scale": 5.0}})
  assert score_fusion.from_config(c, 8) is None
  c.scoring.label_text_weight = 0.5
  assert score_fusion.from_config(c, 8) == score_fusion.LabelTextFusion(0.5, 5.0, 8)


@pytest.mark.e2e
def test_a_fused_ngram_run_with_warm_start_exports_a_fused_predictor(tmp_path):
  """End to end: the warm-start stage, the fused evaluation and a Predictor that ranks by
  the same formula as a dense recomputation from its own embeddings."""
  c = config_base.load_config(os.path.join(REPO, "experiments/demo.py"))
  c.data.dir = str(tmp_path / "data")
  c.data.synthetic.num_labels, c.data.synthetic.num_train = 80, 600
  c.data.synthetic.num_test = 60
  c.encoder.arch, c.encoder.hidden_size = "ngram_bag", 16
  c.encoder.ngram.hash_buckets = 4096
  c.warmstart.epochs, c.warmstart.batch_size = 1, 64
  c.classifier.init = "label_text"
  c.scoring.label_text_weight, c.scoring.label_text_scale = 0.5, 5.0
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 32, 0
  c.negatives.k_r, c.negatives.tau_s = 16, 10
  wd = str(tmp_path / "wd")
  t0 = time.time()
  r = train.train_and_evaluate(c, wd)
  wall = time.time() - t0
  assert os.path.isdir(os.path.join(wd, "warmstart"))
  # Every stage's time is recorded, and together they fit inside the run's wall time.
  stages = r["stage_seconds"]
  assert list(stages) == [
    "data_and_encoder",
    "warm_start",
    "classifier_init",
    "training",
    "final_evaluation",
    "export",
  ]
  assert all(v >= 0 for v in stages.values()) and stages["warm_start"] > 0
  assert sum(stages.values()) <= min(wall, r["total_time_s"]) + 0.1
  assert r["device_kind"] and r["encoder"]["architecture"] == "ngram_bag"
  p = Predictor.from_workdir(wd, index="scann")  # fused: exact search
  assert p.fusion == score_fusion.LabelTextFusion(0.5, 5.0, 16)
  texts = p.model.label_texts[:5]
  out = p.predict(texts, k=4)
  emb = p.encode(p.to_tokens(texts)[0])
  z = p.encode(p.to_tokens(p.model.label_texts)[0])
  cos = (emb / np.linalg.norm(emb, axis=1, keepdims=True)) @ (
    z / np.linalg.norm(z, axis=1, keepdims=True)
  ).T
  dense = 0.5 * _sigmoid(emb @ np.asarray(p.model.classifier).T) + 0.5 * _sigmoid(5.0 * cos)
  np.testing.assert_allclose(out.scores, -np.sort(-dense, axis=1)[:, :4], rtol=1e-4, atol=1e-6)


def test_a_score_that_reads_label_texts_needs_them():
  def config(weight, choices):
    return ml_collections.ConfigDict(
      {
        "scoring": {
          "label_text_weight": weight,
          "label_text_scale": 5.0,
          "label_text_weight_choices": choices,
        }
      }
    )

  score_fusion.check_label_texts(config(0.5, ()), True, "d")  # texts: fine
  score_fusion.check_label_texts(config(0.0, (0.0,)), False, "d")  # W alone: fine
  with pytest.raises(InputError, match=r"label_text_weight=0.5: .* d has none"):
    score_fusion.check_label_texts(config(0.5, ()), False, "d")
  with pytest.raises(InputError, match=r"label_text_weight_choices=\(0.0, 0.3\)"):
    score_fusion.check_label_texts(config(0.0, (0.0, 0.3)), False, "d")


def test_the_shift_moves_the_text_term_by_hand():
  """sigmoid(s (cos - theta)) at cos = 0.6, 0.8 for s = 10, theta = 0.7: 1 / (1 + e) and
  1 / (1 + 1 / e)."""
  fusion = score_fusion.LabelTextFusion(0.5, 10.0, 2, text_shift=0.7)
  queries = np.array([[1.0, 0.0, 1.0, 0.0]], np.float32)
  rows = np.array([[0.0, 0.0, 0.6, 0.8], [0.0, 0.0, 0.8, 0.6]], np.float32)
  got = np.asarray(fusion.text_probabilities(queries, rows))
  np.testing.assert_allclose(got, [[1 / (1 + np.e), 1 / (1 + 1 / np.e)]], rtol=1e-6)
