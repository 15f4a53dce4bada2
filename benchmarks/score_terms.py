r"""Where a finished run's accuracy comes from, read on its validation split: each score term
alone and mixed.

  PYTHONPATH=. python benchmarks/score_terms.py --workdirs=WD[,WD...] --out=terms.jsonl

WD is a run trained with `--config.data.validation_fraction` > 0 (its exported model and
config.json); the validation rows are the ones `data.validation_fraction` held out, ranked
under the run's own filter (`data.filter_self`). One JSON line per (workdir, score):

- `W`: sigmoid(<w_l, E(x)>), the classifiers alone;
- `text`: sigmoid(s cos(E(x), E(z_l))), the label texts under the same encoder (s = 5);
- `fused beta=b s=s`: (1 - b) W + b text, the score `scoring.label_text_weight` ships;
- `knn k=K tau=t`: the labels of the K training rows nearest to E(x) by cosine, each
  weighted by exp((cos - the best cos) / t) (t = 0: by the cosine itself), normalised per
  query (`eval.knn_diagnostic` is the t = 0 case);
- `W+knn a=a k=K tau=t`: a W + (1 - a) knn;
- `W on training rows`: P@k of W on a sample of the rows it trained on (unfiltered): how
  far W fits them beyond the held-out rows;
- with --mix, `mix beta=b a=a`: (1 - a) fused(beta) + a knn, the run's own score (its
  label-text scale, neighbours and temperature) for every pair of --mix_betas and
  --mix_alphas (what `scoring.choose_jointly` reads);
- with --lexical, the lexical terms (xc/lexical.py) built as training builds them for the
  choice: `lexical text` (t, the TF-IDF cosine with the label texts) and `lexical knn` (u,
  the TF-IDF neighbour vote) alone, and `mix beta=b a=a g=g h=h`: (1 - g - h) mix + g t +
  h u for every (beta, a) pair above and every (g, h) of --lexical_gs x --lexical_hs with
  g + h < 1 (what the choice reads, with (beta, a) then fixed at the chosen pair).

Each line holds P@1/3/5 and PSP@1/3/5 (x100, propensities of the run's config). The exact
scores are dense (n_validation, L): for datasets of up to ~10^5 labels.
"""

import json
import os

import jsonl  # benchmarks/jsonl.py
import numpy as np
import scipy.sparse as sp
from absl import app, flags

from astra_jax.data.validation import SplitSpec, take_rows
from astra_jax.evaluation import baselines, metrics
from astra_jax.serving.predictor import Predictor

flags.DEFINE_list("workdirs", None, "finished validation runs (model/ and config.json)")
flags.DEFINE_string("out", None, "append JSON lines here")
flags.DEFINE_list("betas", ["0.1", "0.3", "0.5"], "fused: the label-text weights")
flags.DEFINE_list("scales", ["5", "10"], "fused: the label-text scales")
flags.DEFINE_list("knn_ks", ["10", "20", "50"], "knn: neighbours")
flags.DEFINE_list("taus", ["0", "0.1", "0.05"], "knn: temperatures (0: cosine weights)")
flags.DEFINE_list("alphas", ["0.2", "0.3", "0.5"], "W+knn: W's weight")
flags.DEFINE_integer("train_sample", 2000, "training rows for `W on training rows`")
flags.DEFINE_bool("mix", False, "also the shipped score for every (beta, a) pair")
flags.DEFINE_list("mix_betas", ["0", "0.1", "0.3", "0.5", "0.7", "0.9"], "mix: label-text weights")
flags.DEFINE_list("mix_alphas", ["0", "0.3", "0.5", "0.7", "0.9"], "mix: neighbour weights")
flags.DEFINE_bool("lexical", False, "also the lexical terms, alone and over every mix")
flags.DEFINE_list("lexical_gs", ["0", "0.1", "0.3", "0.5"], "lexical: label-text weights")
flags.DEFINE_list("lexical_hs", ["0", "0.1", "0.3", "0.5"], "lexical: neighbour weights")


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-x))


class Scorer:
  """P@k and PSP@k of dense (n, L) scores on one run's validation rows."""

  def __init__(self, texts: baselines.TextData, inv_prop: np.ndarray):
    self.texts, self.inv_prop = texts, inv_prop
    self.k = 5 + metrics.max_filtered_per_row(texts.test_filter)

  def __call__(self, scores: np.ndarray) -> dict:
    top = np.argpartition(-scores, self.k, axis=1)[:, : self.k]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)
    ids = metrics.remove_filtered(top, self.texts.test_filter, 5)
    m = metrics.compute(ids, self.texts.test_labels, inv_prop=self.inv_prop, ks=(1, 3, 5))
    return {k: v for k, v in metrics.as_percent(m).items() if k.startswith(("P@", "PSP@"))}


def knn_votes(sims: np.ndarray, train_labels, k: int, tau: float) -> np.ndarray:
  """(n, L) label votes of each query's k most similar training rows (module docstring)."""
  nb = np.argpartition(-sims, k, axis=1)[:, :k]
  s = np.take_along_axis(sims, nb, 1)
  w = np.exp((s - s.max(1, keepdims=True)) / tau) if tau else s
  rows = np.repeat(np.arange(len(nb)), k)
  votes = sp.csr_matrix((w.ravel(), (rows, nb.ravel())), shape=(len(nb), train_labels.num_rows))
  y = sp.csr_matrix(
    (np.ones(train_labels.nnz, np.float32), train_labels.indices, train_labels.indptr),
    shape=(train_labels.num_rows, train_labels.num_cols),
  )
  return (votes @ y).toarray() / np.maximum(w.sum(1, keepdims=True), 1e-12)


def _lexical_terms(texts: baselines.TextData, sc: dict) -> tuple[np.ndarray, np.ndarray]:
  """(t, u) dense (n_validation, L): the lexical terms over the training rows, as the choice
  builds them (each query's 256 best labels of each term; the rest 0)."""
  from astra_jax.xc import lexical

  index = lexical.LexicalIndex.build(texts.train_texts, texts.label_texts, texts.train_labels)
  terms = index.votes(texts.test_texts, sc["neighbours"], sc["neighbour_temperature"])
  out = []
  for v in (terms.label_text, terms.neighbours):
    dense = np.zeros((len(texts.test_texts), texts.num_labels), np.float32)
    rows = np.broadcast_to(np.arange(len(v.ids))[:, None], v.ids.shape)
    keep = v.ids >= 0
    dense[rows[keep], v.ids[keep]] = v.values[keep]
    out.append(dense)
  return out[0], out[1]


def measure(workdir: str):
  """Yields one row per score of `workdir`'s run (module docstring)."""
  with open(os.path.join(workdir, "config.json")) as f:
    cfg = json.load(f)
  data = cfg["data"]
  if not data.get("validation_fraction"):
    raise ValueError(f"{workdir}: trained without a validation split")
  texts = baselines.load_texts(
    data["dir"],
    use_content=data.get("use_content", False),
    split=SplitSpec.from_config(data),
    filter_self=data.get("filter_self", "off"),
  )
  inv = metrics.inverse_propensity(texts.train_labels, data["propensity_A"], data["propensity_B"])
  score = Scorer(texts, inv)
  p = Predictor.from_workdir(workdir, index="exact")
  encode = lambda rows: p.encode(p.to_tokens(rows)[0])
  q = encode(texts.test_texts)
  w = np.asarray(p.model.classifier, np.float32)[: texts.num_labels]
  classifier = _sigmoid(q @ w.T)
  row = lambda name, m: {"workdir": workdir, "score": name, **m}
  yield row("W", score(classifier))
  if texts.label_texts is not None:
    cos = _unit(q) @ _unit(encode(texts.label_texts)).T
    yield row("text", score(_sigmoid(5.0 * cos)))
    for s in map(float, flags.FLAGS.scales):
      for b in map(float, flags.FLAGS.betas):
        fused = (1 - b) * classifier + b * _sigmoid(s * cos)
        yield row(f"fused beta={b} s={s}", score(fused))
  sims = _unit(q) @ _unit(encode(texts.train_texts)).T
  for k in map(int, flags.FLAGS.knn_ks):
    for tau in map(float, flags.FLAGS.taus):
      votes = knn_votes(sims, texts.train_labels, k, tau)
      yield row(f"knn k={k} tau={tau}", score(votes))
      for a in map(float, flags.FLAGS.alphas):
        yield row(f"W+knn a={a} k={k} tau={tau}", score(a * classifier + (1 - a) * votes))
  if (flags.FLAGS.mix or flags.FLAGS.lexical) and texts.label_texts is not None:
    sc = cfg["scoring"]
    votes = knn_votes(sims, texts.train_labels, sc["neighbours"], sc["neighbour_temperature"])
    terms = _lexical_terms(texts, sc) if flags.FLAGS.lexical else None
    if terms is not None:
      yield row("lexical text", score(terms[0]))
      yield row("lexical knn", score(terms[1]))
    for b in map(float, flags.FLAGS.mix_betas):
      fused = (1 - b) * classifier + b * _sigmoid(sc["label_text_scale"] * cos)
      for a in map(float, flags.FLAGS.mix_alphas):
        mixed = (1 - a) * fused + a * votes
        yield row(f"mix beta={b} a={a}", score(mixed))
        for g in map(float, flags.FLAGS.lexical_gs if terms is not None else ()):
          for h in (h for h in map(float, flags.FLAGS.lexical_hs) if g + h < 1):
            lexical = (1 - g - h) * mixed + g * terms[0] + h * terms[1]
            yield row(f"mix beta={b} a={a} g={g} h={h}", score(lexical))
  rng = np.random.default_rng(0)
  sample = rng.choice(len(texts.train_texts), flags.FLAGS.train_sample, replace=False)
  fit = encode([texts.train_texts[i] for i in sample]) @ w.T
  top = np.argsort(-fit, axis=1)[:, :5]
  m = metrics.as_percent(metrics.compute(top, take_rows(texts.train_labels, sample), ks=(1, 3, 5)))
  yield row("W on training rows", {k: v for k, v in m.items() if k.startswith("P@")})


def main(_):
  for wd in flags.FLAGS.workdirs:
    for r in measure(wd):
      jsonl.emit(r, flags.FLAGS.out, digits=2)


if __name__ == "__main__":
  flags.mark_flag_as_required("workdirs")
  app.run(main)
