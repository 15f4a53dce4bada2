"""The warm start's size and hours (training/warmstart.py).

Its pairs are every (training row, positive) pair of the kept training rows. During the
stage a process holds the rows' pair offsets and one epoch's pair order (all pairs, or
`warmstart.pairs_per_epoch` of them); the pairs themselves are read from the label rows a
batch at a time. A pair is two encoder passes (the query and the label text), so a GPU
takes pairs at half its training queries' rate; the stage splits each step's pairs over
every GPU when they divide `warmstart.batch_size`, else runs on one.
"""

from __future__ import annotations

from astra_jax.plan import refresh_time
from astra_jax.plan.quantities import Quantities, split_rows
from astra_jax.plan.records import Item, WarmStartCost


def warm_start_cost(
  config, q: Quantities, gpu: str, train_queries_per_s: float = 0.0
) -> WarmStartCost | None:
  """The warm start's cost (module docstring), or None without one or without known
  labels per row.

  Args:
    config: the experiment config (`warmstart`, `data.validation_*`).
    q: the plan's quantities.
    gpu: a key of refresh_time.GPU_RATES (other kinds: no seconds).
    train_queries_per_s: training queries a second on one GPU; 0: the plan's estimate.
  Returns:
    The WarmStartCost.
  """
  ws = config.warmstart
  if not ws.epochs or not q.lpp:
    return None
  kept, _ = split_rows(q, config.data)
  pairs = int(kept * q.lpp)
  per_epoch = min(ws.get("pairs_per_epoch", 0) or pairs, pairs)
  items = [
    Item(f"warm start: the rows' pair offsets ({kept + 1:,} int64)", (kept + 1) * 8, "(N + 1) x 8"),
    Item(f"warm start: an epoch's pair order ({per_epoch:,} int64)", per_epoch * 8, "pairs x 8"),
  ]
  gpus = q.G if ws.batch_size % q.G == 0 else 1  # training/warmstart.py's placement
  rates = refresh_time.GPU_RATES.get(gpu)
  if rates is None:
    return WarmStartCost(pairs, per_epoch, ws.epochs, items, gpus, 0.0, 0.0, False)
  qps = train_queries_per_s or refresh_time.estimated_queries_per_s(q, rates)
  rate = qps / 2 * gpus
  return WarmStartCost(
    pairs, per_epoch, ws.epochs, items, gpus, rate, per_epoch / rate, not train_queries_per_s
  )
