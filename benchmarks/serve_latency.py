r"""Serving latency: single-query p50/p99 and batched throughput of `Predictor`, split into
tokenization, encoder and index time, for L classifier rows of dimension d.

  python benchmarks/serve_latency.py --out=serve_latency.json \
      [--num_labels=100000,1000000] [--dims=64,384] [--single=300] [--batches=8]

For each (L, d): a model directory is exported (export.save_model) with the all-MiniLM-L6-v2
encoder and tokenizer (d=384: as is; d=64: plus a 64-dim bottleneck, as the paper uses for
very large L), max_len 32, and W shaped like trained classifier rows (groups of 8
confusable rows around shared centres). Then, through the same Predictor the CLI uses:
  * ScaNN: index build (first start) and load (second start) seconds; one query at a time
    (`--single` queries: p50/p99 of the whole call and of each part); batches of
    `--batch_size` (queries/s, ms per batch and per part);
  * exact (W on the device, blocked top-k): the same, with fewer single queries;
  * recall@10 of ScaNN against exact on `--recall_queries` embeddings planted near 1-3
    random rows of W (the text queries' embeddings are unrelated to a synthetic W).
Query texts are 3-12 random words of the tokenizer's vocabulary. Writes one JSON object.
"""

import dataclasses
import json
import os
import platform
import shutil
import tempfile
import time

import jax
import numpy as np
from absl import app, flags, logging
from flax import nnx

from astra_jax.model import pretrained
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.model.weights import load_hf_weights
from astra_jax.serving import export
from astra_jax.serving.predictor import Predictor

flags.DEFINE_list("num_labels", ["100000", "1000000"], "classifier rows L")
flags.DEFINE_list("dims", ["64", "384"], "embedding dimensions d (64: MiniLM + bottleneck)")
flags.DEFINE_integer("single", 300, "single queries timed (ScaNN)")
flags.DEFINE_integer("single_exact", 50, "single queries timed (exact)")
flags.DEFINE_integer("batch_size", 256, "queries per batched call")
flags.DEFINE_integer("batches", 8, "batched calls timed")
flags.DEFINE_integer("recall_queries", 1000, "planted queries for recall@10")
flags.DEFINE_integer("k", 10, "labels per query")
flags.DEFINE_integer("max_len", 32, "tokens per query")
flags.DEFINE_string("tmp", None, "where the model directories go (default: system temp)")
flags.DEFINE_string("out", None, "write the JSON here")
flags.mark_flags_as_required(["out"])


def classifier_rows(L: int, d: int, rng) -> np.ndarray:
  centres = rng.normal(size=(max(L // 8, 1), d)).astype(np.float32)
  w = centres[np.arange(L) // 8]
  w += 0.5 * rng.normal(size=(L, d)).astype(np.float32)
  return w / np.sqrt(d)


def query_texts(tokenizer, n: int, rng) -> list[str]:
  words = [t for t in tokenizer.get_vocab() if t.isalpha() and len(t) > 2]
  words.sort()
  return [" ".join(rng.choice(words, rng.integers(3, 13))) for _ in range(n)]


def planted_queries(w: np.ndarray, n: int, rng) -> np.ndarray:
  q = np.stack([w[rng.integers(0, len(w), rng.integers(1, 4))].mean(0) for _ in range(n)])
  return (q + 0.3 * rng.normal(size=q.shape) / np.sqrt(w.shape[1])).astype(np.float32)


def _ms(xs, p):
  return round(1000 * float(np.percentile(xs, p)), 3)


def time_single(p: Predictor, texts, k: int) -> dict:
  parts = {"total": [], "tokenize": [], "encoder": [], "index": []}
  for t in texts:
    t0 = time.perf_counter()
    p.predict([t], k)
    parts["total"].append(time.perf_counter() - t0)
    parts["tokenize"].append(p.timings["tokenize_s"])
    parts["encoder"].append(p.timings["encode_s"])
    parts["index"].append(p.timings["search_s"])
  out = {"queries": len(texts)}
  for name, xs in parts.items():
    out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = _ms(xs, 50), _ms(xs, 99)
  return out


def time_batched(p: Predictor, texts, k: int, batch_size: int, batches: int) -> dict:
  parts = {"total": [], "tokenize": [], "encoder": [], "index": []}
  for b in range(batches):
    chunk = texts[b * batch_size : (b + 1) * batch_size]
    t0 = time.perf_counter()
    p.predict(chunk, k)
    parts["total"].append(time.perf_counter() - t0)
    parts["tokenize"].append(p.timings["tokenize_s"])
    parts["encoder"].append(p.timings["encode_s"])
    parts["index"].append(p.timings["search_s"])
  out = {
    "batch_size": batch_size,
    "batches": batches,
    "queries_per_s": round(batch_size / float(np.median(parts["total"])), 1),
  }
  for name, xs in parts.items():
    out[f"{name}_ms_per_batch"] = _ms(xs, 50)
  return out


def encoder_for(d: int, rng) -> tuple[EncoderConfig, nnx.State, str]:
  hf_dir = pretrained.resolve("all-MiniLM-L6-v2")
  cfg = EncoderConfig.from_hf(hf_dir, bottleneck_dim=0 if d == 384 else d)
  if cfg.embed_dim != d:
    raise ValueError(f"d={d}: MiniLM gives 384, or a bottleneck below it")
  model = Encoder(cfg, nnx.Rngs(params=int(rng.integers(1 << 30))))
  load_hf_weights(model, hf_dir)
  return cfg, nnx.split(model, nnx.Param)[1], hf_dir


def one_config(L: int, d: int, F, root: str, rng) -> list[dict]:
  cfg, params, hf_dir = encoder_for(d, rng)
  w = classifier_rows(L, d, rng)
  wd = os.path.join(root, f"L{L}_d{d}")
  t0 = time.time()
  export.save_model(
    wd,
    encoder_cfg=cfg,
    encoder_params=params,
    classifier=w,
    tokenizer_dir=hf_dir,
    max_len=F.max_len,
    pad_id=0,
  )
  export_s = time.time() - t0
  planted = planted_queries(w, F.recall_queries, rng)
  del w
  n_text = max(F.single, F.batch_size * F.batches)
  results, found = [], {}
  for kind in ("scann", "exact"):
    t0 = time.time()
    p = Predictor.from_workdir(wd, kind)
    start_s = time.time() - t0
    texts = query_texts(p.tokenizer, n_text, rng)
    t0 = time.time()
    p.warmup(F.k)
    warmup_s = time.time() - t0
    row = {
      "num_labels": L,
      "dim": d,
      "index": kind,
      "start_s": round(start_s, 2),
      "compile_warmup_s": round(warmup_s, 2),
    }
    if kind == "scann":
      row["build_s"] = p.index.build_s
      row["scann_params"] = dataclasses.asdict(p.index.index.params)
      t0 = time.time()
      again = Predictor.from_workdir(wd, kind)
      row["restart_s"], row["restart_loaded_index"] = round(time.time() - t0, 2), again.index.loaded
      del again
    row["single"] = time_single(p, texts[: F.single if kind == "scann" else F.single_exact], F.k)
    row["batched"] = time_batched(p, texts, F.k, F.batch_size, F.batches)
    _, found[kind] = p.index.search(planted, F.k)
    results.append(row)
    logging.info("%s", json.dumps(row))
    del p
  recall = float(
    np.mean([len(np.intersect1d(a, b)) / F.k for a, b in zip(found["scann"], found["exact"])])
  )
  results[0]["recall_at_10_vs_exact"] = round(recall, 4)
  results[0]["export_s"] = round(export_s, 2)
  shutil.rmtree(wd, ignore_errors=True)
  return results


def main(_):
  F = flags.FLAGS
  rng = np.random.default_rng(0)
  root = tempfile.mkdtemp(prefix="serve_latency_", dir=F.tmp)
  out = {
    "machine": {
      "cpus": os.cpu_count(),
      "processor": platform.processor() or platform.machine(),
      "jax": jax.__version__,
      "device": jax.devices()[0].platform,
    },
    "encoder": f"all-MiniLM-L6-v2 (6 layers, hidden 384), max_len {F.max_len}; "
    "d=64 adds a bottleneck",
    "k": F.k,
    "note": "ms are wall-clock per call; encoder = tokens -> embeddings on the "
    "host, index = top-k search (+ exact re-scoring for ScaNN)",
    "results": [],
  }
  try:
    for L in map(int, F.num_labels):
      for d in map(int, F.dims):
        out["results"] += one_config(L, d, F, root, rng)
        with open(F.out, "w") as f:  # partial results survive a later failure
          json.dump(out, f, indent=1)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
