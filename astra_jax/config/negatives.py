"""The negatives' fields (`config.negatives`): the strategy, k_p, k_h and k_r, the refresh
schedule (tau_s, tau_r) and the refresh index (`negatives.index`, ann/index.py's IndexKnobs)."""

from __future__ import annotations

import dataclasses

import ml_collections

from astra_jax.ann.index import IndexKnobs
from astra_jax.config.require import require
from astra_jax.negatives import strategies
from astra_jax.negatives.strategies import HardShare


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the sections `negatives` with their defaults."""
  c.negatives = ml_collections.ConfigDict()
  c.negatives.strategy = "random+w_hard"  # ASTRA; see astra_jax/negatives/strategies.py
  c.negatives.k_p = 7  # positives per query (padded with a mask)
  c.negatives.k_h = 50  # hard negatives per query
  c.negatives.k_r = 400  # random negatives per query (per W shard)
  # per_query: each query draws its own k_r (the paper's Algorithm 1); shared: one draw
  # serves the batch (cheaper, far noisier W updates; docs/training.md, "Design choices").
  c.negatives.random_draws = "per_query"
  c.negatives.tau_s = 5  # first epoch with hard negatives
  c.negatives.tau_r = 5  # epochs between index refreshes
  # The refresh's index over each W shard: the fields and defaults of ann/index.py's
  # IndexKnobs, each documented there (kind, num_leaves, ..., soar_lambda; 0: scaled to L,
  # or off). docs/scale.md says when to set which.
  c.negatives.index = ml_collections.ConfigDict(dataclasses.asdict(IndexKnobs()))
  c.negatives.recall_sample = 1000  # queries checked against exact search at each refresh
  # Where a refresh searches: "host", the index above in a worker process beside training
  # (the paper's design); "device", exact top-k on the training devices between epochs
  # (training waits for it; no ScaNN needed; docs/negatives.md says when it pays).
  c.negatives.refresh_backend = "host"
  # Threads of a refresh worker (ScaNN, numpy's BLAS): 0 = this task's CPUs
  # (SLURM_CPUS_PER_TASK, or the affinity mask) less train.input_threads, at least 1.
  c.negatives.refresh_threads = 0
  # A failed refresh: "continue" trains on with the previous (or random) negatives, counted
  # in results.json's "degraded"; "fail" stops the run in one line (docs/checkpoints.md).
  c.negatives.on_refresh_failure = "continue"
  c.negatives.curriculum_final_hard_fraction = 0.5
  c.negatives.inject_fault = ""  # tests only: "raise" or "kill" fails the first refresh


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field of `negatives`."""
  for key in sorted(c.negatives.keys()):
    require(
      not key.startswith("scann_"),
      f"negatives.{key}",
      "the refresh index's settings are negatives.index.* now (scann_leaves: "
      "negatives.index.num_leaves, scann_X: negatives.index.X; CHANGELOG.md)",
    )
  strategy = strategies.get(c.negatives.strategy)  # an unknown one: names the field
  require(
    c.negatives.refresh_backend in ("host", "device"),
    "negatives.refresh_backend",
    f"use host or device, got {c.negatives.refresh_backend!r}",
  )
  require(c.negatives.k_p >= 1, "negatives.k_p", f"must be >= 1, got {c.negatives.k_p}")
  require(c.negatives.k_h >= 0, "negatives.k_h", "must be >= 0")
  if strategy.allows_hard_only:
    # k_r = 0: hard negatives only, the paper's Figure 1 oracle and stale strategy (the
    # estimator then has no random term: the biased hard-only objective).
    require(c.negatives.k_r >= 0, "negatives.k_r", f"must be >= 0, got {c.negatives.k_r}")
    require(
      c.negatives.k_h + c.negatives.k_r >= 1,
      "negatives.k_h",
      f"k_h + k_r must be >= 1 (negatives per query), got {c.negatives.k_h} + {c.negatives.k_r}",
    )
  else:
    require(
      c.negatives.k_r >= 1,
      "negatives.k_r",
      f"must be >= 1, got {c.negatives.k_r} (0 only with strategy "
      f"{', '.join(strategies.names(lambda s: s.allows_hard_only))}: hard negatives alone)",
    )
  if strategy.hard_share is HardShare.CURRICULUM:
    # The hard share rises from k_h / (k_h + k_r) at tau_s: the batches keep k_r random
    # columns, and the total per query stays k_h + k_r.
    first = c.negatives.k_h / (c.negatives.k_h + c.negatives.k_r)
    require(
      first <= c.negatives.curriculum_final_hard_fraction <= 1,
      "negatives.curriculum_final_hard_fraction",
      f"must be in [k_h / (k_h + k_r) = {first:.3g}, 1] (the curriculum's hard share "
      f"rises from there), got {c.negatives.curriculum_final_hard_fraction}",
    )
  require(
    c.negatives.random_draws in ("per_query", "shared"),
    "negatives.random_draws",
    f"use per_query or shared, got {c.negatives.random_draws!r}",
  )
  require(
    c.negatives.index.kind in ("auto", "exact", "scann"),
    "negatives.index.kind",
    f"unknown index {c.negatives.index.kind!r}; use auto, exact or scann",
  )
  require(
    c.negatives.index.rows_per_query >= 0,
    "negatives.index.rows_per_query",
    f"must be >= 0 (0: a third of the leaves), got {c.negatives.index.rows_per_query}",
  )
  require(
    c.negatives.index.leaf_shrink >= 0,
    "negatives.index.leaf_shrink",
    f"must be >= 0 (0: leaves of one size), got {c.negatives.index.leaf_shrink}",
  )
  require(
    c.negatives.index.group_rows >= 0,
    "negatives.index.group_rows",
    f"must be >= 0 (0: one index per W shard), got {c.negatives.index.group_rows}",
  )
  require(
    c.negatives.refresh_threads >= 0,
    "negatives.refresh_threads",
    "must be >= 0 (0: the task's CPUs less the input threads)",
  )
  require(
    c.negatives.inject_fault in ("", "raise", "kill"),
    "negatives.inject_fault",
    "use '', 'raise' or 'kill'",
  )
  require(
    c.negatives.on_refresh_failure in ("continue", "fail"),
    "negatives.on_refresh_failure",
    f"must be continue or fail, got {c.negatives.on_refresh_failure!r}",
  )
