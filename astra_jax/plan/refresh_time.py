"""How long a hard-negative refresh takes, by either backend, against the epoch it must fit in.

Algorithm 1 collects the query embeddings in epoch e-2 and mines during epoch e-1, so the
host backend (ScaNN in the refresh workers, `negatives.refresh_backend=host`) has one epoch:
training waits for whatever it takes beyond that. The device backend (`=device`: exact
top-k on the training devices at the swap) runs between epochs, so training waits for all
of it. Per refresh, on one node:

  host    core-seconds = processes per node x W shards per process x
            (queries mined x rows scored per query x d x HOST_SEARCH_CORE_S
             + rows per shard x d x HOST_BUILD_CORE_S),
          over the node's host cores (the workers' threads use them all);
  device  2 x (training rows / data groups) x rows per shard x d flops on each device, at
          the GPU's dense float32 matmul rate (TF32 where XLA uses it) x
          DEVICE_SEARCH_EFFICIENCY;
  epoch   training rows / (queries per second per GPU x GPUs).

What is measured and what is not: the host rates are the measurements of the grouped ScaNN
index at 10^7 rows on the development machine's cores (docs/planner.md, "Refresh time"),
assumed to scale with a node's cores; the matmul rates are spec
sheets; the device search's efficiency and the step speed off V100 are not measured on a
GPU, and the planner says so where it prints them.
"""

from __future__ import annotations

import dataclasses

from astra_jax.ann import index as ann_index
from astra_jax.plan.quantities import Quantities

# Host ScaNN, per row score and per row built at d = 64, from the grouped index at 10^7
# rows (the full_labels rule, one index whose leaves are trained in groups): 10^5 queries
# searched in 24.1 s on one thread at ~272,000 rows (leaves + their centres) scored per
# query, and a build of 320 s counted on both of the measuring machine's 2 cores. One
# thread, because a second one did not search faster there (docs/results/refresh_index.md).
HOST_SEARCH_CORE_S = 24.1 / 1e5 / 272_000 / 64
HOST_BUILD_CORE_S = 2 * 320.0 / 1e7 / 64
# The exact search's share of the matmul rate (a top-k merge follows every tile): assumed.
DEVICE_SEARCH_EFFICIENCY = 0.5
# The paper's SS-20M iteration on a V100 (tab:timebreakup): 128 queries in 49.1 ms through
# DistilBERT (66.4M parameters) at 32 tokens; other encoders scale by parameters x tokens.
REFERENCE_QUERIES_PER_S = 128 / 49.1e-3
REFERENCE_PARAM_TOKENS = 66.4e6 * 32


@dataclasses.dataclass(frozen=True)
class GpuRates:
  """A GPU kind's rates and its usual node.

  matmul_flops: dense float32 matmul, flop/s (TF32 tensor cores where the GPU has them).
  step_speedup: its encoder step's speed over a V100's (dense fp16/bf16 tensor peaks).
  host_cores_per_gpu: host cores per GPU of the usual node (DGX-1, DGX A100, DGX H100).
  host_to_device: bytes/s from pinned host memory over its PCIe link (3.0, 4.0, 5.0 x16),
    about three quarters of the link's peak: assumed.
  memory_bandwidth: bytes/s of its own memory (HBM2, HBM2e, HBM3, HBM3e), the spec sheet's.
  """

  matmul_flops: float
  step_speedup: float
  host_cores_per_gpu: int
  host_to_device: float = 12e9
  memory_bandwidth: float = 900e9


GPU_RATES = {
  "v100-32gb": GpuRates(15.7e12, 1.0, 5),
  "v100-16gb": GpuRates(15.7e12, 1.0, 5),
  "a100-40gb": GpuRates(156e12, 312 / 125, 16, 24e9, 1555e9),
  "a100-80gb": GpuRates(156e12, 312 / 125, 16, 24e9, 2039e9),
  "h100-80gb": GpuRates(495e12, 989 / 125, 14, 48e9, 3350e9),
  "h200-141gb": GpuRates(495e12, 989 / 125, 14, 48e9, 4800e9),
}


def estimated_queries_per_s(q: Quantities, rates: GpuRates) -> float:
  """Training queries per second per GPU: the paper's V100 step scaled by the GPU's speed
  and the encoder's parameters x tokens (module docstring)."""
  return REFERENCE_QUERIES_PER_S * rates.step_speedup * REFERENCE_PARAM_TOKENS / (q.P * q.T)


def host_rows_scored(q: Quantities, index_config) -> int:
  """Rows a query scores in one shard's index (its leaves' rows and their centres); every
  row for the exact index."""
  if q.index_kind == "exact":
    return q.R
  knobs = ann_index.IndexKnobs.from_config(index_config).scann_knobs()
  params = ann_index.scann_defaults(q.R, max(q.mined, 1), **knobs)
  return ann_index.rows_scored_per_query(q.R, params) + params.num_leaves


def refresh_times(
  q: Quantities,
  index_config,
  gpu: str,
  gpus_per_node: int,
  host_cores_per_node: int = 0,
  train_queries_per_s: float = 0.0,
) -> dict:
  """Seconds per refresh by each backend, an epoch's seconds, and the wait each causes.

  Args:
    q: the plan's quantities.
    index_config: `config.negatives.index`.
    gpu: a key of GPU_RATES (other kinds: an empty dict, nothing priced).
    gpus_per_node: GPUs per node.
    host_cores_per_node: 0: the usual node's (GpuRates.host_cores_per_gpu per GPU).
    train_queries_per_s: queries per second per GPU in training; 0: the estimate of the
      module docstring.
  Returns:
    {} where the GPU kind has no rates or the strategy never refreshes; else host_s,
    device_s, epoch_s, host_wait_s and device_wait_s (per refresh), the inputs they were
    computed from and which of them are estimates.
  """
  rates = GPU_RATES.get(gpu)
  if rates is None or not q.mined:
    return {}
  cores = host_cores_per_node or rates.host_cores_per_gpu * gpus_per_node
  scored = host_rows_scored(q, index_config)
  per_shard = q.own_rows * scored * q.d * HOST_SEARCH_CORE_S + q.R * q.d * HOST_BUILD_CORE_S
  host_s = q.Pn * q.S * per_shard / cores
  device_flops = 2 * (-(-q.rows // q.D)) * q.R * q.d
  device_s = device_flops / (rates.matmul_flops * DEVICE_SEARCH_EFFICIENCY)
  estimated = not train_queries_per_s
  qps = train_queries_per_s or estimated_queries_per_s(q, rates)
  epoch_s = q.rows / (qps * q.G)
  return {
    "host_s": host_s,
    "device_s": device_s,
    "epoch_s": epoch_s,
    "host_wait_s": max(0.0, host_s - epoch_s),
    "device_wait_s": device_s,
    "host_cores_per_node": cores,
    "rows_scored_per_query": scored,
    "device_flops": device_flops,
    "matmul_flops": rates.matmul_flops,
    "train_queries_per_s_per_gpu": qps,
    "step_speed_estimated": estimated,
  }
