r"""The neighbour vote's search of its memory (`ann/vote_memory.py`): time, peak memory and,
for ScaNN, recall against the exact search.

  PYTHONPATH=. python benchmarks/vote_search.py --memory_rows=2000000 --queries=4096 \
    --ways=tiles,one_search --out=vote_search.jsonl
  PYTHONPATH=. python benchmarks/vote_search.py --memory_rows=2000000 --queries=4096 \
    --clusters=20000 --ways=tiles,scann --search_rows=5000,20000 --out=vote_search.jsonl

One JSON line per way: `tiles` (the exact search in tiles of 2^26 scores, the memory on the
device or streamed past 4 GiB), `one_search` (a single key block: a (block x N) score
array, as before tiling) and `scann` (an index over the memory, one line per --search_rows
budget, with the build's seconds, one build serving every budget, and recall@k against
the exact search), each with its seconds (the median of --repeats calls after a first that
compiles) and the process's peak RSS after it. Peak RSS only grows, so each way's figure
includes those before it.

The memory: random unit rows (--clusters=0, the worst case for an index: no structure to
partition), or rows around --clusters random centres with Gaussian noise of --noise per
dimension relative to the centres' (real embeddings cluster by topic); the queries are
drawn the same way.
"""

import dataclasses
import resource
import statistics
import time

import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.ann import memory_search, vote_memory
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.xc import neighbour_vote, score_fusion

flags.DEFINE_integer("memory_rows", 2_000_000, "rows in the memory (N)")
flags.DEFINE_integer("queries", 4096, "queries searched")
flags.DEFINE_integer("dim", 64, "embedding width d")
flags.DEFINE_integer("neighbours", 50, "k")
flags.DEFINE_integer("block", 1024, "queries per matmul")
flags.DEFINE_integer("clusters", 0, "centres the rows are drawn around (0: random rows)")
flags.DEFINE_float("noise", 0.5, "the rows' noise around their centre, per dimension")
flags.DEFINE_list("ways", ["tiles", "one_search"], "tiles, one_search, scann")
flags.DEFINE_list("search_rows", ["20000"], "ScaNN's rows scored per query, one line each")
flags.DEFINE_integer("repeats", 2, "timed calls per way, after the first")
flags.DEFINE_string("out", None, "append JSON lines here")
FLAGS = flags.FLAGS


def _peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB


def _rows(rng: np.random.Generator, n: int, centres: np.ndarray | None) -> np.ndarray:
  if centres is None:
    return rng.normal(size=(n, FLAGS.dim)).astype(np.float32)
  x = centres[rng.integers(0, len(centres), n)]
  return (x + FLAGS.noise * rng.normal(size=x.shape)).astype(np.float32)


def _median_seconds(call) -> float:
  call()  # compiles, or builds what it caches
  seconds = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    call()
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def main(_):
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(FLAGS.clusters, FLAGS.dim)) if FLAGS.clusters else None
  keys = score_fusion.unit_rows(_rows(rng, FLAGS.memory_rows, centres))
  queries = _rows(rng, FLAGS.queries, centres)
  one_label_each = SparseRows(np.arange(len(keys) + 1), np.zeros(len(keys), np.int32), None, 1)
  memory = vote_memory.Memory(keys, one_label_each)
  base = {
    "memory_rows": FLAGS.memory_rows,
    "queries": FLAGS.queries,
    "dim": FLAGS.dim,
    "neighbours": FLAGS.neighbours,
    "clusters": FLAGS.clusters,
    "memory_gb": keys.nbytes / 1e9,
  }
  exact = neighbour_vote.NeighbourVote(0.5, FLAGS.neighbours, 0.1, search="exact")
  found = {}
  for way in FLAGS.ways:
    if way in ("tiles", "one_search"):
      tile = vote_memory.TILE_FLOATS if way == "tiles" else FLAGS.block * FLAGS.memory_rows
      search = (queries, memory.search_keys, FLAGS.neighbours, FLAGS.block, tile)
      found[way] = vote_memory.nearest(*search)[0]
      seconds = _median_seconds(lambda search=search: vote_memory.nearest(*search))
      jsonl.emit(
        {"way": way, **base, "seconds": seconds, "peak_rss_gb": _peak_rss_gb()},
        FLAGS.out,
        digits=3,
      )
      continue
    if way != "scann":
      raise app.UsageError(f"--ways: unknown way {way!r}")
    want = found.get("tiles")
    if want is None:
      want = memory.nearest(queries, exact, FLAGS.block)[0]
    for rows in map(int, FLAGS.search_rows):
      vote = dataclasses.replace(exact, search="scann", search_rows=rows)
      params = memory_search.scann_params(len(keys), vote.neighbours, rows)
      start = time.perf_counter()
      memory.scann_index(params)  # one build for every budget: the leaves are the same
      build = time.perf_counter() - start
      ids = memory.nearest(queries, vote)[0]
      recall = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, want)])
      seconds = _median_seconds(lambda vote=vote: memory.nearest(queries, vote))
      jsonl.emit(
        {
          "way": "scann",
          **base,
          "search_rows": rows,
          "leaves": params.num_leaves,
          "leaves_searched": params.num_leaves_to_search,
          "build_seconds": build,
          "seconds": seconds,
          "recall": float(recall),
          "peak_rss_gb": _peak_rss_gb(),
        },
        FLAGS.out,
        digits=3,
      )
  if "tiles" in found and "one_search" in found:
    same = float(np.mean(found["tiles"] == found["one_search"]))
    jsonl.emit({"same_neighbours": same}, FLAGS.out, digits=4)


if __name__ == "__main__":
  app.run(main)
