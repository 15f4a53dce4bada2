"""How long the neighbour vote takes after training at the plan's sizes.

  encode  the memory's rows (training + validation) through the encoder once, split over
          every GPU of the run (parallel/mesh_embedding.py), at FORWARD_SPEEDUP times the
          training step's queries per second (refresh_time.estimated_queries_per_s, or
          the rate the user gives);
  exact   the test and validation rows against all memory rows, the memory split over
          every GPU of the run (ann/mesh_memory.py): 2 x queries x N x d flops over G GPUs
          at the GPU's matmul rate x DEVICE_SEARCH_EFFICIENCY (refresh_time.py); a memory
          with no room on the GPUs is split over the processes' hosts
          (ann/process_memory.py), and each process searches its share of the rows for all
          the queries on one of its GPUs, the share crossing the host link once for every
          memory_search.PROCESS_QUERY_ROWS queries (GpuRates.host_to_device);
  scann   the same queries on the process's share of the node's host cores, each scoring
          `rows_per_query` rows and leaf centres at the refresh index's measured rate per
          row score, plus two index builds (the choice's memory and the final one) at its
          measured rate per row built (refresh_time.HOST_*_CORE_S).

Every rate but the host ScaNN ones is an assumption until a GPU measures it; the planner
prints them as estimates.
"""

from __future__ import annotations

from astra_jax.ann import memory_search
from astra_jax.plan import refresh_time
from astra_jax.plan.quantities import Quantities
from astra_jax.plan.records import NodeLayout, VoteSearchCost, VoteTime

# An inference pass against a training step (forward + backward ~ 3 forwards): assumed.
FORWARD_SPEEDUP = 3.0


def vote_time(
  search: VoteSearchCost | None,
  q: Quantities,
  gpu: str,
  layout: NodeLayout,
  host_cores_per_node: int = 0,
  train_queries_per_s: float = 0.0,
) -> VoteTime | None:
  """The vote's seconds (module docstring).

  Args:
    search: the vote's search (score_extras.py); None without the vote.
    q: the plan's quantities.
    gpu: a key of refresh_time.GPU_RATES (other kinds: None, nothing priced).
    layout: nodes and processes.
    host_cores_per_node: 0: the usual node's.
    train_queries_per_s: training queries per second per GPU; 0: the estimate.
  Returns:
    The VoteTime, or None.
  """
  rates = refresh_time.GPU_RATES.get(gpu)
  if search is None or rates is None:
    return None
  processes = layout.nodes * layout.processes_per_node
  queries = -(-search.test_rows // processes) + -(-search.validation_rows // processes)
  qps = train_queries_per_s or refresh_time.estimated_queries_per_s(q, rates)
  encode_s = search.memory_rows / (FORWARD_SPEEDUP * qps * q.G)
  if not search.scann:
    rate = rates.matmul_flops * refresh_time.DEVICE_SEARCH_EFFICIENCY
    if not search.on_devices:
      share = -(-search.memory_rows // processes)
      queries = search.test_rows + search.validation_rows
      flops = 2.0 * queries * share * q.d
      passes = -(-queries // memory_search.PROCESS_QUERY_ROWS)
      transfer_s = passes * share * 4 * q.d / rates.host_to_device
      return VoteTime(encode_s, flops / rate + transfer_s, 0.0, "one GPU of each process")
    flops = 2.0 * (search.test_rows + search.validation_rows) * search.memory_rows * q.d
    return VoteTime(encode_s, flops / (q.G * rate), 0.0, f"all {q.G} GPUs")
  node_cores = host_cores_per_node or rates.host_cores_per_gpu * layout.gpus_per_node
  cores = max(1, node_cores // layout.processes_per_node)
  search_core_s = queries * search.rows_per_query * q.d * refresh_time.HOST_SEARCH_CORE_S
  build_core_s = 2 * search.memory_rows * q.d * refresh_time.HOST_BUILD_CORE_S
  return VoteTime(encode_s, search_core_s / cores, build_core_s / cores, f"{cores} host cores")
