"""What a classic method gets for free on a dataset in the XC layout: label popularity and
character n-gram TF-IDF k-nearest-neighbour votes. A trained model that does not beat these
is not worth its training time.

The command `python -m astra_jax.baselines` prints them for a dataset.

- popularity: every query gets the most frequent training labels;
- TF-IDF kNN: char 2-4-gram TF-IDF (scikit-learn's TfidfVectorizer: within-word n-grams,
  sublinear tf, l2-normalised) of the texts; a query's k = 20 most cosine-similar training
  points vote for their labels with their similarity (`astra_jax.evaluation.knn.vote`);
- label-text TF-IDF (when label texts exist): labels ranked by the cosine of the query's
  TF-IDF vector with their text's.

scikit-learn is an optional extra (`pip install astra_jax[baselines]`); without it only
popularity is computed. The training run (`astra_jax.training.train`) puts the kNN numbers in
results.json beside the popularity baseline when scikit-learn is installed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np
from absl import logging

from astra_jax.data import dataset, self_filter, validation, xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import knn, metrics, peers, ranking
from astra_jax.runtime.errors import InputError

KNN_K = 20
NGRAMS = (2, 4)


def sklearn_available() -> bool:
  try:
    import sklearn  # noqa: F401

    return True
  except ImportError:
    return False


@dataclasses.dataclass(frozen=True)
class TextData:
  """A dataset's raw texts and label rows (no tokenizer needed)."""

  train_texts: list[str]
  train_labels: SparseRows
  test_texts: list[str]
  test_labels: SparseRows
  label_texts: list[str] | None
  test_filter: np.ndarray
  num_labels: int


def load_texts(
  data_dir: str,
  layout: str = "auto",
  use_content: bool = False,
  split: validation.SplitSpec | None = None,
  filter_self: str = "off",
) -> TextData:
  """Reads texts and labels; with a `split` of fraction > 0 the test set is the validation
  split that `data.validation_*` carve (the same rows); filter_self (off | on | auto)
  filters each test row's own item as `data.filter_self` does (data/self_filter.py)."""
  layout = layout if layout != "auto" else dataset.detect_layout(data_dir)
  trn_x, tst_x, lbl_x = (os.path.join(data_dir, f) for f in dataset.LAYOUTS[layout])
  read = lambda p: xc_format.read_texts(p, use_content=use_content)
  if layout == "json":
    num_labels = len(read(lbl_x))
    train_labels = xc_format.read_json_labels(trn_x, num_labels)
    test_labels = xc_format.read_json_labels(tst_x, num_labels)
  else:
    train_labels = xc_format.read_sparse(os.path.join(data_dir, "trn_X_Y.txt"))
    num_labels = train_labels.num_cols
    test_labels = xc_format.read_sparse(os.path.join(data_dir, "tst_X_Y.txt"), num_labels)
  train_texts, test_texts = read(trn_x), read(tst_x)
  label_texts = read(lbl_x) if os.path.exists(lbl_x) else None
  path = dataset.filter_file_path(data_dir, dataset.FILTER_FILE)
  test_filter = (
    xc_format.read_filter(path, test_labels.num_rows, num_labels)
    if path
    else np.zeros((0, 2), np.int64)
  )
  if split is not None and split.fraction:
    keep, val = validation.split_rows(len(train_texts), split)
    test_texts = [train_texts[i] for i in val]
    test_labels = validation.take_rows(train_labels, val)
    train_texts = [train_texts[i] for i in keep]
    train_labels = validation.take_rows(train_labels, keep)
    test_filter = np.zeros((0, 2), np.int64)
  if filter_self != "off":
    if label_texts is None:
      raise InputError(f"filter_self={filter_self} needs label texts at {lbl_x}")
    _, own, _ = self_filter.own_item_pairs(
      filter_self, train_texts, train_labels, test_texts, test_labels, label_texts
    )
    test_filter = np.unique(np.concatenate([test_filter, own]), axis=0)
  return TextData(
    train_texts, train_labels, test_texts, test_labels, label_texts, test_filter, num_labels
  )


def _score(rank: ranking.Ranker, data: TextData, ks: tuple[int, ...]) -> dict[str, float]:
  return ranking.rank_filter_score(rank, data.test_labels, data.test_filter, None, ks)


def popularity(data: TextData, ks: tuple[int, ...] = (1, 3, 5)) -> dict[str, float]:
  return _score(ranking.popularity_ranker(data.train_labels, data.test_labels.num_rows), data, ks)


def _vectorizer():
  from sklearn.feature_extraction.text import TfidfVectorizer

  # Word-boundary character n-grams with sublinear term frequencies: the usual choice for
  # short texts (package names and titles). How its kNN compares with the floor in
  # debian-recommends-20k's own README: docs/results/data.md.
  return TfidfVectorizer(
    analyzer="char_wb", ngram_range=NGRAMS, sublinear_tf=True, dtype=np.float32
  )


def _sparse_topk(queries, keys, k: int, block: int = 2048) -> tuple[np.ndarray, np.ndarray]:
  """Exact top-k of the sparse cosine similarities (rows are l2-normalised)."""
  ids, sims = [], []
  k = min(k, keys.shape[0])
  for start in range(0, queries.shape[0], block):
    s = (queries[start : start + block] @ keys.T).toarray()
    top = np.argpartition(-s, k - 1, axis=1)[:, :k]
    top_s = np.take_along_axis(s, top, 1)
    order = np.argsort(-top_s, axis=1, kind="stable")
    ids.append(np.take_along_axis(top, order, 1)), sims.append(np.take_along_axis(top_s, order, 1))
  return np.concatenate(ids), np.concatenate(sims)


def _knn_ranker(data: TextData, k: int = KNN_K) -> ranking.Ranker:
  vec = _vectorizer()
  train = vec.fit_transform(data.train_texts)
  neighbors, sims = _sparse_topk(vec.transform(data.test_texts), train, k)
  return lambda k_out: knn.vote(neighbors, sims, data.train_labels, k_out)


def _label_text_ranker(data: TextData) -> ranking.Ranker:
  vec = _vectorizer()
  vec.fit(data.train_texts + data.label_texts)
  labels, queries = vec.transform(data.label_texts), vec.transform(data.test_texts)
  return lambda k: _sparse_topk(queries, labels, k)[0]


def tfidf_knn(data: TextData, ks: tuple[int, ...] = (1, 3, 5), k: int = KNN_K) -> dict[str, float]:
  """P@k etc. of the similarity-weighted vote of the k nearest training points."""
  return _score(_knn_ranker(data, k), data, ks)


def tfidf_label_text(data: TextData, ks: tuple[int, ...] = (1, 3, 5)) -> dict[str, float]:
  """Labels ranked by their text's TF-IDF cosine with the query's."""
  return _score(_label_text_ranker(data), data, ks)


def for_training_run(config) -> dict:
  """What results.json holds beside the model's metrics, on the run's test split under its
  filter: with `eval.tfidf_baseline`, "tfidf_knn_baseline" and (when the data has label
  texts) "tfidf_label_text_baseline" (skipped without scikit-learn); with `eval.peers`,
  "peer_baselines", {title: metrics} of each peer library. {} when both are off."""
  peer_names = tuple(m for m in config.eval.get("peers", "").split(",") if m)
  tfidf = config.eval.tfidf_baseline and sklearn_available()
  if config.eval.tfidf_baseline and not tfidf:
    logging.warning("eval.tfidf_baseline: scikit-learn is not installed; skipped")
  if not (tfidf or peer_names):
    return {}
  texts = load_texts(
    config.data.dir,
    config.data.layout,
    config.data.use_content,
    filter_self=config.data.get("filter_self", "off"),
  )
  ks = tuple(config.eval.ks)
  inv_prop = metrics.inverse_propensity(
    texts.train_labels, config.data.propensity_A, config.data.propensity_B
  )
  out = {}
  if tfidf:
    keys = {"tfidf_knn": "tfidf_knn_baseline", "tfidf_label_text": "tfidf_label_text_baseline"}
    names = [m for m in keys if texts.label_texts is not None or m == "tfidf_knn"]
    got = run_all(texts, ks, tuple(names), inv_prop)
    out.update({keys[m]: got[BASELINES[m].title] for m in names})
  if peer_names:
    out["peer_baselines"] = run_all(texts, ks, peer_names, inv_prop)
  return out


@dataclasses.dataclass(frozen=True)
class Baseline:
  """One method `python -m astra_jax.baselines --methods=...` can run.

  Attributes:
    name: its key in --methods.
    title: its row in the printed table.
    rank: (data, k, peers_python) -> (ids (n_test, k) best first, -1: none; train seconds;
      predict seconds).
    needs_sklearn: it computes TF-IDF features (scikit-learn, the `baselines` extra).
    needs_label_texts: it reads the label texts.
    peer: it runs in the peers' environment (`evaluation/peers.py`).
  """

  name: str
  title: str
  rank: Callable[[TextData, int, str], tuple[np.ndarray, float, float]]
  needs_sklearn: bool = True
  needs_label_texts: bool = False
  peer: bool = False


def _timed(fit: Callable[[], Callable[[int], np.ndarray]], k: int):
  start = time.perf_counter()
  ranker = fit()
  fitted = time.perf_counter()
  ids = ranker(k)
  return ids, fitted - start, time.perf_counter() - fitted


def _popularity(data: TextData, k: int, python: str):
  return _timed(lambda: ranking.popularity_ranker(data.train_labels, data.test_labels.num_rows), k)


def _knn(data: TextData, k: int, python: str):
  return _timed(lambda: _knn_ranker(data), k)


def _label_text(data: TextData, k: int, python: str):
  return _timed(lambda: _label_text_ranker(data), k)


def _peer(name: str):
  def run(data: TextData, k: int, python: str):
    got = peers.rank([name], data.train_texts, data.train_labels, data.test_texts, python)[name]
    return got.top[:, :k], got.train_seconds, got.predict_seconds

  return run


BASELINES = {
  b.name: b
  for b in (
    Baseline("popularity", "label popularity", _popularity, needs_sklearn=False),
    Baseline("tfidf_knn", f"TF-IDF kNN (char 2-4, k={KNN_K})", _knn),
    Baseline(
      "tfidf_label_text", "TF-IDF query-label text (char 2-4)", _label_text, needs_label_texts=True
    ),
    *(
      Baseline(p.name, f"{p.title} ({p.library})", _peer(p.name), peer=True)
      for p in peers.PEERS.values()
    ),
  )
}
CLASSIC = ("popularity", "tfidf_knn", "tfidf_label_text")


def run_all(
  data: TextData,
  ks: tuple[int, ...] = (1, 3, 5),
  methods: tuple[str, ...] = CLASSIC,
  inv_prop: np.ndarray | None = None,
  peers_python: str = "",
) -> dict[str, dict[str, float]]:
  """Each method's metrics on `data`'s test rows, by the one rank -> filter -> score path.

  Args:
    data: the texts and labels (`load_texts`).
    ks: the cut-offs.
    methods: keys of BASELINES, in the order to run them. A TF-IDF method is skipped (with a
      warning) without scikit-learn, a label-text one on data without label texts.
    inv_prop: inverse propensities, for PSP@k and PSnDCG@k (None: none).
    peers_python: the peers' interpreter ("" for `peers.peers_python`'s default).
  Returns:
    {title: metrics x100, with "train_seconds" and "predict_seconds"}.
  """
  unknown = [m for m in methods if m not in BASELINES]
  if unknown:
    raise InputError(f"--methods: unknown {unknown}; the methods are {sorted(BASELINES)}")
  python = peers.peers_python(peers_python) if any(BASELINES[m].peer for m in methods) else ""
  out = {}
  for name in methods:
    b = BASELINES[name]
    if b.needs_sklearn and not sklearn_available():
      logging.warning("%s skipped: scikit-learn is not installed (the baselines extra)", name)
      continue
    if b.needs_label_texts and data.label_texts is None:
      logging.warning("%s skipped: the data has no label texts", name)
      continue
    k = max(ks) + metrics.max_filtered_per_row(data.test_filter)
    ids, train_s, predict_s = b.rank(data, k, python)
    scored = ranking.rank_filter_score(
      lambda _, ids=ids: ids, data.test_labels, data.test_filter, inv_prop, ks
    )
    out[b.title] = {**scored, "train_seconds": train_s, "predict_seconds": predict_s}
  return out


def table(results: dict[str, dict[str, float]], ks: tuple[int, ...] = (1, 3, 5)) -> str:
  """A markdown table: P@k, PSP@k where computed, and train + predict seconds."""
  cols = [f"P@{k}" for k in ks] + [
    f"PSP@{k}" for k in ks if any(f"PSP@{k}" in m for m in results.values())
  ]
  head = "| method | " + " | ".join(cols) + " | train + predict s |"
  rule = "|---|" + "---|" * (len(cols) + 1)
  rows = [
    f"| {name} | "
    + " | ".join(f"{m[c]:.2f}" for c in cols)
    + f" | {m.get('train_seconds', 0):.1f} + {m.get('predict_seconds', 0):.1f} |"
    for name, m in results.items()
  ]
  return "\n".join([head, rule, *rows])
