"""The real-data options end to end on a small dataset in the NGAME raw layout: a validation
split for the periodic evaluations, W from label texts, the label-text term in the score
with W alone reported beside it and its weight chosen on the validation split, the kNN
diagnostic and the TF-IDF baseline in results.json."""

import numpy as np
import pytest

from astra_jax.ann import exact_topk
from astra_jax.evaluation import baselines, ranking
from astra_jax.serving import export
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train

pytestmark = pytest.mark.e2e


def test_validation_split_label_text_init_and_diagnostics(tmp_path, ngame_dataset, load_config):
  d = tmp_path / "ds"
  ngame_dataset(d, n_train=400, n_test=80)
  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir, c.data.max_len = str(d), 12
  c.data.validation_fraction = 0.25
  c.classifier.init = "label_text"
  c.eval.knn_diagnostic = 5
  c.eval.tfidf_baseline = True
  c.scoring.label_text_weight = 0.5
  c.scoring.label_text_weight_choices = (0.0, 0.5, 1.0)
  c.eval.classifier_alone = True
  c.train.epochs, c.train.batch_size, c.train.eval_every_epochs = 2, 32, 1
  c.train.profile_steps = 0
  c.negatives.k_r, c.negatives.k_h = 16, 4
  c.optim.warmup_steps = 5
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert r["num_train"] == 300  # 100 of the 400 rows held out
  splits = [(e["epoch"], e["split"]) for e in r["evaluations"]]
  assert splits == [(1, "validation"), (2, "validation"), (2, "test")]
  for e in r["evaluations"]:
    assert 0 <= e["kNN-E P@1"] <= 100 and 0 <= e["P@1"] <= 100
  assert "kNN-E P@5" in r["metrics"]
  assert all("W-alone P@1" in e for e in r["evaluations"])
  # W alone: the exported classifiers ranked by the plain dense kernel over all test rows.
  data, _ = train.load_splits(c)
  model = export.load_model(str(tmp_path / "wd"))
  emb = Predictor(model, index="exact").encode(np.asarray(data.test_tokens))
  ranked = exact_topk.topk(emb, model.classifier, 5)[1]
  dense = ranking.rank_filter_score(
    lambda k: ranked, data.test_labels, data.test_filter, None, (1, 3, 5)
  )
  for k in ("P@1", "P@3", "P@5"):
    assert abs(r[f"W-alone {k}"] - dense[k]) < 1e-3, (k, r[f"W-alone {k}"], dense[k])
  # The weight chosen on the validation split: each candidate's P@1 as a dense numpy
  # reference computes it from the exported W and label-text embeddings, the first best one
  # chosen, and the model exported with it.
  _, val = train.load_splits(c)
  q = Predictor(model, index="exact").encode(np.asarray(val.test_tokens))
  z = Predictor(model, index="exact").encode(np.asarray(data.label_tokens))
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sigmoid = lambda x: 1 / (1 + np.exp(-x))
  cos = unit(q) @ unit(z).T
  reference = {}
  for w in (0.0, 0.5, 1.0):
    fused = (1 - w) * sigmoid(q @ np.asarray(model.classifier).T) + w * sigmoid(5.0 * cos)
    top = np.argsort(-fused, axis=1, kind="stable")
    m = ranking.rank_filter_score(
      lambda k, top=top: top[:, :k], val.test_labels, val.test_filter, None, (1,)
    )
    reference[w] = m["P@1"]
  choice = r["score_choice"]
  got = {x["label_text_weight"]: x["P@1"] for x in choice["candidates"]}
  assert got == pytest.approx(reference, abs=1e-3)
  best = max(reference.values())
  chosen = next(w for w in (0.0, 0.5, 1.0) if reference[w] == best)
  assert choice["label_text_weight"] == chosen == model.meta["scoring"]["label_text_weight"]
  assert r["config"]["scoring"]["label_text_weight"] == chosen
  if baselines.sklearn_available():
    assert r["tfidf_knn_baseline"]["P@1"] > r["popularity_baseline"]["P@1"]
  else:
    assert "tfidf_knn_baseline" not in r
  # A rerun in the same workdir with another split is another run: refused.
  c.data.validation_fraction = 0.5
  with pytest.raises(Exception, match="validation_fraction"):
    train.train_and_evaluate(c, str(tmp_path / "wd"))
