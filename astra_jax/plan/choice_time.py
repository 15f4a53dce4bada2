"""How long the score choice takes after training at the plan's sizes
(training/score_choice.py): its passes over the validation split, as config/choice_reads.py
lists them, each over all L labels.

A pass, over every GPU of the run (each process ranks its share of the validation rows):
  encode   the V validation rows through the encoder again, at vote_time.FORWARD_SPEEDUP
           times the training step's queries per second;
  product  W's scores and, where a row weighs the label texts, E(z_l)'s: 2 x V x L x d flops
           each, at the GPU's matmul rate x refresh_time.DEVICE_SEARCH_EFFICIENCY;
  mix      each weight row's V x L scores mixed and merged into its own top-k, about
           SCORE_ROW_BYTES of memory traffic a score and row, at the GPU's memory
           bandwidth. At small d this, not the product, bounds a pass.
A lexical pass adds the TF-IDF products on every process's host, which each process takes
for all V rows: V x L (query, label text) and V x N (query, training row) pairs at
LEXICAL_PAIR_CORE_S core-seconds a pair, over the process's share of the node's cores.
The vote's search for the validation rows is priced with the vote (vote_time.py).

Every device rate is a spec sheet's or an assumption until a GPU measures it; the host
rate was measured on the development machine (docs/results/lexical.md, "Time").
"""

from __future__ import annotations

from astra_jax.config import choice_reads
from astra_jax.plan import refresh_time
from astra_jax.plan.quantities import Quantities, split_rows
from astra_jax.plan.records import ChoiceTime, NodeLayout, PassTime
from astra_jax.plan.vote_time import FORWARD_SPEEDUP

# Memory traffic a score and weight row takes to mix and merge into a top-k (two float32
# products read, the mix written and read back, the merge's share): assumed.
SCORE_ROW_BYTES = 20
# The lexical terms' TF-IDF products, a (query, text) pair: 36.4M pairs in 1.6 s on 2 cores
# on debian-recommends' validation split (docs/results/lexical.md, "Time").
LEXICAL_PAIR_CORE_S = 2 * 1.6 / 36.4e6
# A validation split whose choice reads within this is not worth a note.
NOTE_AFTER_S = 3600.0
# The cap the note prices: a P@1 read on 10^5 rows has a standard error of about 0.16
# points (data/validation.py).
CAP_ROWS = 100_000


def choice_time(
  config,
  q: Quantities,
  gpu: str,
  layout: NodeLayout,
  host_cores_per_node: int = 0,
  train_queries_per_s: float = 0.0,
  validation_rows: int | None = None,
) -> ChoiceTime | None:
  """The choice's seconds (module docstring).

  Args:
    config: the experiment config (`scoring`'s choice lists, `data.validation_*`).
    q: the plan's quantities.
    gpu: a key of refresh_time.GPU_RATES (other kinds: None, nothing priced).
    layout: nodes and processes.
    host_cores_per_node: 0: the usual node's.
    train_queries_per_s: training queries per second per GPU; 0: the estimate.
    validation_rows: in place of the rows the config's split holds out.
  Returns:
    The ChoiceTime, or None without a choice, a validation split or the GPU's rates.
  """
  rates = refresh_time.GPU_RATES.get(gpu)
  passes = choice_reads.choice_passes(config.get("scoring", {}))
  rows = split_rows(q, config.data)[1] if validation_rows is None else validation_rows
  if rates is None or not passes or not rows:
    return None
  qps = train_queries_per_s or refresh_time.estimated_queries_per_s(q, rates)
  matmul = q.G * rates.matmul_flops * refresh_time.DEVICE_SEARCH_EFFICIENCY
  node_cores = host_cores_per_node or rates.host_cores_per_gpu * layout.gpus_per_node
  process_cores = max(1, node_cores // layout.processes_per_node)
  scores = float(rows) * q.L
  timed = []
  for p in passes:
    products = 2 if p.label_texts else 1
    timed.append(
      PassTime(
        p.name,
        p.weight_rows,
        encode_s=rows / (FORWARD_SPEEDUP * qps * q.G),
        product_s=2.0 * products * scores * q.d / matmul,
        mix_s=p.weight_rows * scores * SCORE_ROW_BYTES / (q.G * rates.memory_bandwidth),
        host_s=(
          rows * (q.L + q.num_train - rows) * LEXICAL_PAIR_CORE_S / process_cores
          if p.lexical
          else 0.0
        ),
      )
    )
  return ChoiceTime(rows, tuple(timed), f"all {q.G} GPUs, {process_cores} host cores a process")


def choice_note(t: ChoiceTime, capped: ChoiceTime) -> str:
  """A line for a choice `t` that takes over NOTE_AFTER_S: how long, and what the same
  choice on CAP_ROWS rows (`capped`) would take; "" otherwise."""
  if t.total_s <= NOTE_AFTER_S:
    return ""
  line = (
    f"the score choice reads {t.validation_rows:,} validation rows in {len(t.passes)} "
    f"passes over all labels: ~{t.total_s / 3600:,.1f} h"
  )
  if t.validation_rows <= capped.validation_rows:
    return line
  return line + (
    f"; data.validation_max_rows={capped.validation_rows} reads {capped.validation_rows:,} "
    f'rows in ~{capped.total_s / 3600:,.2f} h (docs/planner.md, "The score choice")'
  )
