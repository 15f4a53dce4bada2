"""A synthetic extreme-classification dataset in the repository's on-disk layout.

What makes it a useful stand-in for real XC data:
  * power-law label popularity (a few head labels, a long tail; see `decile_label_shares`),
  * groups of `group_size` confusable labels whose texts share most of their words, so the
    labels that score highest for a query (hard negatives) differ from random ones,
  * optionally, topics of `topic_size` labels (whole groups) whose groups draw their shared
    words from `topic_words` words no other topic uses, as bid phrases about running shoes
    share a vocabulary. Without topics the groups that share a word are unrelated and
    spread over the whole label set, and so are a query's nearest non-positive labels
    (those sharing one of its words); with topics those sit in the query's topic, a
    neighbourhood whose size does not grow with L, as in real label sets,
  * optionally, a vocabulary that grows with L (`vocab_per_label`), so that the labels
    sharing a query's own words (near-ties outside its topic) do not grow with L either,
  * queries built from words of their positive labels plus noise words,
  * deterministic by seed, streamed to disk in chunks so 10^7 labels fit in O(L) memory
    (a permutation and a CDF), never O(L x text).

Files written into `out_dir` (Renée layout): `trn_X.txt`, `tst_X.txt`, `Y.txt`,
`trn_X_Y.txt`, `tst_X_Y.txt`, plus `tokenizer/` (a word-level HF tokenizer over the
generator's vocabulary) and `synthetic.json` (the parameters and statistics).
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import time

import numpy as np
from absl import logging

from astra_jax.data import xc_format
from astra_jax.runtime import cpu_budget, tmpnames

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70 syllables
_CHUNK = 65536  # rows per generated chunk; fixed so output does not depend on memory
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Bumped when the same spec generates different data: data and results made by an older
# generator are then made again (train.prepare_data, reproduce.stale).
GENERATOR_VERSION = 2  # 2: a label drawn twice is drawn again (1 dropped it, rows short)
_MAX_DRAWS_PER_LABEL = 50  # a row of a tiny label set may not find its count of new labels


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
  """What to generate. A field added later must default to what the generator did before
  it, so data written before stay current (`is_current`)."""

  num_labels: int = 2000
  num_train: int = 20000
  num_test: int = 4000
  group_size: int = 8  # labels per confusable group
  group_words: int = 3  # words every label of a group shares
  own_words: int = 2  # words that tell a label apart inside its group
  hidden_own_words: int = 0  # of them, left out of the label's text: only its queries
  # (so its classifier) show them, as a real label's text
  # does not say all that its queries do
  vocab_size: int = 8000  # content words (noise words are the first 200)
  zipf_exponent: float = 0.75  # label popularity ~ (rank + 1) ^ -exponent
  mean_labels: float = 2.5  # mean labels per query (1 + Poisson, capped at max_labels)
  max_labels: int = 7
  same_group_prob: float = 0.3  # an extra positive comes from the first one's group
  own_word_prob: float = 0.85  # a query mentions each own word of a positive with it
  noise_words: int = 2  # mean noise words per query
  seed: int = 0
  topic_size: int = 0  # labels per topic, a multiple of group_size (0: no topics)
  topic_words: int = 16  # a topic's own words, from which its groups draw their shared words
  vocab_per_label: float = 0.0  # > 0: at least this many content words per label (see
  # content_vocab_size), so that a word is shared by as many labels at any label count


def spec_from_config(synthetic_cfg) -> SyntheticSpec:
  """The spec a `config.data.synthetic` describes (a field it lacks keeps the default).

  Args:
    synthetic_cfg: the config's `data.synthetic` block (a ConfigDict or a mapping).
  Returns:
    The SyntheticSpec to generate.
  """
  return SyntheticSpec(
    **{
      f.name: synthetic_cfg[f.name]
      for f in dataclasses.fields(SyntheticSpec)
      if f.name in synthetic_cfg
    }
  )


def ensure_generated(out_dir: str, spec: SyntheticSpec, workers: int = 1) -> bool:
  """Generates the dataset into `out_dir` unless the data there is this spec's already.

  Args:
    out_dir: the dataset's directory.
    spec: what it must hold.
    workers: as `generate`'s.
  Returns:
    Whether it was generated now.
  """
  if is_current(out_dir, spec):
    return False
  logging.info("generating synthetic dataset into %s", out_dir)
  generate(out_dir, spec, workers)
  return True


def word(i: int | np.ndarray) -> str:
  """Pseudo-word number i: syllables as base-70 digits, at least two ('baka', 'bake'...)."""
  i = int(i)
  out = []
  while True:
    out.append(_SYLLABLES[i % len(_SYLLABLES)])
    i //= len(_SYLLABLES)
    if i == 0 and len(out) >= 2:
      break
  return "".join(reversed(out))


def num_topics(spec: SyntheticSpec) -> int:
  """Topics of `spec.topic_size` labels (the last may be short); 0 without topics."""
  return -(-spec.num_labels // spec.topic_size) if spec.topic_size else 0


def content_vocab_size(spec: SyntheticSpec) -> int:
  """Noise plus content words: `vocab_size`, or `vocab_per_label` x num_labels if larger.

  Each label's own words are hashed into the content words. At a fixed vocabulary the labels
  sharing a query's own words grow with L (400 per word at 10^7 labels and 50,000 words,
  40 at 10^6), and so do a query's near-ties outside its topic; a real vocabulary grows
  with its corpus instead.
  """
  return max(spec.vocab_size, math.ceil(spec.vocab_per_label * spec.num_labels))


def num_words(spec: SyntheticSpec) -> int:
  """The generator's vocabulary size: noise, content, then the topics' own words."""
  return content_vocab_size(spec) + num_topics(spec) * spec.topic_words


def vocabulary(spec: SyntheticSpec) -> list[str]:
  """The generator's words: noise words, content words, then each topic's own words."""
  return [word(i) for i in range(num_words(spec))]


def _group_word_ids(spec: SyntheticSpec, groups: np.ndarray) -> np.ndarray:
  """(n, group_words) word ids shared by each group's labels: hashed content words, or with
  topics `group_words` distinct words of the group's topic, which owns the word ids
  content_vocab_size + t * topic_words + j (j < topic_words), shared with no other topic."""
  content = content_vocab_size(spec) - 200  # the first 200 words are reserved for noise
  if not spec.topic_size:
    cols = [_hash(spec.seed, 1, groups, j) for j in range(spec.group_words)]
    return (np.stack(cols, 1) % np.uint64(content)).astype(np.int64) + 200
  keys = np.stack([_hash(spec.seed, 5, groups, j) for j in range(spec.topic_words)], 1)
  picked = np.argsort(keys, axis=1, kind="stable")[:, : spec.group_words]
  topics = groups * spec.group_size // spec.topic_size
  return content_vocab_size(spec) + topics[:, None] * spec.topic_words + picked


def _splitmix64(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.uint64, copy=True)
  with np.errstate(over="ignore"):
    x += np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash(seed: int, stream: int, ids: np.ndarray, j: int) -> np.ndarray:
  """A counter-based hash: the same (seed, stream, id, j) always gives the same value."""
  with np.errstate(over="ignore"):
    key = _splitmix64(np.array([seed * 1_000_003 + stream * 7919 + j], np.uint64))[0]
    return _splitmix64(ids.astype(np.uint64) ^ key)


def label_word_ids(spec: SyntheticSpec, labels: np.ndarray) -> np.ndarray:
  """(n, group_words + own_words) word ids of the given labels' texts."""
  labels = np.asarray(labels, np.int64)
  own = [_hash(spec.seed, 2, labels, j) for j in range(spec.own_words)]
  content = content_vocab_size(spec) - 200  # the first 200 words are reserved for noise
  own = (np.stack(own, 1) % np.uint64(content)).astype(np.int64) + 200
  return np.concatenate([_group_word_ids(spec, labels // spec.group_size), own], axis=1)


class _Popularity:
  """Samples labels with P(label of rank r) ~ (r + 1)^-s; ranks are a seeded permutation."""

  def __init__(self, spec: SyntheticSpec):
    rng = np.random.default_rng([spec.seed, 11])
    self.label_of_rank = rng.permutation(spec.num_labels)
    cdf = np.arange(1, spec.num_labels + 1, dtype=np.float64)  # in place: O(L) once
    np.power(cdf, -spec.zipf_exponent, out=cdf)
    np.cumsum(cdf, out=cdf)
    cdf /= cdf[-1]
    self.cdf = cdf

  def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
    ranks = np.searchsorted(self.cdf, rng.random(n), side="right")
    return self.label_of_rank[np.minimum(ranks, len(self.cdf) - 1)]


def _query_chunk(
  spec: SyntheticSpec,
  pop: _Popularity,
  words: list[str],
  stream: int,
  n: int,
  chunk: int,
  chunk_rows: int,
) -> tuple[list[str], list[list[int]]]:
  """(texts, label_rows) of chunk `chunk` of a split of `n` queries. Each chunk draws from
  its own seeded stream, so chunks can be made in any order, or in other processes, and
  the output stays the same."""
  start = chunk * chunk_rows
  m = min(chunk_rows, n - start)
  rng = np.random.default_rng([spec.seed, stream, chunk])
  counts = np.minimum(
    1 + rng.poisson(spec.mean_labels - 1.0, m), min(spec.max_labels, spec.num_labels)
  )
  first = pop.sample(rng, m)
  texts, rows = [], []
  for i in range(m):
    labels = [int(first[i])]
    for _ in range(_MAX_DRAWS_PER_LABEL * int(counts[i])):
      if len(labels) == counts[i]:
        break
      if rng.random() < spec.same_group_prob:
        g0 = labels[0] - labels[0] % spec.group_size
        cand = g0 + int(rng.integers(spec.group_size))
        cand = cand if cand < spec.num_labels else int(pop.sample(rng, 1)[0])
      else:
        cand = int(pop.sample(rng, 1)[0])
      if cand not in labels:
        labels.append(cand)
    ids = label_word_ids(spec, np.asarray(labels))
    toks = []
    for row in ids:
      shared = row[: spec.group_words]
      toks += list(rng.choice(shared, size=rng.integers(1, spec.group_words + 1), replace=False))
      own = row[spec.group_words :]
      toks += [w for w in own if rng.random() < spec.own_word_prob]
    toks += list(rng.integers(0, 200, size=rng.poisson(spec.noise_words)))
    rng.shuffle(toks)
    texts.append(" ".join(words[t] for t in toks))
    rows.append(sorted(labels))
  return texts, rows


# The state a generator worker process builds once (its own popularity table and words).
_worker_state: tuple[SyntheticSpec, _Popularity, list[str]] | None = None


def _start_worker(spec: SyntheticSpec) -> None:
  global _worker_state
  _worker_state = (spec, _Popularity(spec), vocabulary(spec))


def _worker_chunk(job: tuple[int, int, int, int]) -> tuple[list[str], list[list[int]]]:
  spec, pop, words = _worker_state
  return _query_chunk(spec, pop, words, *job)


def _query_chunks(spec: SyntheticSpec, pop: _Popularity | None, words: list[str], jobs, pool):
  """Yields each job's (texts, label_rows) in the jobs' order: from `pool`'s processes when
  given (each builds its own popularity table), else here."""
  if pool is None:
    return (_query_chunk(spec, pop, words, *job) for job in jobs)
  return pool.imap(_worker_chunk, jobs)


def generate(out_dir: str, spec: SyntheticSpec, workers: int = 1) -> dict:
  """Writes the dataset; returns its statistics (also saved as `synthetic.json`).

  Args:
    out_dir: the dataset's directory (created).
    spec: what to generate.
    workers: processes that draw the queries, chunk by chunk (1: this process; 0: this
      task's CPUs, `cpu_budget.task_cpus`). The files do not depend on it. More than one
      are spawned, which re-imports the caller's main module: a script must guard its
      entry point with `if __name__ == "__main__":` (the CLIs, which pass 0, do).
  Returns:
    The statistics written to synthetic.json.
  """
  if not 0 <= spec.hidden_own_words <= spec.own_words:
    raise ValueError(
      f"hidden_own_words {spec.hidden_own_words}: a label has {spec.own_words} own words"
    )
  if spec.topic_size and (spec.topic_size % spec.group_size or spec.topic_words < spec.group_words):
    raise ValueError(
      f"topic_size {spec.topic_size}, topic_words {spec.topic_words}: a topic holds whole "
      f"groups of {spec.group_size} labels and at least group_words={spec.group_words} words"
    )
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.time()
  words = vocabulary(spec)
  text_words = spec.group_words + spec.own_words - spec.hidden_own_words
  # Label texts, streamed.
  with xc_format.atomic_text_writer(os.path.join(out_dir, "Y.txt")) as f:
    for start in range(0, spec.num_labels, _CHUNK):
      labels = np.arange(start, min(start + _CHUNK, spec.num_labels))
      for row in label_word_ids(spec, labels)[:, :text_words]:
        f.write(" ".join(words[w] for w in row) + "\n")
      logging.log_every_n_seconds(
        logging.INFO, "synthetic: %d/%d label texts", 10, labels[-1] + 1, spec.num_labels
      )
  counts = np.zeros(spec.num_labels, np.int32)
  splits = (("trn", 3, spec.num_train), ("tst", 4, spec.num_test))
  chunks = sum(-(-n // _CHUNK) for _, _, n in splits)
  workers = min(workers or cpu_budget.task_cpus(), chunks)
  # Processes only where a split spans chunks: a chunk's queries take far longer than a
  # process's start (docs/results/datasets.md); spawned, not forked: the caller may hold
  # JAX's threads, which a fork would copy mid-lock.
  pool, pop = None, None
  if workers > 1 and chunks > len(splits):
    pool = multiprocessing.get_context("spawn").Pool(workers, _start_worker, (spec,))
  else:
    pop = _Popularity(spec)  # with a pool, each worker holds its own (O(L) bytes)
  try:
    for split, stream, n in splits:
      x_path = os.path.join(out_dir, f"{split}_X.txt")
      y_path = os.path.join(out_dir, f"{split}_X_Y.txt")
      jobs = [(stream, n, c, _CHUNK) for c in range(-(-n // _CHUNK))]
      with xc_format.atomic_text_writer(x_path) as fx, xc_format.atomic_text_writer(y_path) as fy:
        fy.write(f"{n} {spec.num_labels}\n")
        done = 0
        for texts, rows in _query_chunks(spec, pop, words, jobs, pool):
          for text, row in zip(texts, rows):
            fx.write(text + "\n")
            fy.write(" ".join(f"{l}:1" for l in row) + "\n")
            if split == "trn":
              counts[row] += 1
          done += len(texts)
          logging.info("synthetic: %s %d/%d queries (%.0fs)", split, done, n, time.time() - t0)
  finally:
    if pool is not None:
      pool.terminate()
  write_word_tokenizer(os.path.join(out_dir, "tokenizer"), words)
  stats = {
    "spec": dataclasses.asdict(spec),
    "generator": GENERATOR_VERSION,
    "label_deciles_pct": [round(100 * float(s), 2) for s in decile_label_shares(counts)],
    "train_labels_seen": int((counts > 0).sum()),
    "seconds": round(time.time() - t0, 1),
  }
  with xc_format.atomic_text_writer(os.path.join(out_dir, "synthetic.json")) as f:
    json.dump(stats, f, indent=1)
  return stats


def is_current(out_dir: str, spec: SyntheticSpec) -> bool:
  """Whether `out_dir` holds the data this generator writes for `spec`."""
  path = os.path.join(out_dir, "synthetic.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    stats = json.load(f)
  if not isinstance(stats.get("spec"), dict) or not stats["spec"]:
    return False
  try:  # a field added since reads as its default, which generates what came before it
    saved = SyntheticSpec(**stats["spec"])
  except TypeError:  # a field this code does not know
    return False
  return saved == spec and stats.get("generator", 1) == GENERATOR_VERSION


def decile_label_shares(label_counts: np.ndarray) -> list[float]:
  """The paper's decile table: sort labels by training count (head first), cut the training
  (point, label) pairs into 10 equal parts, return the share of labels in each part,
  head decile first (the paper prints decile 10 = head first too)."""
  counts = np.sort(label_counts[label_counts > 0])[::-1]
  if counts.size == 0:
    return [0.0] * 10
  cum = np.cumsum(counts) / counts.sum()
  decile = np.minimum((np.concatenate([[0.0], cum[:-1]]) * 10).astype(int), 9)
  return list(np.bincount(decile, minlength=10) / counts.size)


def write_word_tokenizer(out_dir: str, words: list[str]) -> None:
  """A whitespace word-level tokenizer with BERT's special tokens, saved for AutoTokenizer."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
  for w in words:
    vocab.setdefault(w, len(vocab))
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
  )
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    pad_token="[PAD]",
    unk_token="[UNK]",
    cls_token="[CLS]",
    sep_token="[SEP]",
    mask_token="[MASK]",
  )
  tmp = out_dir + f".tmp-{tmpnames.unique_suffix()}"
  fast.save_pretrained(tmp)
  if os.path.exists(out_dir):
    import shutil

    shutil.rmtree(out_dir)
  os.replace(tmp, out_dir)
