"""`python -m astra_jax.plan`: the memory, time and disk a config needs, per device
and per node, before a run starts: the plan composed (estimates.py) from the sizes its parts
share (quantities.py), one device's memory (device_memory.py), the hosts' (host_memory.py),
preparation and disk (disk.py), its inputs and records (inputs.py, records.py); its text
(report.py) and the command line (__main__.py). Importing it imports neither jax nor the
model code, and defines no flags.

Layer 12 of 13: may import the layers 1-11.
"""

from astra_jax.plan.disk import PARSE_PEAK_BYTES
from astra_jax.plan.estimates import (
  make_plan,
  plan_config,
  resolve_layout,
  resolve_mesh,
  suggest,
)
from astra_jax.plan.inputs import activation_bytes, data_size, encoder_param_count, encoder_shape
from astra_jax.plan.records import GPUS, DataSize, Item, NodeLayout, Plan, resident
from astra_jax.plan.report import format_plan

__all__ = [
  "GPUS",
  "PARSE_PEAK_BYTES",
  "DataSize",
  "Item",
  "NodeLayout",
  "Plan",
  "activation_bytes",
  "data_size",
  "encoder_param_count",
  "encoder_shape",
  "format_plan",
  "make_plan",
  "plan_config",
  "resident",
  "resolve_layout",
  "resolve_mesh",
  "suggest",
]
