r"""The neighbour vote's exact search (`xc/neighbour_vote.nearest`): time and peak memory
in tiles against one search over all keys, on random unit rows.

  PYTHONPATH=. python benchmarks/vote_search.py --memory_rows=2000000 --queries=4096 \
    --out=vote_search.jsonl

One JSON line per way: `tiles` (the default tile of 2^26 scores, the memory on the device
or streamed past 4 GiB) and `one search` (a single key block: a (block x N) score array,
as before tiling), each with its seconds (the median of --repeats calls after a first that
compiles) and the process's peak RSS after it. The tiled search runs first: peak RSS only
grows, so its figure is its own. Both find the same neighbours (checked).
"""

import resource
import statistics
import time

import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.data.sparse_rows import SparseRows
from astra_jax.xc import neighbour_vote

flags.DEFINE_integer("memory_rows", 2_000_000, "rows in the memory (N)")
flags.DEFINE_integer("queries", 4096, "queries searched")
flags.DEFINE_integer("dim", 64, "embedding width d")
flags.DEFINE_integer("neighbours", 50, "k")
flags.DEFINE_integer("block", 1024, "queries per matmul")
flags.DEFINE_integer("repeats", 2, "timed calls per way, after the first")
flags.DEFINE_string("out", None, "append JSON lines here")
FLAGS = flags.FLAGS


def _peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB


def main(_):
  rng = np.random.default_rng(0)
  keys = neighbour_vote.unit_rows(rng.normal(size=(FLAGS.memory_rows, FLAGS.dim)))
  queries = rng.normal(size=(FLAGS.queries, FLAGS.dim)).astype(np.float32)
  one_label_each = SparseRows(np.arange(len(keys) + 1), np.zeros(len(keys), np.int32), None, 1)
  memory_keys = neighbour_vote.Memory(keys, one_label_each).search_keys
  found = {}
  for way, tile in (
    ("tiles", neighbour_vote.TILE_FLOATS),
    ("one search", FLAGS.block * FLAGS.memory_rows),
  ):
    search = (queries, memory_keys, FLAGS.neighbours, FLAGS.block, tile)
    found[way] = neighbour_vote.nearest(*search)[0]
    seconds = []
    for _ in range(FLAGS.repeats):
      start = time.perf_counter()
      neighbour_vote.nearest(*search)
      seconds.append(time.perf_counter() - start)
    jsonl.emit(
      {
        "way": way,
        "memory_rows": FLAGS.memory_rows,
        "queries": FLAGS.queries,
        "dim": FLAGS.dim,
        "neighbours": FLAGS.neighbours,
        "memory_gb": keys.nbytes / 1e9,
        "seconds": statistics.median(seconds),
        "peak_rss_gb": _peak_rss_gb(),
      },
      FLAGS.out,
      digits=3,
    )
  same = float(np.mean(found["tiles"] == found["one search"]))
  jsonl.emit({"same_neighbours": same}, FLAGS.out, digits=4)


if __name__ == "__main__":
  app.run(main)
