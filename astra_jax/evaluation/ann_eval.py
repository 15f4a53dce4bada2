"""The trained model evaluated through its serving index (`eval.search=scann`).

At 10^7-10^8 labels the exact final evaluation (every test row against every row of W) is
the costliest part of a run: ~4e16 FLOP for SS-20M's 16.6M test rows. The model a user
deploys answers through the ScaNN index over W (serve_index.py: AVQ + SOAR, the candidates
re-scored exactly), so evaluating through it measures what is served, at the index's cost.
The exact evaluation then runs on a sample, the first `eval.final_max_rows` test rows, and
results.json's "ann_eval" reports both on that sample: the exact-vs-ANN gap.

The index is built once over the exported W (`WORKDIR/model/classifier.npy`, memory-mapped)
by process 0 and cached in the model directory; every process then opens the cached index
and ranks its own contiguous share of the test rows; the metric sums are added across
processes. (Each process maps W and loads the index: one copy of W per process in host
memory, the serving path's cost.)
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from absl import logging

from astra_jax.data import dataset
from astra_jax.evaluation import metrics, ranking
from astra_jax.runtime import distributed
from astra_jax.serving.predictor import Predictor


@dataclasses.dataclass(frozen=True)
class AnnEvaluation:
  """What `evaluate` measured.

  Attributes:
    index: the Predictor's index ("scann", or "exact" where it falls back: few labels, or
      a label-text fused score that needs every label).
    rows: test rows ranked through the index (all of them).
    metrics: their metrics x100.
    sample_rows: the first rows also ranked exactly (the gap's sample).
    sample_metrics: the index's metrics x100 on those rows.
    seconds: wall time of the whole evaluation, index build included.
  """

  index: str
  rows: int
  metrics: dict[str, float]
  sample_rows: int
  sample_metrics: dict[str, float]
  seconds: float

  def report(self, sample_exact: dict[str, float]) -> dict:
    """results.json's "ann_eval": both rankings on the sample and their difference."""
    return {
      "index": self.index,
      "rows": self.rows,
      "metrics": self.metrics,
      "sample_rows": self.sample_rows,
      "sample_ann": self.sample_metrics,
      "sample_exact": sample_exact,
      "sample_gap": {
        k: round(sample_exact[k] - v, 4)
        for k, v in self.sample_metrics.items()
        if k in sample_exact
      },
      "seconds": round(self.seconds, 2),
    }


def evaluate(
  workdir: str, data: dataset.XCData, config, inv_prop: np.ndarray | None, sample_rows: int
) -> AnnEvaluation:
  """Ranks every test row of `data` through the exported model's serving index.

  Args:
    workdir: the run's workdir (its exported `model/`).
    data: the dataset (test tokens, labels, filter).
    config: the run's config (eval.ks, eval.batch_size, negatives.index.* are not used: the
      serving knobs are serve_index.serving_params').
    inv_prop: inverse propensities (None: no PS metrics).
    sample_rows: the first rows whose metrics are also reported on their own.
  Returns:
    The AnnEvaluation (every process gets the same).
  """
  t0 = time.time()
  if distributed.is_leader():  # builds the index once and caches it in the model directory
    Predictor.from_workdir(workdir, index="scann")
  distributed.barrier("ann evaluation: serving index built")
  predictor = Predictor.from_workdir(workdir, index="scann")
  ks = tuple(config.eval.ks)
  n = data.test_labels.num_rows
  share = np.linspace(0, n, jax.process_count() + 1).astype(int)
  lo, hi = share[jax.process_index()], share[jax.process_index() + 1]
  k = max(ks) + metrics.max_filtered_per_row(data.test_filter)
  total = sample = ranking.zero_sums(data.test_labels, inv_prop, ks)
  step = config.eval.batch_size
  for a in range(lo, hi, step):
    b = min(a + step, hi)
    emb = predictor.encode(np.asarray(data.test_tokens[a:b], np.int32))
    ids = predictor.index.search(emb, k)[1]
    # Rows [a, cut) are in the exact-vs-ANN sample too: scored once, added to both.
    cut = min(max(a, sample_rows), b)
    for first, last in ((a, cut), (cut, b)):
      if last > first:
        got = ranking.ranked_rows_sums(
          ids[first - a : last - a], first, data.test_labels, data.test_filter, inv_prop, ks
        )
        total = metrics.add_sums(total, got)
        if last <= sample_rows:
          sample = metrics.add_sums(sample, got)
    if distributed.is_leader() and (a - lo) // step % 50 == 0:
      logging.info("ANN evaluation: %d of %d test rows", b - lo, hi - lo)
  total, sample = distributed.sum_over_processes(total), distributed.sum_over_processes(sample)
  m = min(sample_rows, n)
  return AnnEvaluation(
    predictor.index_kind,
    n,
    metrics.as_percent(metrics.from_sums(total, n, ks)),
    m,
    metrics.as_percent(metrics.from_sums(sample, m, ks)) if m else {},
    time.time() - t0,
  )
