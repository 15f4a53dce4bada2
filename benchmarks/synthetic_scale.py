r"""Time and peak memory of the synthetic generator at large L.

  python benchmarks/synthetic_scale.py --num_labels=10000000 --out=synthetic_scale.jsonl
  python benchmarks/synthetic_scale.py --config=experiments/ss20m.py:full_labels \
      --num_labels=1000000 --num_train=262144 --num_test=1000 --workers=2

With --config, the spec is that config's `data.synthetic` (sizes from the flags); else the
generator's defaults with --vocab_size.

Writes one JSON line: num_labels, num_train, workers, seconds, peak_rss_bytes (this
process), worker_peak_rss_bytes (the largest query-drawing worker's), bytes_on_disk.
"""

import dataclasses
import os
import resource
import shutil
import tempfile
import time

import jsonl  # benchmarks/jsonl.py
from absl import app, flags

from astra_jax.config import base as config_base
from astra_jax.data import synthetic

flags.DEFINE_integer("num_labels", 10_000_000, "labels to generate")
flags.DEFINE_integer("num_train", 100_000, "training queries")
flags.DEFINE_integer("num_test", -1, "test queries (-1: num_train / 10)")
flags.DEFINE_integer("vocab_size", 50_000, "content words (without --config)")
flags.DEFINE_string("config", None, "PATH[:VARIANT] whose data.synthetic spec to generate")
flags.DEFINE_integer("workers", 0, "query-drawing processes (0: cpu_budget.task_cpus; 1: this one)")
flags.DEFINE_string("out", None, "append the JSON line here")
flags.DEFINE_string("dir", None, "output dir (default: a temporary one, removed afterwards)")


def main(_):
  F = flags.FLAGS
  out_dir = F.dir or tempfile.mkdtemp(prefix="astra_synth_")
  sizes = {
    "num_labels": F.num_labels,
    "num_train": F.num_train,
    "num_test": F.num_train // 10 if F.num_test < 0 else F.num_test,
  }
  if F.config:
    path, _, variant = F.config.partition(":")
    c = config_base.load_config(path, variant or None)
    spec = dataclasses.replace(synthetic.spec_from_config(c.data.synthetic), **sizes)
  else:
    spec = synthetic.SyntheticSpec(**sizes, vocab_size=F.vocab_size)
  t0 = time.time()
  synthetic.generate(out_dir, spec, workers=F.workers)
  record = {
    "config": F.config,
    "num_labels": F.num_labels,
    "num_train": F.num_train,
    "workers": F.workers,
    "seconds": round(time.time() - t0, 1),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "worker_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    "bytes_on_disk": sum(
      os.path.getsize(os.path.join(out_dir, f))
      for f in os.listdir(out_dir)
      if os.path.isfile(os.path.join(out_dir, f))
    ),
  }
  jsonl.emit(record, F.out)
  if not F.dir:
    shutil.rmtree(out_dir)


if __name__ == "__main__":
  app.run(main)
