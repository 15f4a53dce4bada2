"""Lexical score terms: the query's TF-IDF match with each label's text and with the
training rows, mixed into the model's score (`scoring.lexical_*`).

With lexical weights g (label texts) and h (training rows) a query x ranks label l by

    (1 - g - h) m(x, l) + g t(x, l) + h u(x, l),

where m is the model's score (W, the label-text fusion and the neighbour vote; score_fusion.py,
neighbour_vote.py), t(x, l) the cosine of the TF-IDF vectors of x and of l's text, and u the
neighbour vote of neighbour_vote.py taken over TF-IDF vectors instead of E(x): the labels of
the k training rows most similar to x, weighted exp((cos - best cos) / tau) and normalised.
The vectors are the XC libraries' features (evaluation/peers.py): word 1-2-gram and
character (within word) 2-4-gram TF-IDF, sublinear term frequencies, each block
L2-normalised, then the row, the vocabularies and IDF fitted on the training rows' texts.

Why: E(x) is a 256-wide projection of hashed n-grams, trained for a few epochs. Where a
label follows from one exact token of the text (a keyword in its description, a package-name
prefix), the TF-IDF vectors keep that match and E(x) blurs it; where labels follow from
meaning (debian-recommends), the weights chosen on the validation split are 0
(training/score_choice.py, docs/results/lexical.md). The XC libraries read the training
rows' TF-IDF but never the label texts, so t is evidence they do not have.

Both terms are sparse: each query keeps its `top` best labels of each term (the rest count
as 0) and they enter the exact top-k kernels as extra votes (`fold`): no (n, L) array
exists past one block of queries. Cost: a sparse (n x F) by (F x L) product for t and
(n x F) by (F x N) for u, on the host, in blocks; the training rows' TF-IDF is held in
RAM (N rows x their non-zeros x 8 B). For the small datasets the CPU recipe is for; the
planner prices it at SS-20M (plan/score_extras.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from astra_jax.data import csr_files
from astra_jax.data.sparse_rows import SparseRows, StackedRows
from astra_jax.xc.neighbour_vote import NeighbourVote, Votes, label_votes

TOP = 256  # labels each term keeps per query, the highest scored
BLOCK = 1024  # queries per sparse product
MAX_THREADS = 8
WORD_NGRAMS = (1, 2)
CHAR_NGRAMS = (2, 4)


@dataclasses.dataclass(frozen=True)
class LexicalWeights:
  """The lexical terms' weights and the row vote's settings.

  Attributes:
    label_text: g, the TF-IDF label-text term's share of the score.
    neighbours: h, the TF-IDF neighbour vote's share.
    k: training rows that vote.
    temperature: tau of the votes' weights.
  """

  label_text: float = 0.0
  neighbours: float = 0.0
  k: int = 50
  temperature: float = 0.1

  @property
  def total(self) -> float:
    return self.label_text + self.neighbours


def from_scoring(scoring) -> LexicalWeights:
  """The weights of a `scoring` section (the config's, or model.json's record of it)."""
  return LexicalWeights(
    float(scoring.get("lexical_label_text_weight", 0.0)),
    float(scoring.get("lexical_neighbour_weight", 0.0)),
    int(scoring.get("neighbours", 50)),
    float(scoring.get("neighbour_temperature", 0.1)),
  )


class TfidfFeatures:
  """The peers' TF-IDF features (module docstring), fitted once, applied to any texts."""

  def __init__(self, vectorizers: tuple):
    self.vectorizers = vectorizers

  @classmethod
  def fit_transform(cls, texts: list[str]):
    """(the features with vocabularies and IDF from `texts`, `texts`' vectors as
    `__call__` gives them), each text analysed once."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizers = (
      TfidfVectorizer(
        analyzer="word", ngram_range=WORD_NGRAMS, sublinear_tf=True, dtype=np.float32
      ),
      TfidfVectorizer(
        analyzer="char_wb", ngram_range=CHAR_NGRAMS, sublinear_tf=True, dtype=np.float32
      ),
    )
    blocks = [v.fit_transform(texts) for v in vectorizers]
    return cls(vectorizers), _joined(blocks)

  def __call__(self, texts: list[str]):
    """(n, F) scipy CSR float32, rows L2-normalised (an empty text: a zero row)."""
    return _joined([v.transform(texts) for v in self.vectorizers])

  def save(self, directory: str) -> None:
    """Each vectorizer's vocabulary (JSON) and IDF (.npy) under `directory`."""
    os.makedirs(directory, exist_ok=True)
    for i, v in enumerate(self.vectorizers):
      vocab = sorted(v.vocabulary_, key=v.vocabulary_.get)
      with open(os.path.join(directory, f"vocabulary_{i}.json"), "w") as f:
        json.dump(vocab, f)
      np.save(os.path.join(directory, f"idf_{i}.npy"), v.idf_.astype(np.float32))

  @classmethod
  def load(cls, directory: str) -> TfidfFeatures:
    """What `save` wrote."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizers = []
    for i, (analyzer, ngrams) in enumerate((("word", WORD_NGRAMS), ("char_wb", CHAR_NGRAMS))):
      with open(os.path.join(directory, f"vocabulary_{i}.json")) as f:
        vocab = json.load(f)
      v = TfidfVectorizer(
        analyzer=analyzer,
        ngram_range=ngrams,
        sublinear_tf=True,
        dtype=np.float32,
        vocabulary={t: j for j, t in enumerate(vocab)},
      )
      v.idf_ = np.load(os.path.join(directory, f"idf_{i}.npy")).astype(np.float64)
      vectorizers.append(v)
    return cls(tuple(vectorizers))


def _joined(blocks: list):
  """The vectorizers' blocks side by side (each L2-normalised by its vectorizer), each row
  L2-normalised."""
  import scipy.sparse as sp
  from sklearn.preprocessing import normalize

  return normalize(sp.hstack(blocks).tocsr()).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class TermVotes:
  """Each query's two lexical terms, unweighted: t's and u's `top` labels (Votes)."""

  label_text: Votes
  neighbours: Votes

  def beside(self) -> Votes:
    """t's and u's entries side by side (n, 2 top), unweighted: the last two vote parts
    (`vote_factors`)."""
    return Votes.beside([self.label_text, self.neighbours])


@dataclasses.dataclass
class LexicalIndex:
  """What the terms read: the fitted features, the label texts' vectors (L, F) and the
  voting rows' vectors (N, F) with their labels."""

  features: TfidfFeatures
  label_vectors: object  # scipy CSR
  row_vectors: object  # scipy CSR
  row_labels: SparseRows | StackedRows

  @classmethod
  def build(
    cls, train_texts: list[str], label_texts: list[str], row_labels: SparseRows | StackedRows
  ) -> LexicalIndex:
    """Fits the features on `train_texts` (the voting rows, `row_labels`' rows in order)."""
    if len(train_texts) != row_labels.num_rows:
      raise ValueError(f"{len(train_texts)} texts for {row_labels.num_rows} labelled rows")
    features, rows = TfidfFeatures.fit_transform(train_texts)
    return cls(features, features(label_texts), rows, row_labels)

  def save(self, directory: str) -> None:
    """The features, both matrices (scipy .npz) and the rows' labels (CSR .npz)."""
    import scipy.sparse as sp

    self.features.save(directory)
    sp.save_npz(os.path.join(directory, "label_vectors.npz"), self.label_vectors)
    sp.save_npz(os.path.join(directory, "row_vectors.npz"), self.row_vectors)
    csr_files.save_npz(self.row_labels, os.path.join(directory, "row_labels.npz"))

  @classmethod
  def load(cls, directory: str, num_labels: int) -> LexicalIndex:
    """What `save` wrote; `num_labels`: L, the model's."""
    import scipy.sparse as sp

    with np.load(os.path.join(directory, "row_labels.npz")) as z:
      labels = SparseRows(z["indptr"], z["indices"], None, num_labels)
    return cls(
      TfidfFeatures.load(directory),
      sp.load_npz(os.path.join(directory, "label_vectors.npz")).tocsr(),
      sp.load_npz(os.path.join(directory, "row_vectors.npz")).tocsr(),
      labels,
    )

  def with_labels(self, label_texts: list[str], num_labels: int) -> LexicalIndex:
    """The index over a grown label set (serving/grow.py): every label text's vectors under
    the same vocabularies; the rows vote for their old labels."""
    labels = self.row_labels
    return LexicalIndex(
      self.features,
      self.features(label_texts),
      self.row_vectors,
      SparseRows(labels.indptr, labels.indices, None, num_labels),
    )

  def votes(self, texts: list[str], k: int, temperature: float, top: int = TOP) -> TermVotes:
    """Both terms of each of `texts` (module docstring), `top` labels each.

    Args:
      texts: the queries.
      k: training rows that vote.
      temperature: tau of their weights.
      top: labels kept per query and term.
    Returns:
      TermVotes (n, top) each, highest first.
    """
    n = len(texts)
    threads = max(1, min(os.cpu_count() or 1, MAX_THREADS))
    step = max(1, min(BLOCK, -(-n // threads)))

    def block(lo: int) -> tuple[Votes, Votes]:
      q = self.features(texts[lo : lo + step])
      by_text = _top_labels((q @ self._label_vectors_t).toarray(), top)
      sims = (q @ self._row_vectors_t).toarray()
      kk = min(k, sims.shape[1])
      nb = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
      s = np.take_along_axis(sims, nb, 1)
      w = np.exp((s - s.max(1, keepdims=True)) / temperature)
      return by_text, label_votes(nb, w, self.row_labels, top, normalise=True)

    # scipy's sparse products release the GIL: the blocks run on the host's cores.
    with ThreadPoolExecutor(threads) as pool:
      parts = list(pool.map(block, range(0, n, step)))
    if not parts:
      return TermVotes(Votes.none(0, top), Votes.none(0, top))
    cat = lambda which: Votes(
      np.concatenate([p[which].ids for p in parts]),
      np.concatenate([p[which].values for p in parts]),
    )
    return TermVotes(cat(0), cat(1))

  @functools.cached_property
  def _label_vectors_t(self):
    return self.label_vectors.T.tocsr()

  @functools.cached_property
  def _row_vectors_t(self):
    return self.row_vectors.T.tocsr()


def _top_labels(scores: np.ndarray, top: int) -> Votes:
  """Each row's `top` highest positive scores (ids -1 and 0 past its positives)."""
  n, L = scores.shape
  t = min(top, L)
  ids = np.argpartition(-scores, t - 1, axis=1)[:, :t]
  vals = np.take_along_axis(scores, ids, 1)
  order = np.argsort(-vals, axis=1, kind="stable")
  ids, vals = np.take_along_axis(ids, order, 1), np.take_along_axis(vals, order, 1)
  out_ids = np.full((n, top), -1, np.int32)
  out_vals = np.zeros((n, top), np.float32)
  keep = vals > 0
  out_ids[:, :t] = np.where(keep, ids, -1)
  out_vals[:, :t] = np.where(keep, vals, 0.0)
  return Votes(out_ids, out_vals)


def folded_weight(model_weight: float, weights: LexicalWeights) -> float:
  """a' = 1 - (1 - g - h)(1 - a): the share of the one sparse term the kernels mix in."""
  return 1.0 - (1.0 - weights.total) * (1.0 - model_weight)


def fold(
  vote: NeighbourVote | None, weights: LexicalWeights, defaults: NeighbourVote
) -> NeighbourVote | None:
  """The one sparse term the kernels mix in, (1 - a') p + a' v', for the model's vote
  `vote` (weight a, or None) and the lexical `weights`: a' = `folded_weight`, so that p
  keeps its share (1 - g - h)(1 - a); `fold_votes` scales the entries to match. None when
  neither votes. `defaults`: the search's settings where the model itself does not vote."""
  if not weights.total:
    return vote
  a = vote.weight if vote is not None else 0.0
  base = vote if vote is not None else defaults
  return dataclasses.replace(base, weight=folded_weight(a, weights))


def vote_factors(model_weight: float, weights: LexicalWeights) -> tuple[float, float, float]:
  """The factors of v' (`fold`) on its three parts, the model's own votes, t's entries and
  u's: (1 - g - h) a / a', g / a', h / a' (all 0 where a' = 0, nothing votes)."""
  folded = folded_weight(model_weight, weights)
  if not folded:
    return (0.0, 0.0, 0.0)
  share = (1.0 - weights.total) * model_weight / folded
  return (share, weights.label_text / folded, weights.neighbours / folded)


def fold_votes(
  model_votes: Votes | None, model_weight: float, terms: TermVotes, weights: LexicalWeights
) -> Votes:
  """v' of `fold`: the model's votes, t's and u's entries (`terms`, unweighted) side by
  side, each part times its `vote_factors`."""
  share, on_text, on_rows = vote_factors(model_weight, weights)
  parts = [
    Votes(terms.label_text.ids, terms.label_text.values * np.float32(on_text)),
    Votes(terms.neighbours.ids, terms.neighbours.values * np.float32(on_rows)),
  ]
  if model_votes is not None and model_weight:
    parts.insert(0, Votes(model_votes.ids, model_votes.values * np.float32(share)))
  return Votes.beside(parts)
