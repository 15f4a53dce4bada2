r"""The data path at SS-20M's shape: generate, parse, tokenize, open, each phase measured.

  python benchmarks/data_scale.py --rows=1000000 --out=data_scale.jsonl [--dir=DIR]

Generates --rows training rows (and --rows/50 test rows) with SS-20M's label statistics
(19,049,952 labels, 1 + Poisson(25) labels per row: mean 26, popularity Zipf with the
synthetic generator's exponent) and 30-word texts (32 tokens with [CLS] and [SEP]), written
in chunks straight to files in the repository layout (past 10^6 rows, the first 10^6
repeated: see `generate`). Then each phase runs in its own
process, so its peak memory is its own:
  generate       writing the files (not part of a run; reported for scale)
  parse_labels   the training labels -> the binary label cache (label_cache)
  open_labels    a second process opens that cache (it must not parse again), then reads
                 what training reads from it: counts, 200 batches of positives
  tokenize       the training texts -> the token cache
  prepare_rest   dataset.load: the test split's caches, then everything opened
  open_cached    a second process's dataset.load on the built caches (no parse, no
                 tokenization: the caches' files stay untouched), then what a training
                 process reads from them: propensities, popularity, 200 sampled batches
  open_split     the same with a validation split of 10% of the rows carved first
                 (data/validation.py: the kept rows read through their ids, the held-out
                 rows' labels copied); compare its peak_anon_bytes with open_cached's
One JSON line per phase: phase, rows, seconds (wall), cpu_seconds, peak_rss_bytes
(ru_maxrss: includes the mapped cache pages the phase touched), peak_anon_bytes (sampled
RssAnon: the process's own memory, without page cache), bytes (files written), and
mb_per_s / mb_per_cpu_s for the parse, rows_per_s for tokenization. The machine may be
shared: cpu_seconds tells a phase's own work from waiting for a core.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jsonl  # noqa: E402  (benchmarks/jsonl.py)

from astra_jax.data import label_cache, synthetic, tokenize  # noqa: E402

flags.DEFINE_integer("rows", 1_000_000, "training rows to generate")
flags.DEFINE_string("out", None, "JSON lines appended here")
flags.DEFINE_string("dir", "", "working directory (default: workdir/data_scale_<rows>)")
flags.DEFINE_string("phase", "", "internal: run one phase in this process")
flags.DEFINE_bool("keep", False, "keep the generated data and caches")
FLAGS = flags.FLAGS

NUM_LABELS = 19_049_952  # SS-20M
MEAN_EXTRA_LABELS = 25  # 1 + Poisson(25): mean 26 labels per row
WORDS_PER_TEXT = 30  # + [CLS] and [SEP]: 32 tokens
MAX_LEN = 32
VOCAB = 8000
CHUNK_ROWS = 100_000
UNIQUE_ROWS = 1_000_000  # see generate
PHASES = (
  "generate",
  "parse_labels",
  "open_labels",
  "tokenize",
  "prepare_rest",
  "open_cached",
  "open_split",
)
VALIDATION_FRACTION = 0.1  # open_split's held-out share


# ------------------------------------------------------------------------------ generation
def _words() -> list[str]:
  """VOCAB words of three syllables (six letters): fixed width, so a chunk of texts is one
  gathered byte matrix."""
  s = synthetic._SYLLABLES
  return [s[i % 70] + s[(i // 70) % 70] + s[(i // 4900) % 70] for i in range(VOCAB)]


def _zipf_labels(rng: np.random.Generator, n: int) -> np.ndarray:
  """n labels with P(rank r) ~ (r + 1)^-s (the synthetic generator's popularity, by its
  continuous inverse CDF: no O(L) table), ranks mapped to ids by a fixed bijection."""
  s = synthetic.SyntheticSpec().zipf_exponent
  top = (NUM_LABELS + 1) ** (1 - s)
  ranks = (1 + rng.random(n) * (top - 1)) ** (1 / (1 - s)) - 1
  ranks = np.minimum(ranks.astype(np.int64), NUM_LABELS - 1)
  return (ranks * 7_368_787 + 1_234_567) % NUM_LABELS  # 7368787 is prime: a bijection


def _label_lines(rng: np.random.Generator, n: int) -> tuple[bytes, int]:
  """n rows of sorted unique labels as text ("id:1.0" pairs), and their pair count."""
  counts = 1 + rng.poisson(MEAN_EXTRA_LABELS, n)
  row = np.repeat(np.arange(n, dtype=np.int64), counts)
  key = np.unique(row * NUM_LABELS + _zipf_labels(rng, len(row)))  # sorted, unique
  row, ids = key // NUM_LABELS, key % NUM_LABELS
  digits = np.maximum(np.floor(np.log10(np.maximum(ids, 1))).astype(np.int64) + 1, 1)
  width = digits + 5  # ":1.0" and a separator
  end = np.cumsum(width)
  out = np.empty(int(end[-1]), np.uint8)
  start = end - width
  for d in range(int(digits.max())):
    has = digits > d
    out[start[has] + digits[has] - 1 - d] = (ids[has] // 10**d) % 10 + ord("0")
  for j, ch in enumerate(b":1.0"):
    out[start + digits + j] = ch
  last = np.ones(len(row), bool)
  last[:-1] = row[1:] != row[:-1]
  out[end - 1] = np.where(last, ord("\n"), ord(" "))
  return out.tobytes(), len(ids)


def _text_lines(rng: np.random.Generator, table: np.ndarray, n: int) -> bytes:
  words = rng.integers(0, VOCAB, (n, WORDS_PER_TEXT))
  lines = table[words].reshape(n, -1)  # each word with its trailing space
  lines[:, -1] = ord("\n")
  return lines.tobytes()


def generate(d: str, rows: int) -> dict:
  """Writes the files. Past UNIQUE_ROWS rows (when a multiple of it) the first UNIQUE_ROWS
  rows are repeated: the same statistics, and a parser or tokenizer does the same work on
  a repeated row, while generating costs I/O only (this machine has 2 shared cores)."""
  os.makedirs(d, exist_ok=True)
  words = _words()
  synthetic.write_word_tokenizer(os.path.join(d, "tokenizer"), words)
  table = np.frombuffer("".join(w + " " for w in words).encode(), np.uint8).reshape(VOCAB, -1)
  nnz = 0
  for split, n, seed in (("trn", rows, 1), ("tst", max(rows // 50, 1), 2)):
    rng = np.random.default_rng(seed)
    unique = UNIQUE_ROWS if n > UNIQUE_ROWS and n % UNIQUE_ROWS == 0 else n
    paths = os.path.join(d, f"{split}_X_Y.txt"), os.path.join(d, f"{split}_X.txt")
    with open(paths[0], "wb") as fy, open(paths[1], "wb") as fx:
      fy.write(f"{n} {NUM_LABELS}\n".encode())
      for s in range(0, unique, CHUNK_ROWS):
        m = min(CHUNK_ROWS, unique - s)
        text, pairs = _label_lines(rng, m)
        fy.write(text)
        fx.write(_text_lines(rng, table, m))
        nnz += pairs * (n // unique) if split == "trn" else 0
    for path, header in zip(paths, (True, False)):
      _repeat_body(path, n // unique - 1, header)
  return {
    "nnz": nnz,
    "mean_labels": round(nnz / rows, 2),
    "bytes": sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".txt")),
  }


def _repeat_body(path: str, times: int, header: bool) -> None:
  """Appends the file's rows (after its header line, when it has one) `times` times."""
  if times <= 0:
    return
  with open(path, "rb") as f:
    start = len(f.readline()) if header else 0
  end = os.path.getsize(path)
  with open(path, "rb") as src, open(path, "ab") as dst:
    for _ in range(times):
      src.seek(start)
      left = end - start
      while left:
        block = src.read(min(64 << 20, left))
        dst.write(block)
        left -= len(block)


# ------------------------------------------------------------------------------ phases
class _DataConfig(dict):
  """`config.data`'s fields that dataset.load reads (attribute access and .get, as a
  ConfigDict): no ml_collections, so the phases run wherever numpy and tokenizers do."""

  __getattr__ = dict.__getitem__


def _data_config(d: str) -> _DataConfig:
  return _DataConfig(
    dir=d,
    cache_dir=os.path.join(d, "astra_cache"),
    layout="renee",
    tokenizer_dir=os.path.join(d, "tokenizer"),
    max_len=MAX_LEN,
    use_content=False,
    augment_label_text=False,
    filter_file="",
    missing_hint="",
  )


def _cache_files(d: str) -> dict[str, int]:
  cache = os.path.join(d, "astra_cache")
  if not os.path.isdir(cache):
    return {}
  return {
    f: os.stat(os.path.join(cache, f)).st_mtime_ns for f in os.listdir(cache) if f.endswith(".npy")
  }


def run_phase(phase: str, d: str, rows: int) -> dict:
  cache = os.path.join(d, "astra_cache")
  if phase == "generate":
    return generate(d, rows)
  if phase == "parse_labels":
    src = os.path.join(d, "trn_X_Y.txt")
    labels = label_cache.cached_labels(src, cache)
    meta = json.load(open(label_cache.cache_stem(src, cache) + ".meta.json"))
    return {
      "nnz": labels.nnz,
      "source_bytes": meta["source_bytes"],
      "bytes": meta["bytes"],
      "mb_per_s": meta["source_bytes"] / 1e6 / meta["seconds"],
      "mb_per_cpu_s": meta["source_bytes"] / 1e6 / meta["cpu_seconds"],
    }
  if phase == "open_labels":
    before = _cache_files(d)
    t0 = time.time()
    labels = label_cache.cached_labels(os.path.join(d, "trn_X_Y.txt"), cache)
    open_s = time.time() - t0
    if _cache_files(d) != before:
      raise RuntimeError("opening the label cache rewrote it")
    return {"open_seconds": open_s, **_label_reads(labels)}
  if phase == "tokenize":
    t0 = time.time()
    tokens = tokenize.cached_tokens(
      os.path.join(d, "trn_X.txt"), cache, os.path.join(d, "tokenizer"), MAX_LEN
    )
    return {"rows_per_s": len(tokens) / (time.time() - t0), "bytes": tokens.nbytes}
  from astra_jax.data import dataset

  if phase == "prepare_rest":
    data = dataset.load(_data_config(d))
    return {"test_rows": data.test_labels.num_rows}
  if phase == "open_cached":
    before = _cache_files(d)
    t0 = time.time()
    data = dataset.load(_data_config(d))
    open_s = time.time() - t0
    if _cache_files(d) != before:
      raise RuntimeError("opening the caches rewrote them")
    return {"open_seconds": open_s, **_training_reads(data)}
  if phase == "open_split":
    from astra_jax.data import validation

    t0 = time.time()
    split = validation.carve(
      dataset.load(_data_config(d)), validation.SplitSpec(VALIDATION_FRACTION)
    )
    open_s = time.time() - t0
    held_out = split.validation.test_labels
    return {
      "open_seconds": open_s,
      "held_out_copy_bytes": held_out.indptr.nbytes + held_out.indices.nbytes,
      **_training_reads(split.train),
    }
  raise ValueError(f"unknown phase {phase!r}")


def _label_reads(labels) -> dict:
  """What a training process reads from the label cache: counts, then 200 batches of 512
  rows' positives as the sampler draws them."""
  from astra_jax.negatives.sampler import NegativeSampler

  t0 = time.time()
  np.argsort(-labels.column_counts())[:5]
  counts_s = time.time() - t0
  sampler, rng = NegativeSampler(labels, 8, 0, 256), np.random.default_rng(0)
  t0 = time.time()
  for _ in range(200):
    sampler(rng.integers(0, labels.num_rows, 512), rng)
  return {"counts_seconds": counts_s, "batch_ms": (time.time() - t0) / 200 * 1e3}


def _training_reads(data) -> dict:
  """What a training process reads beyond opening: propensities and popularity (counts),
  then batches of positives and their tokens, as the sampler draws them."""
  from astra_jax.evaluation import metrics
  from astra_jax.negatives.sampler import NegativeSampler

  t0 = time.time()
  metrics.inverse_propensity(data.train_labels.head(data.num_train_original), 0.55, 1.5)
  np.argsort(-data.train_labels.column_counts())[:5]
  counts_s = time.time() - t0
  sampler = NegativeSampler(data.train_labels, 8, 0, 256)
  rng = np.random.default_rng(0)
  t0 = time.time()
  for _ in range(200):
    rows = rng.integers(0, data.train_labels.num_rows, 512)
    sampler(rows, rng)
    np.asarray(data.train_tokens[np.sort(rows)])
  return {"counts_seconds": counts_s, "batch_ms": (time.time() - t0) / 200 * 1e3}


class _AnonPeak:
  """Samples the process's RssAnon (its own memory, no page cache) every 20 ms."""

  def __init__(self):
    self.peak, self.stop = 0, threading.Event()
    self.thread = threading.Thread(target=self._run, daemon=True)
    self.thread.start()

  def _run(self):
    while not self.stop.wait(0.02):
      with open("/proc/self/status") as f:
        for line in f:
          if line.startswith("RssAnon:"):
            self.peak = max(self.peak, int(line.split()[1]) * 1024)

  def finish(self) -> int:
    self.stop.set()
    self.thread.join()
    return self.peak


def _child(phase: str, d: str, rows: int) -> None:
  anon = _AnonPeak()
  t0, cpu0 = time.time(), time.process_time()
  result = run_phase(phase, d, rows)
  row = {
    "phase": phase,
    "rows": rows,
    "seconds": time.time() - t0,
    "cpu_seconds": time.process_time() - cpu0,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "peak_anon_bytes": anon.finish(),
    **result,
  }
  print("PHASE " + json.dumps(row), flush=True)


def main(argv):
  del argv
  d = FLAGS.dir or os.path.join("workdir", f"data_scale_{FLAGS.rows}")
  if FLAGS.phase:
    return _child(FLAGS.phase, d, FLAGS.rows)
  for phase in PHASES:
    cmd = [
      sys.executable,
      os.path.abspath(__file__),
      f"--rows={FLAGS.rows}",
      f"--dir={d}",
      f"--phase={phase}",
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
      sys.exit(f"error: phase {phase} failed (exit {proc.returncode})")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("PHASE "))
    jsonl.emit(json.loads(line[len("PHASE ") :]), FLAGS.out, digits=3)
  if not FLAGS.keep:
    import shutil

    shutil.rmtree(d)


if __name__ == "__main__":
  app.run(main)
