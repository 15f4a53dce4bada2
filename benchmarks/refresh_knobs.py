r"""ScaNN knobs for hard-negative mining at a fixed cost per query, chosen on 10^6-10^7 rows.

  python benchmarks/refresh_knobs.py --num_labels=1e6,1e7 --out=refresh_knobs.jsonl
  python benchmarks/refresh_knobs.py --vectors=W.npy --queries=Q.npy --out=...  # trained W
  python benchmarks/refresh_knobs.py --config=experiments/ss20m.py:full_labels \
      --vectors=W.npy --queries=Q.npy --labels=trn_X_Y.txt --timed_queries=100000

A refresh mines k_h negatives for every training query (146M at SS-20M) from W's rows. With
~2 sqrt(L) leaves and a third of them searched (the default rule), a query scores L/3 rows,
and a refresh's cost grows as N L. `index.scann_defaults(rows_per_query=R)` instead keeps
the rows a query scores about constant: leaves of about `leaf_rows` rows (so their number
grows with L) and as many searched as hold R rows. This benchmark measures, per L and R,
recall@k against exact search on a sample of queries, the rows each query scores, and build
and search time, so R can be chosen where recall holds at both sizes.

Label vectors: trained classifier rows of related labels sit near each other at several
scales (a topic, a group of near-duplicates inside it), and a query sits near its
positives' rows. The generator makes topics of --topic_rows rows around --topic_scale N(0, I)
centres,
groups of 8 inside a topic (offset 0.5 N(0, I)), rows 0.3 N(0, I) around their group, and
queries 0.3 N(0, I) around the mean of 1-3 rows of one topic. A topic's size does not
change with L: the assumption under any fixed-cost search, that a query's hard negatives
live in a neighbourhood whose size does not grow with the label count.

With --vectors and --queries, the rows and queries are a refresh's inputs instead (a
trained W and its training queries' embeddings, as benchmarks/scale_run.py keeps them in
WORK/refresh_inputs/): --num_queries of the queries, drawn by --seed, are searched. With
--labels too (the run's trn_X_Y.txt, row i the positives of query i), each setting also
reports `negatives_recall`: the k negatives it mines (positives removed, as a refresh does)
against the k exact search mines, the set training uses.

With --config, the index is built with that config's `negatives.index` knobs and k is its
`negatives.k_h` (the partitioner, leaf and group flags are then not read); --rows_per_query
still sweeps the rows each query scores. With --timed_queries, the search is timed on that
many further queries (not those checked), once on each of --timed_threads thread counts,
and each line also reports `core_seconds_per_1e5_queries` (search seconds x threads, per
10^5 queries) on the first, and `core_seconds_by_threads` on each.

One JSON line per (L, setting): num_labels, leaves_to_search, num_leaves (every group's, for
a grouped build), leaf_shrink, group_rows and groups, reorder, rows_scored_per_query (leaves
searched x mean rows per leaf, SOAR's second copies counted), centroids_scored_per_query,
peak_rss_bytes_after_build (the process's peak so far), recall (mean |ANN top-k ∩ exact
top-k| / k), negatives_recall (with --labels, else null), build_s,
search_ms_per_query, exact_ms_per_query, and with --timed_queries timed_queries, threads,
core_seconds_per_1e5_queries and core_seconds_by_threads.
"""

import dataclasses
import itertools
import resource
import time

import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.ann import grouped_index, index as index_lib
from astra_jax.config import base as config_base
from astra_jax.data import sparse_rows, xc_format
from astra_jax.negatives import mining
from astra_jax.runtime import cpu_budget

flags.DEFINE_list("num_labels", ["1e6", "1e7"], "label counts")
flags.DEFINE_integer("d", 64, "row dimension")
flags.DEFINE_integer("k", 50, "hard negatives per query (recall@k)")
flags.DEFINE_integer("num_queries", 1000, "queries searched and checked against exact search")
flags.DEFINE_integer("topic_rows", 1000, "rows per topic (see the module docstring)")
flags.DEFINE_float(
  "topic_scale",
  0.2,
  "scale of the topic centres: smaller puts topics closer, "
  "so a query's top-k reaches into neighbouring topics",
)
flags.DEFINE_list(
  "rows_per_query",
  ["16000", "32000", "64000", "128000"],
  "rows scored per query: the settings measured",
)
flags.DEFINE_list(
  "partitioner",
  ["avq_soar", "plain"],
  "avq_soar (AVQ centres + SOAR spilling, as the serving index) and/or plain k-means leaves",
)
flags.DEFINE_list(
  "exact_leaf_rows",
  ["0"],
  "> 0: L / this many leaves (index.scann_defaults' leaf_rows, config.negatives."
  "index.leaf_rows); 0: the fixed-cost rule's own (at least 2 sqrt(L) leaves); a list "
  "builds one index each",
)
flags.DEFINE_float(
  "leaf_shrink",
  0.0,
  "> 0: leaves of exact_leaf_rows x (10^6 / L)^this rows (index.scann_defaults' "
  "leaf_shrink, config.negatives.index.leaf_shrink)",
)
flags.DEFINE_list(
  "group_rows",
  ["0"],
  "> 0: build the index in groups of about this many rows (grouped_index.GroupedScannIndex, "
  "config.negatives.index.group_rows); 0: one flat index; a list builds one index each",
)
flags.DEFINE_list(
  "training_sample_size",
  ["0"],
  "rows the leaf centres are trained on, one build each (0: index.scann_defaults')",
)
flags.DEFINE_list(
  "reorder",
  ["0"],
  "candidates re-scored exactly after the quantized scores, searched on each build "
  "(0: index.scann_defaults'); a large value leaves only the partition's loss",
)
flags.DEFINE_integer("seed", 0, "data seed")
flags.DEFINE_string("vectors", None, "(L, d) float32 .npy of label vectors (instead of generated)")
flags.DEFINE_string("queries", None, "(N, d) float32 .npy of queries (with --vectors)")
flags.DEFINE_string(
  "labels", None, "the queries' positives, an XC label file (with --queries): negatives_recall"
)
flags.DEFINE_string(
  "config",
  None,
  "FILE[:VARIANT]: build with this config's negatives.index knobs and k = its negatives.k_h",
)
flags.DEFINE_integer(
  "timed_queries", 0, "> 0: time the search on this many queries besides those checked"
)
flags.DEFINE_integer("threads", 0, "ScaNN's threads for the build (0: the task's CPUs)")
flags.DEFINE_list(
  "timed_threads", ["1"], "ScaNN's threads for the timed searches, one timing each (0: --threads)"
)
flags.DEFINE_string("out", None, "append JSON lines here")
FLAGS = flags.FLAGS


def label_vectors(L: int, d: int, topic_rows: int, rng: np.random.Generator) -> np.ndarray:
  """(L, d) float32 rows in topics of `topic_rows` and groups of 8, generated in blocks of
  whole topics (topic_rows is a multiple of 8, so groups never straddle blocks)."""
  assert topic_rows % 8 == 0, "topic_rows must be a multiple of 8"
  out = np.empty((L, d), np.float32)
  block = topic_rows * 1024
  for s in range(0, L, block):
    n = min(block, L - s)
    local = np.arange(n)
    topics = rng.standard_normal((-(-n // topic_rows), d), np.float32)
    groups = rng.standard_normal((-(-n // 8), d), np.float32)
    out[s : s + n] = (
      FLAGS.topic_scale * topics[local // topic_rows]
      + 0.5 * groups[local // 8]
      + 0.3 * rng.standard_normal((n, d), np.float32)
    )
  return out


def make_queries(w: np.ndarray, n: int, topic_rows: int, rng: np.random.Generator):
  topics = rng.integers(0, max(1, len(w) // topic_rows), n)
  q = np.empty((n, w.shape[1]), np.float32)
  for i, t in enumerate(topics):
    lo, hi = t * topic_rows, min((t + 1) * topic_rows, len(w))
    q[i] = w[rng.integers(lo, hi, rng.integers(1, 4))].mean(0)
  return q + 0.3 * rng.standard_normal(q.shape, np.float32)


def label_sets(rng: np.random.Generator):
  """Yields (L, rows, queries, timed queries, positives or None): the saved ones
  (--vectors, --queries, --labels), else generated ones for each --num_labels."""
  if FLAGS.vectors:
    w = np.load(FLAGS.vectors, mmap_mode="r")
    all_queries = np.load(FLAGS.queries, mmap_mode="r")
    drawn = rng.choice(
      len(all_queries),
      min(FLAGS.num_queries + FLAGS.timed_queries, len(all_queries)),
      replace=False,
    )
    pick = np.sort(drawn[: FLAGS.num_queries])
    timed = np.sort(drawn[FLAGS.num_queries :])
    positives = None
    if FLAGS.labels:
      positives = sparse_rows.row_subset(xc_format.read_sparse(FLAGS.labels, len(w)), pick)
    w = np.ascontiguousarray(w, np.float32)
    q = np.asarray(all_queries[pick], np.float32)
    yield len(w), w, q, np.asarray(all_queries[timed], np.float32), positives
    return
  for L in (int(float(x)) for x in FLAGS.num_labels):
    w = label_vectors(L, FLAGS.d, FLAGS.topic_rows, rng)
    q = make_queries(w, FLAGS.num_queries, FLAGS.topic_rows, rng)
    yield L, w, q, make_queries(w, FLAGS.timed_queries, FLAGS.topic_rows, rng), None


class _SearchedWith:
  """A built index searched with a setting's leaves (mining.mine's search interface)."""

  def __init__(self, index, leaves_to_search: int, reorder: int):
    self.index, self.leaves, self.reorder = index, leaves_to_search, reorder

  def search(self, queries: np.ndarray, k: int) -> np.ndarray:
    return self.index.search(queries, k, self.leaves, self.reorder)


@dataclasses.dataclass(frozen=True)
class Build:
  """One index build of the sweep: its name, `scann_defaults`' partition keywords (all but
  rows_per_query) and its training sample (0: scann_defaults')."""

  partitioner: str
  partition: dict
  training_sample_size: int


def flag_config():
  """The --config experiment (FILE[:VARIANT]), or None."""
  if not FLAGS.config:
    return None
  path, _, variant = FLAGS.config.partition(":")
  return config_base.load_config(path, variant or None)


def builds(config) -> list[Build]:
  """The builds to measure: the config's knobs with --config, else the flags' product."""
  if config is not None:
    knobs = index_lib.IndexKnobs.from_config(config.negatives.index).scann_knobs()
    del knobs["rows_per_query"]
    return [Build(FLAGS.config, knobs, 0)]
  out = []
  for partitioner, exact_leaf_rows, group_rows, sample in itertools.product(
    FLAGS.partitioner,
    [int(n) for n in FLAGS.exact_leaf_rows],
    [int(n) for n in FLAGS.group_rows],
    [int(n) for n in FLAGS.training_sample_size],
  ):
    partition = {"avq": 1.0, "soar_lambda": 1.5} if partitioner == "avq_soar" else {}
    partition["leaf_rows"] = exact_leaf_rows
    partition["leaf_shrink"] = FLAGS.leaf_shrink
    partition["group_rows"] = group_rows
    out.append(Build(partitioner, partition, sample))
  return out


def main(argv):
  del argv
  rng = np.random.default_rng(FLAGS.seed)
  config = flag_config()
  k = config.negatives.k_h if config is not None else FLAGS.k
  threads = FLAGS.threads or cpu_budget.task_cpus()
  for L, w, q, timed_q, positives in label_sets(rng):
    t0 = time.time()
    exact_index = index_lib.ExactIndex(w)
    exact = exact_index.search(q, k)
    exact_ms = 1000 * (time.time() - t0) / len(q)
    if positives is not None:
      exact_negatives = mining.mine(exact_index, q, positives, k, L)
    budgets = sorted(int(r) for r in FLAGS.rows_per_query)
    for build in builds(config):
      partition, sample = dict(build.partition), build.training_sample_size
      # One build per partitioner (the largest budget's knobs); smaller budgets search
      # fewer of its leaves, as a build with their knobs would (leaves do not depend on it).
      group_rows = partition.pop("group_rows", 0)
      params = index_lib.scann_defaults(
        L, k, rows_per_query=budgets[-1], group_rows=group_rows, **partition
      )
      if sample:
        params = dataclasses.replace(params, training_sample_size=min(L, sample))
      t0 = time.time()
      if params.group_rows:
        index = grouped_index.GroupedScannIndex(w, k, params, threads)
      else:
        index = index_lib.ScannIndex(w, k, params, threads)
      centroids = index.num_leaves
      build_s = time.time() - t0
      peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
      built_reorder = params.reorder
      for rows, reorder in itertools.product(budgets, [int(r) for r in FLAGS.reorder]):
        search = index_lib.scann_defaults(
          L, k, rows_per_query=rows, **partition
        ).num_leaves_to_search
        params = dataclasses.replace(
          params, num_leaves_to_search=search, reorder=reorder or built_reorder
        )
        t0 = time.time()
        got = index.search(q, k, search, params.reorder)
        search_ms = 1000 * (time.time() - t0) / len(q)
        timing = {}
        if len(timed_q):
          by_threads = {}
          for timed_threads in (int(t) or threads for t in FLAGS.timed_threads):
            index.searcher.set_num_threads(timed_threads)
            t0 = time.time()
            index.search(timed_q, k, search, params.reorder)
            core_s = (time.time() - t0) * timed_threads
            by_threads[timed_threads] = round(core_s * 1e5 / len(timed_q), 2)
          index.searcher.set_num_threads(threads)
          first = next(iter(by_threads))
          timing = {
            "timed_queries": len(timed_q),
            "threads": first,
            "core_seconds_per_1e5_queries": by_threads[first],
            "core_seconds_by_threads": by_threads,
          }
        recall = mining.overlap_at_k(got, exact)
        negatives_recall = None
        if positives is not None:
          searched = _SearchedWith(index, search, params.reorder)
          mined = mining.mine(searched, q, positives, k, L)
          negatives_recall = round(mining.overlap_at_k(mined, exact_negatives), 4)
        jsonl.emit(
          {
            "num_labels": L,
            "d": w.shape[1],
            "source": FLAGS.vectors or "generated",
            "k": k,
            "num_queries": len(q),
            "topic_rows": FLAGS.topic_rows,
            "topic_scale": FLAGS.topic_scale,
            "partitioner": build.partitioner,
            "num_leaves": centroids,
            "leaf_shrink": partition.get("leaf_shrink", 0.0),
            "leaves_to_search": search,
            "rows_scored_per_query": index_lib.rows_scored_per_query(L, params),
            "centroids_scored_per_query": centroids,
            "group_rows": params.group_rows,
            "reorder": params.reorder,
            "training_sample_size": params.training_sample_size,
            "recall": round(recall, 4),
            "negatives_recall": negatives_recall,
            "build_s": round(build_s, 2),
            "peak_rss_bytes_after_build": peak_rss,
            "search_ms_per_query": round(search_ms, 4),
            "exact_ms_per_query": round(exact_ms, 3),
            **timing,
          },
          FLAGS.out,
        )
      del index


if __name__ == "__main__":
  app.run(main)
