"""The real-data options end to end on a small dataset in the NGAME raw layout: a validation
split for the periodic evaluations, W from label texts, the label-text term in the score
with W alone reported beside it and its weight chosen on the validation split, then the
neighbour vote's, the kNN diagnostic and the TF-IDF baseline in results.json."""

import json
import os

import numpy as np
import pytest

from astra_jax.ann import exact_topk
from astra_jax.config import choice_reads
from astra_jax.data.validation import SplitSpec
from astra_jax.evaluation import baselines, ranking
from astra_jax.serving import export
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train
from astra_jax.xc import neighbour_vote

pytestmark = pytest.mark.e2e


def _tiny_run_config(tmp_path, ngame_dataset, load_config, epochs: int):
  """xc_text.py:tiny on 400 training rows (a quarter held out for validation), W from the
  label texts, both score weights to choose, the vote over 5 neighbours at tau 0.2."""
  d = tmp_path / "ds"
  ngame_dataset(d, n_train=400, n_test=80)
  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir, c.data.max_len = str(d), 12
  c.data.validation_fraction = 0.25
  c.classifier.init = "label_text"
  c.scoring.label_text_weight = 0.5
  c.scoring.label_text_weight_choices = (0.0, 0.5, 1.0)
  c.scoring.neighbours, c.scoring.neighbour_temperature = 5, 0.2
  c.train.epochs, c.train.batch_size, c.train.eval_every_epochs = epochs, 32, 1
  c.train.profile_steps = 0
  c.negatives.k_r, c.negatives.k_h = 16, 4
  c.optim.warmup_steps = 5
  return c


def _count_passes(monkeypatch) -> list[int]:
  """The weight rows of every pass the score choice reads (ModelEvaluator.score_at), in
  order, as the run makes them."""
  passes, read = [], ranking.ModelEvaluator.score_at

  def counted(self, weights):
    passes.append(len(weights))
    return read(self, weights)

  monkeypatch.setattr(ranking.ModelEvaluator, "score_at", counted)
  return passes


def _planned(scoring) -> list[int]:
  """The weight rows of each pass config/choice_reads.py lists, which the planner prices."""
  return [p.weight_rows for p in choice_reads.choice_passes(scoring)]


def test_validation_split_label_text_init_and_diagnostics(tmp_path, ngame_dataset, load_config):
  c = _tiny_run_config(tmp_path, ngame_dataset, load_config, epochs=2)
  c.eval.knn_diagnostic = 5
  c.eval.tfidf_baseline = True
  # No 0 among them: the vote is in the exported model whichever is chosen.
  c.scoring.neighbour_weight_choices = (0.5, 1.0)
  c.eval.classifier_alone = True
  c.data.validation_max_rows = 80  # of the 100 a quarter of the 400 rows would be
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert (r["num_train"], r["num_validation"]) == (320, 80)
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
  # Then the neighbour vote's weight, with that label-text weight, its memory the training
  # rows alone: each candidate's P@1 as numpy computes it from the exported encoder.
  fused = (1 - chosen) * sigmoid(q @ np.asarray(model.classifier).T) + chosen * sigmoid(5.0 * cos)
  keys = Predictor(model, index="exact").encode(data.train_tokens[np.arange(320)])
  votes = _dense_votes(q, keys, data.train_labels.head(320).to_dense(), 5, 0.2)
  reference = {}
  for a in (0.5, 1.0):
    top = np.argsort(-((1 - a) * fused + a * votes), axis=1, kind="stable")
    m = ranking.rank_filter_score(
      lambda k, top=top: top[:, :k], val.test_labels, val.test_filter, None, (1,)
    )
    reference[a] = m["P@1"]
  got = {x["neighbour_weight"]: x["P@1"] for x in choice["neighbour_candidates"]}
  assert got == pytest.approx(reference, abs=1e-3)
  a = 0.5 if reference[0.5] >= reference[1.0] else 1.0
  assert choice["neighbour_weight"] == a == model.meta["scoring"]["neighbour_weight"]
  # The exported memory holds the training rows, then the 80 validation rows; a Predictor
  # ranks by the mixed score over it, as numpy does.
  assert len(model.memory.keys) == 400
  assert not (tmp_path / "wd" / "vote_cache").exists()  # the validation votes, once read
  np.testing.assert_allclose(model.memory.keys[:320], unit(keys), atol=1e-5)
  np.testing.assert_array_equal(
    model.memory.labels.to_dense(),
    np.concatenate([data.train_labels.head(320).to_dense(), val.test_labels.to_dense()]),
  )
  p = Predictor(model, index="scann")
  assert p.vote == neighbour_vote.NeighbourVote(a, 5, 0.2)
  texts = ["item 3 words", "another query text"]
  out = p.predict(texts, k=4)
  e = p.encode(p.to_tokens(texts)[0])
  e_cos = unit(e) @ unit(z).T
  memory_labels = model.memory.labels.to_dense()
  dense = (1 - a) * (
    (1 - chosen) * sigmoid(e @ np.asarray(model.classifier).T) + chosen * sigmoid(5.0 * e_cos)
  ) + a * _dense_votes(e, model.memory.keys, memory_labels, 5, 0.2)
  np.testing.assert_allclose(out.scores, -np.sort(-dense, axis=1)[:, :4], rtol=1e-4, atol=1e-6)
  # The test split's metrics are the mixed score's over that memory.
  t = p.encode(np.asarray(data.test_tokens))
  mixed = (1 - a) * (
    (1 - chosen) * sigmoid(t @ np.asarray(model.classifier).T)
    + chosen * sigmoid(5.0 * unit(t) @ unit(z).T)
  ) + a * _dense_votes(t, model.memory.keys, memory_labels, 5, 0.2)
  top = np.argsort(-mixed, axis=1, kind="stable")
  m = ranking.rank_filter_score(
    lambda k: top[:, :k], data.test_labels, data.test_filter, None, (1, 3, 5)
  )
  for k in ("P@1", "P@3", "P@5"):
    assert abs(r["metrics"][k] - m[k]) < 1e-3, (k, r["metrics"][k], m[k])
  if baselines.sklearn_available():
    assert r["tfidf_knn_baseline"]["P@1"] > r["popularity_baseline"]["P@1"]
  else:
    assert "tfidf_knn_baseline" not in r
  # A model of format 1, its keys inside vote_memory.npz, reads as the same memory.
  model_dir = tmp_path / "wd" / "model"
  keys_now = np.array(model.memory.keys)
  labels_now = model.memory.labels
  np.savez(
    model_dir / export.VOTE_MEMORY_FILE,
    keys=keys_now,
    indptr=labels_now.indptr,
    indices=labels_now.indices,
  )
  os.remove(model_dir / export.VOTE_MEMORY_KEYS_FILE)
  meta = json.loads((model_dir / "model.json").read_text())
  (model_dir / "model.json").write_text(json.dumps({**meta, "format_version": 1}))
  old = export.load_model(str(tmp_path / "wd")).memory
  np.testing.assert_array_equal(old.keys, keys_now)
  np.testing.assert_array_equal(old.labels.indices, labels_now.indices)
  # A rerun in the same workdir with another split is another run: refused.
  c.data.validation_fraction = 0.5
  with pytest.raises(Exception, match="validation_fraction"):
    train.train_and_evaluate(c, str(tmp_path / "wd"))


def _dense_votes(queries, keys, labels, k, tau):
  """v(x, l) by its definition (xc/neighbour_vote.py), one query at a time."""
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  cos = unit(queries.astype(np.float64)) @ unit(keys.astype(np.float64)).T
  out = np.zeros((len(queries), labels.shape[1]))
  for i, row in enumerate(cos):
    nb = np.argsort(-row, kind="stable")[:k]
    w = np.exp((row[nb] - row[nb[0]]) / tau)
    out[i] = (w[:, None] * labels[nb]).sum(0) / w.sum()
  return out


def test_both_weights_chosen_jointly(tmp_path, ngame_dataset, load_config):
  """With scoring.choose_jointly every (label-text weight, neighbour weight) pair is read on
  the validation split: each pair's P@1 + P@5 (scoring.choose_by) as a dense numpy
  reference computes it from the exported model, and the first best pair is the exported
  score."""
  c = _tiny_run_config(tmp_path, ngame_dataset, load_config, epochs=1)
  c.scoring.neighbour_weight_choices = (0.3, 1.0)  # no 0: the vote is exported either way
  c.scoring.choose_jointly = True
  c.scoring.choose_by = ("P@1", "P@5")
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  data, val = train.load_splits(c)
  model = export.load_model(str(tmp_path / "wd"))
  p = Predictor(model, index="exact")
  q = p.encode(np.asarray(val.test_tokens))
  z = p.encode(np.asarray(data.label_tokens))
  keys = p.encode(data.train_tokens[np.arange(300)])
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sigmoid = lambda x: 1 / (1 + np.exp(-x))
  w_term = sigmoid(q @ np.asarray(model.classifier).T)
  text_term = sigmoid(5.0 * unit(q) @ unit(z).T)
  votes = _dense_votes(q, keys, data.train_labels.head(300).to_dense(), 5, 0.2)
  # In float32, as the kernel scores: W's sigmoids saturate to ties there, which float64
  # would order differently at rank 5.
  w_term, text_term, votes = (x.astype(np.float32) for x in (w_term, text_term, votes))
  reference = {}
  for t in (0.0, 0.5, 1.0):
    for a in (0.3, 1.0):
      mixed = (1 - a) * ((1 - t) * w_term + t * text_term) + a * votes
      top = np.argsort(-mixed, axis=1, kind="stable")
      m = ranking.rank_filter_score(
        lambda k, top=top: top[:, :k], val.test_labels, val.test_filter, None, (1, 5)
      )
      reference[(t, a)] = m["P@1"] + m["P@5"]
  choice = r["score_choice"]
  assert choice["by"] == "P@1+P@5"
  got = {(x["label_text_weight"], x["neighbour_weight"]): x["P@1+P@5"] for x in choice["pairs"]}
  assert list(got) == list(reference)  # the label-text weights outer, in the config's order
  assert got == pytest.approx(reference, abs=1e-3)
  best = max(reference.values())
  chosen = next(pair for pair, m in reference.items() if m == best)
  assert (choice["label_text_weight"], choice["neighbour_weight"]) == chosen
  scoring = model.meta["scoring"]
  assert (scoring["label_text_weight"], scoring["neighbour_weight"]) == chosen


def test_label_text_shape_chosen_then_the_weights(
  tmp_path, ngame_dataset, load_config, monkeypatch
):
  """With scoring.label_text_shape_choices each (scale, shift) is read at the label-text
  weights above 0 without the vote: each shape's best P@1 + P@5 is what a dense numpy
  reference computes from the exported model, the first best shape is exported, the
  weights are then chosen with it, and the Predictor ranks by the shifted score."""
  c = _tiny_run_config(tmp_path, ngame_dataset, load_config, epochs=1)
  c.scoring.label_text_weight_choices = (0.3, 0.7)  # no 0: the export mixes in the texts
  c.scoring.label_text_shape_choices = ((5.0, 0.0), (20.0, 0.6), (10.0, -0.5))
  c.scoring.choose_by = ("P@1", "P@5")
  passes, planned = _count_passes(monkeypatch), _planned(c.scoring)
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  # Three shapes at the two weights in one pass, then the two weights: what the planner
  # prices.
  assert passes == planned == [6, 2]
  data, val = train.load_splits(c)
  model = export.load_model(str(tmp_path / "wd"))
  p = Predictor(model, index="exact")
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sigmoid = lambda x: 0.5 * (1.0 + np.tanh(0.5 * x))  # without exp's overflow

  def terms(tokens):
    q = p.encode(np.asarray(tokens))
    cos = unit(q) @ unit(p.encode(np.asarray(data.label_tokens))).T
    return sigmoid(q @ np.asarray(model.classifier).T).astype(np.float32), cos

  def read(score, split):
    top = np.argsort(-score, axis=1, kind="stable")
    m = ranking.rank_filter_score(
      lambda k: top[:, :k], split.test_labels, split.test_filter, None, (1, 5)
    )
    return m["P@1"] + m["P@5"]

  w_term, cos = terms(val.test_tokens)
  reference = {}
  for scale, shift in c.scoring.label_text_shape_choices:
    text = sigmoid(scale * (cos - shift)).astype(np.float32)
    reference[(scale, shift)] = max(read((1 - b) * w_term + b * text, val) for b in (0.3, 0.7))
  choice = r["score_choice"]
  got = {(x["label_text_scale"], x["label_text_shift"]): x["P@1+P@5"] for x in choice["shapes"]}
  assert list(got) == list(reference)
  assert got == pytest.approx(reference, abs=1e-3)
  chosen = next(s for s, v in reference.items() if v == max(reference.values()))
  assert chosen != (5.0, 0.0), "the tiny problem should want another shape"
  scoring = model.meta["scoring"]
  assert (choice["label_text_scale"], choice["label_text_shift"]) == chosen
  assert (scoring["label_text_scale"], scoring["label_text_shift"]) == chosen
  # The weights were read with the chosen shape.
  text = sigmoid(chosen[0] * (cos - chosen[1])).astype(np.float32)
  weights = {x["label_text_weight"]: x["P@1+P@5"] for x in choice["candidates"]}
  want = {b: read((1 - b) * w_term + b * text, val) for b in (0.3, 0.7)}
  assert weights == pytest.approx(want, abs=1e-3)
  b = scoring["label_text_weight"]
  w_test, cos_test = terms(data.test_tokens[:16])
  dense = (1 - b) * w_test + b * sigmoid(chosen[0] * (cos_test - chosen[1]))
  out = p.predict(list(baselines.load_texts(c.data.dir).test_texts[:16]), k=5)
  np.testing.assert_allclose(out.scores, -np.sort(-dense, axis=1)[:, :5], rtol=1e-4, atol=1e-6)


def test_lexical_weights_chosen_and_exported(tmp_path, ngame_dataset, load_config, monkeypatch):
  """With lexical choices every (g, h) pair is read on the validation split after the
  model's weights: each pair's P@1 + P@5 as a dense reference computes it (the exported
  model's terms, TF-IDF straight from scikit-learn) is what the choice read, the first best
  pair is exported, and the Predictor ranks the test rows by that score over the training
  and validation rows."""
  from sklearn.feature_extraction.text import TfidfVectorizer

  c = _tiny_run_config(tmp_path, ngame_dataset, load_config, epochs=1)
  c.scoring.label_text_weight_choices = (0.5,)
  c.scoring.neighbour_weight_choices = (0.3,)
  c.scoring.lexical_label_text_weight_choices = (0.0, 0.2, 0.4)
  c.scoring.lexical_neighbour_weight_choices = (0.0, 0.3)
  c.scoring.choose_by = ("P@1", "P@5")
  passes, planned = _count_passes(monkeypatch), _planned(c.scoring)
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  # One label-text weight, one neighbour weight, then the 3 x 2 lexical pairs.
  assert passes == planned == [1, 1, 6]
  data, val = train.load_splits(c)
  texts = baselines.load_texts(c.data.dir, split=SplitSpec(0.25))
  everything = baselines.load_texts(c.data.dir)
  model = export.load_model(str(tmp_path / "wd"))
  p = Predictor(model, index="exact")
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  sigmoid = lambda x: 1 / (1 + np.exp(-x))

  def tfidf(fit, *texts):
    blocks = [[] for _ in texts]
    for analyzer, ngrams in (("word", (1, 2)), ("char_wb", (2, 4))):
      v = TfidfVectorizer(analyzer=analyzer, ngram_range=ngrams, sublinear_tf=True).fit(fit)
      for b, t in zip(blocks, texts):
        b.append(v.transform(t).toarray())
    return [unit(np.concatenate(b, axis=1)) for b in blocks]

  def model_terms(tokens, keys, key_labels, label_tokens):
    q, z = p.encode(np.asarray(tokens)), p.encode(np.asarray(label_tokens))
    w_term = sigmoid(q @ np.asarray(model.classifier).T)
    mixed = 0.5 * w_term + 0.5 * sigmoid(5.0 * unit(q) @ unit(z).T)
    return 0.7 * mixed + 0.3 * _dense_votes(q, p.encode(keys), key_labels, 5, 0.2)

  def lexical_terms(rows, queries, row_labels):
    xr, xq, xz = tfidf(rows, rows, queries, everything.label_texts)
    return xq @ xz.T, _dense_votes(xq, xr, row_labels, 5, 0.2)

  m = model_terms(
    val.test_tokens,
    data.train_tokens[np.arange(300)],
    data.train_labels.head(300).to_dense(),
    data.label_tokens,
  )
  t, u = lexical_terms(texts.train_texts, texts.test_texts, texts.train_labels.to_dense())
  reference = {}
  for g in (0.0, 0.2, 0.4):
    for h in (0.0, 0.3):
      mixed = ((1 - g - h) * m + g * t + h * u).astype(np.float32)
      top = np.argsort(-mixed, axis=1, kind="stable")
      s = ranking.rank_filter_score(
        lambda k, top=top: top[:, :k], val.test_labels, val.test_filter, None, (1, 5)
      )
      reference[(g, h)] = s["P@1"] + s["P@5"]
  choice = r["score_choice"]
  got = {
    (x["lexical_label_text_weight"], x["lexical_neighbour_weight"]): x["P@1+P@5"]
    for x in choice["lexical_pairs"]
  }
  assert list(got) == list(reference)
  assert got == pytest.approx(reference, abs=1e-3)
  chosen = next(pair for pair, v in reference.items() if v == max(reference.values()))
  assert chosen != (0.0, 0.0), "the tiny problem should want a lexical term"
  assert (choice["lexical_label_text_weight"], choice["lexical_neighbour_weight"]) == chosen
  # The export: the final rows (training, then validation) vote, the features refitted on them.
  g, h = chosen
  rows = texts.train_texts + texts.test_texts
  row_labels = np.concatenate([texts.train_labels.to_dense(), texts.test_labels.to_dense()])
  all_tokens = np.concatenate([data.train_tokens[np.arange(300)], val.test_tokens])
  m = model_terms(data.test_tokens, all_tokens, row_labels, data.label_tokens)
  t, u = lexical_terms(rows, everything.test_texts, row_labels)
  dense = (1 - g - h) * m + g * t + h * u
  pred = p.predict(everything.test_texts, k=5)
  np.testing.assert_allclose(pred.scores, -np.sort(-dense, axis=1)[:, :5], rtol=1e-4, atol=1e-5)
  # The final evaluation ranked the test split by the same score on the mesh.
  top = np.argsort(-dense.astype(np.float32), axis=1, kind="stable")
  final = ranking.rank_filter_score(
    lambda k: top[:, :k], data.test_labels, data.test_filter, None, (1, 5)
  )
  assert r["P@1"] + r["P@5"] == pytest.approx(final["P@1"] + final["P@5"], abs=1e-3)
