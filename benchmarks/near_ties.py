r"""Where a query's exact top k lie in a synthetic stand-in's W, and why.

  python benchmarks/near_ties.py --work_dir=WORK --out=near_ties.jsonl

WORK is a `benchmarks/scale_run.py` work directory of a synthetic run (`data/` with its
`synthetic.json`, `tokenizer/` and texts; `refresh_inputs/` with the W and the query
embeddings a refresh searched; `killed/config.json`). For --num_queries training queries
drawn by --seed, the k rows of W that score highest (exact search) are sorted into:
positives; other labels of the query's group (its positives' most common group); other
labels of its topic; and, outside its topic, labels whose text shares a token with the
query (`shares_word`), labels sharing only a hash bucket of the n-gram bag's table with it
(`collision`), and the rest (`other`). A fixed-cost search finds what lies in a query's
topic; what lies outside it is spread over all of W, and its share is what the rows a
refresh must score grow with.

One JSON line: work_dir, num_labels, k, num_queries, hash_buckets, and the share of the k
slots in each class (they sum to 1).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import jsonl  # benchmarks/jsonl.py
import ml_collections
import numpy as np
from absl import app, flags
from tokenizers import Tokenizer

from astra_jax.ann import index as index_lib
from astra_jax.data import xc_format
from astra_jax.model import architectures
from astra_jax.model.ngram_bag import hashed_ngrams

flags.DEFINE_string("work_dir", None, "a scale_run.py work directory", required=True)
flags.DEFINE_integer("epoch", 2, "the refresh whose inputs are read (refresh_inputs/*_epochE)")
flags.DEFINE_integer("k", 32, "the exact top k examined")
flags.DEFINE_integer("num_queries", 200, "training queries examined")
flags.DEFINE_integer("seed", 0, "which queries")
flags.DEFINE_string("out", None, "append the JSON line here")
FLAGS = flags.FLAGS

CLASSES = ("positive", "group", "topic", "shares_word", "collision", "other")


def _lines(path: str, wanted: set[int]) -> dict[int, str]:
  """The given line numbers of a text file, read in one pass."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f):
      if i in wanted:
        out[i] = line.rstrip("\n")
  return out


def classify(
  top: np.ndarray,
  positives: list[np.ndarray],
  query_tokens: list[set[int]],
  label_tokens: dict[int, set[int]],
  bucket_of: dict[int, int],
  group_size: int,
  topic_size: int,
) -> dict[str, int]:
  """Counts of each class in CLASSES over the rows `top` (n, k) of n queries.

  Args:
    top: each query's exact top-k label ids.
    positives: each query's positive label ids.
    query_tokens: each query's token ids.
    label_tokens: the token ids of every label in `top`.
    bucket_of: token id -> its hash bucket, for every token above.
    group_size: labels per group.
    topic_size: labels per topic (0: no topics; then nothing is `topic`).
  Returns:
    {class: count}.
  """
  counts = dict.fromkeys(CLASSES, 0)
  for row, pos, q_tok in zip(top, positives, query_tokens):
    group = np.bincount(pos // group_size).argmax()
    topic = np.bincount(pos // topic_size).argmax() if topic_size else -1
    q_buckets = {bucket_of[t] for t in q_tok}
    pos_set = set(pos.tolist())
    for label in row.tolist():
      if label in pos_set:
        kind = "positive"
      elif label // group_size == group:
        kind = "group"
      elif topic_size and label // topic_size == topic:
        kind = "topic"
      elif label_tokens[label] & q_tok:
        kind = "shares_word"
      elif {bucket_of[t] for t in label_tokens[label]} & q_buckets:
        kind = "collision"
      else:
        kind = "other"
      counts[kind] += 1
  return counts


def main(argv):
  del argv
  work = FLAGS.work_dir
  spec = json.load(open(os.path.join(work, "data", "synthetic.json")))["spec"]
  L = spec["num_labels"]
  cfg = ml_collections.ConfigDict(json.load(open(os.path.join(work, "killed", "config.json"))))
  tok = Tokenizer.from_file(os.path.join(work, "data", "tokenizer", "tokenizer.json"))
  buckets = architectures.ngram_hash_buckets(cfg.encoder.ngram, tok.get_vocab_size())
  inputs = os.path.join(work, "refresh_inputs")
  w = np.load(os.path.join(inputs, f"vectors_epoch{FLAGS.epoch}.npy"), mmap_mode="r")
  q_all = np.load(os.path.join(inputs, f"queries_epoch{FLAGS.epoch}.npy"), mmap_mode="r")
  rng = np.random.default_rng(FLAGS.seed)
  qi = np.sort(rng.choice(q_all.shape[0], FLAGS.num_queries, replace=False))
  top = index_lib.ExactIndex(np.asarray(w)).search(np.asarray(q_all[qi]), FLAGS.k)
  trn = xc_format.read_sparse(os.path.join(work, "data", "trn_X_Y.txt"), L)
  q_text = _lines(os.path.join(work, "data", "trn_X.txt"), set(qi.tolist()))
  y_text = _lines(os.path.join(work, "data", "Y.txt"), set(top.ravel().tolist()))
  q_tok = [set(tok.encode(q_text[i]).ids) for i in qi.tolist()]
  y_tok = {label: set(tok.encode(t).ids) for label, t in y_text.items()}
  tokens = sorted(set().union(*q_tok, *y_tok.values()))
  ids = jnp.asarray(np.array(tokens, np.int32)[:, None])
  b, _ = hashed_ngrams(ids, 1, buckets, -1)  # one unigram per row; no id is the pad
  bucket_of = dict(zip(tokens, np.asarray(b)[:, 0].tolist()))
  counts = classify(
    top,
    [trn.row(i) for i in qi.tolist()],
    q_tok,
    y_tok,
    bucket_of,
    spec["group_size"],
    spec.get("topic_size", 0),
  )
  total = sum(counts.values())
  jsonl.emit(
    {
      "work_dir": work,
      "num_labels": L,
      "k": FLAGS.k,
      "num_queries": FLAGS.num_queries,
      "hash_buckets": buckets,
      **{c: round(n / total, 4) for c, n in counts.items()},
    },
    FLAGS.out,
  )


if __name__ == "__main__":
  app.run(main)
