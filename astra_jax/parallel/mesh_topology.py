"""The (data, model) device grid for the machines the devices are on.

One node (one slice: every device shares a `slice_index`, or none reports one) keeps
`jax.make_mesh`'s grid. Devices on several nodes get a hybrid grid
(`mesh_utils.create_hybrid_device_mesh`, as jax's multi-process docs advise, and as jax
0.10 requires: `jax.make_mesh` refuses multi-slice device lists): the 'data' axis runs
across nodes and the 'model' axis stays inside a node, so that W's per-step collectives
(the all-gather of embeddings and the psum of positive scores over 'model') use the node's
NVLink, and only the encoder's gradient all-reduce crosses the network.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
from absl import logging
from jax.experimental import mesh_utils

from astra_jax.runtime.errors import InputError


def node_index(device) -> int:
  """The node (slice) a device is on; 0 where the platform reports none (CPU)."""
  return getattr(device, "slice_index", 0) or 0


@dataclasses.dataclass(frozen=True)
class _Slot:
  """A device as create_hybrid_device_mesh sees it, with its node as `slice_index` (the
  real devices are mapped back by id, so the same code serves stand-in devices)."""

  id: int
  process_index: int
  slice_index: int
  device_kind: str
  platform: str


def nodes(devices) -> list[list]:
  """The devices grouped by node, nodes in index order, devices in the given order."""
  by_node = collections.defaultdict(list)
  for d in devices:
    by_node[node_index(d)].append(d)
  return [by_node[k] for k in sorted(by_node)]


def hybrid_grid(devices, data: int, model: int) -> np.ndarray | None:
  """The (data, model) grid of `devices` (data x model of them) when they span several
  nodes: rows of a node's devices, `model` per row, nodes one after the other along 'data'.
  None for one node (jax.make_mesh's grid applies).

  Raises InputError (one line) when the nodes differ in device count or `model` does not
  divide a node's devices: a W shard group would straddle two nodes."""
  groups = nodes(devices)
  if len(groups) == 1:
    return None
  sizes = sorted({len(g) for g in groups})
  if len(sizes) > 1:
    raise InputError(
      f"config.mesh: the devices' nodes hold {sizes} devices; a multi-node "
      "mesh needs the same number on every node (--gpus-per-node)"
    )
  per_node = sizes[0]
  if per_node % model:
    raise InputError(
      f"config.mesh.model={model} must divide a node's {per_node} devices "
      f"({len(groups)} nodes): W's shards stay inside a node's NVLink domain; "
      f"use a divisor of {per_node}"
    )
  if data * model != len(devices):
    raise InputError(
      f"config.mesh: {data} x {model} needs {data * model} devices, have {len(devices)}"
    )
  slots = [
    _Slot(d.id, d.process_index, i, d.device_kind, d.platform)
    for i, group in enumerate(groups)
    for d in group
  ]
  grid = mesh_utils.create_hybrid_device_mesh((per_node // model, model), (len(groups), 1), slots)
  by_id = {d.id: d for d in devices}
  logging.info(
    "mesh: %d data x %d model over %d nodes of %d devices ('model' inside a node)",
    data,
    model,
    len(groups),
    per_node,
  )
  return np.vectorize(lambda s: by_id[s.id], otypes=[object])(grid)
