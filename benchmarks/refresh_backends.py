r"""One hard-negative refresh by each backend: ScaNN on the host against exact on the device.

  python benchmarks/refresh_backends.py --num_labels=1e5,1e6 --num_queries=10000 \
      --out=refresh_backends.jsonl

Label vectors shaped like trained classifier rows (benchmarks/refresh.py's generator: groups
of 8 confusable labels around shared centres, d = 64) and queries near their positive's row.
The same refresh job (`negatives/refresh.run_job`: index, mining with the positives removed,
the negatives file) runs with `backend=scann` (the host default, ScaNN's knobs scaled to L,
all the process's cores) and `backend=device` (`negatives.refresh_backend=device`: exact
blocked top-k on the default jax device, `ann/exact_topk.DeviceIndex`). One JSON line per
(L, backend): num_labels, num_queries, backend, device, build_s, search_s, recall against
exact search (1.0 by construction for the device), the search seconds per 10^5 queries, and
for the device its flops per refresh (2 N L d) and the rate it reached.
"""

import os
import tempfile

import jax
import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.negatives.refresh import RefreshJob, run_job, save_labels

flags.DEFINE_list("num_labels", ["1e5", "1e6"], "label counts")
flags.DEFINE_integer("num_queries", 10_000, "training queries mined per refresh")
flags.DEFINE_integer("k_h", 50, "hard negatives per query")
flags.DEFINE_list("backends", ["scann", "device"], "refresh backends")
flags.DEFINE_string("out", None, "append JSON lines here")
D = 64


def label_vectors(L: int, rng: np.random.Generator) -> np.ndarray:
  centres = rng.normal(size=(max(L // 8, 1), D)).astype(np.float32)
  return centres[np.arange(L) // 8] + 0.5 * rng.normal(size=(L, D)).astype(np.float32)


def main(_):
  F = flags.FLAGS
  rng = np.random.default_rng(0)
  n = F.num_queries
  for L in (int(float(x)) for x in F.num_labels):
    with tempfile.TemporaryDirectory() as d:
      w = label_vectors(L, rng)
      pos = rng.integers(0, L, n)
      q = (w[pos] + 0.3 * rng.normal(size=(n, D))).astype(np.float32)
      np.save(os.path.join(d, "w.npy"), w)
      np.save(os.path.join(d, "q.npy"), q)
      labels = SparseRows(
        np.arange(n + 1, dtype=np.int64), pos.astype(np.int32), np.ones(n, np.float32), L
      )
      save_labels(os.path.join(d, "labels.npz"), labels)
      for backend in F.backends:
        job = RefreshJob(
          0,
          os.path.join(d, "w.npy"),
          os.path.join(d, "q.npy"),
          os.path.join(d, "labels.npz"),
          os.path.join(d, f"out_{backend}.npy"),
          os.path.join(d, f"stats_{backend}.json"),
          F.k_h,
          backend,
          recall_sample=1000,
        )
        stats = run_job(job)
        row = {
          "num_labels": L,
          "num_queries": n,
          "backend": backend,
          "device": str(jax.devices()[0].device_kind) if backend == "device" else "host",
          "host_cores": os.cpu_count(),
          "build_s": stats["build_s"],
          "search_s": stats["search_s"],
          "recall": stats["recall"],
          # The build is once per refresh; the search grows with the queries.
          "search_s_per_1e5_queries": round(stats["search_s"] * 1e5 / n, 2),
        }
        if backend == "device":
          flops = 2.0 * n * L * D
          row.update(flops=flops, flops_per_s=round(flops / max(stats["search_s"], 1e-9)))
        jsonl.emit(row, F.out)


if __name__ == "__main__":
  app.run(main)
