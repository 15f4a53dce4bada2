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

import numpy as np
from absl import logging

from astra_jax.data import dataset, self_filter, validation, xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import knn, ranking
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
  validation_fraction: float = 0.0,
  validation_seed: int = 0,
  filter_self: str = "off",
) -> TextData:
  """Reads texts and labels; with validation_fraction > 0 the test set is the validation
  split that `data.validation_fraction` carves (the same rows); filter_self (off | on |
  auto) filters each test row's own item as `data.filter_self` does (data/self_filter.py)."""
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
  if validation_fraction:
    keep, val = validation.split_rows(len(train_texts), validation_fraction, validation_seed)
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


def tfidf_knn(data: TextData, ks: tuple[int, ...] = (1, 3, 5), k: int = KNN_K) -> dict[str, float]:
  """P@k etc. of the similarity-weighted vote of the k nearest training points."""
  vec = _vectorizer()
  train = vec.fit_transform(data.train_texts)
  test = vec.transform(data.test_texts)
  neighbors, sims = _sparse_topk(test, train, k)
  return _score(lambda k_out: knn.vote(neighbors, sims, data.train_labels, k_out), data, ks)


def tfidf_label_text(data: TextData, ks: tuple[int, ...] = (1, 3, 5)) -> dict[str, float]:
  """Labels ranked by their text's TF-IDF cosine with the query's."""
  vec = _vectorizer()
  vec.fit(data.train_texts + data.label_texts)
  labels = vec.transform(data.label_texts)
  queries = vec.transform(data.test_texts)
  return _score(lambda k: _sparse_topk(queries, labels, k)[0], data, ks)


def for_training_run(config) -> dict:
  """`eval.tfidf_baseline`: the TF-IDF floors on the run's test split under its filter,
  {"tfidf_knn_baseline": metrics, "tfidf_label_text_baseline": metrics (when the data has
  label texts)}, when scikit-learn is installed ({} otherwise or when off)."""
  if not config.eval.tfidf_baseline:
    return {}
  if not sklearn_available():
    logging.warning("eval.tfidf_baseline: scikit-learn is not installed; skipped")
    return {}
  texts = load_texts(
    config.data.dir,
    config.data.layout,
    config.data.use_content,
    filter_self=config.data.get("filter_self", "off"),
  )
  ks = tuple(config.eval.ks)
  out = {"tfidf_knn_baseline": tfidf_knn(texts, ks)}
  if texts.label_texts is not None:
    out["tfidf_label_text_baseline"] = tfidf_label_text(texts, ks)
  return out


def run_all(data: TextData, ks: tuple[int, ...] = (1, 3, 5)) -> dict[str, dict[str, float]]:
  """{method: metrics}; the TF-IDF methods only when scikit-learn is installed."""
  out = {"label popularity": popularity(data, ks)}
  if sklearn_available():
    out["TF-IDF kNN (char 2-4, k=20)"] = tfidf_knn(data, ks)
    if data.label_texts is not None:
      out["TF-IDF query-label text (char 2-4)"] = tfidf_label_text(data, ks)
  return out


def table(results: dict[str, dict[str, float]], ks: tuple[int, ...] = (1, 3, 5)) -> str:
  """A markdown table of P@k."""
  head = "| method | " + " | ".join(f"P@{k}" for k in ks) + " |"
  rule = "|---|" + "---|" * len(ks)
  rows = [
    f"| {name} | " + " | ".join(f"{m[f'P@{k}']:.2f}" for k in ks) + " |"
    for name, m in results.items()
  ]
  return "\n".join([head, rule, *rows])
