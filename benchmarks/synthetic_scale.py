r"""Time and peak memory of the synthetic generator at large L.

  python benchmarks/synthetic_scale.py --num_labels=10000000 --out=synthetic_scale.jsonl

Writes one JSON line: num_labels, num_train, seconds, peak_rss_bytes, bytes_on_disk.
"""

import os
import resource
import shutil
import tempfile
import time

from absl import app, flags

from astra_jax.data import synthetic

import jsonl  # benchmarks/jsonl.py

flags.DEFINE_integer("num_labels", 10_000_000, "labels to generate")
flags.DEFINE_integer("num_train", 100_000, "training queries")
flags.DEFINE_integer("vocab_size", 50_000, "content words")
flags.DEFINE_string("out", None, "append the JSON line here")
flags.DEFINE_string("dir", None, "output dir (default: a temporary one, removed afterwards)")


def main(_):
  F = flags.FLAGS
  out_dir = F.dir or tempfile.mkdtemp(prefix="astra_synth_")
  spec = synthetic.SyntheticSpec(
    num_labels=F.num_labels,
    num_train=F.num_train,
    num_test=F.num_train // 10,
    vocab_size=F.vocab_size,
  )
  t0 = time.time()
  synthetic.generate(out_dir, spec)
  record = {
    "num_labels": F.num_labels,
    "num_train": F.num_train,
    "seconds": round(time.time() - t0, 1),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
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
