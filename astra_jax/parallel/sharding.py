"""Device mesh, the sharding rules, and placement on the mesh.

Mesh axes: 'data' and 'model'. The rules (`RULES`): the encoder's parameters are replicated
and its batch is split over *all* devices (data x model), so the encoder is purely data
parallel; W's rows are split over 'model' (shard s holds rows [s R, (s+1) R) of the padded
matrix); the queries of one 'data' group are scored against every W shard of that group
(the classifier kernel that does so: classifier.py).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from astra_jax.data.batch import INPUT_AXES, LabelBatch, TrainBatch, label_axes
from astra_jax.parallel import mesh_topology
from astra_jax.runtime.errors import InputError

ALL = ("data", "model")
# Logical axis -> mesh axes. The logical axes of each batch array are declared in batch.py.
RULES = {"query": ALL, "query_group": "data", "label_shard": "model", "replicated": None}


def _spec(axes: tuple, micro_axis: bool) -> P:
  return P(*((None,) if micro_axis else ()), *(RULES.get(a) for a in axes))


def label_specs(labels: LabelBatch, micro_axis: bool = False) -> LabelBatch:
  """Each label array's PartitionSpec (None where the field is absent); `micro_axis`: the
  arrays carry the leading micro-batch axis (never split)."""
  return LabelBatch(*(None if a is None else _spec(a, micro_axis) for a in label_axes(labels)))


def batch_specs(batch: TrainBatch) -> TrainBatch:
  """A step's batch (with its micro-batch axis) as PartitionSpecs."""
  return TrainBatch(_spec(INPUT_AXES, True), label_specs(batch.labels, micro_axis=True))


def make_mesh(data: int, model: int, devices=None) -> jax.sharding.Mesh:
  """A (data, model) mesh over every device of every process (1 x 1: the first device);
  data=-1 takes the devices model leaves over. Devices on several nodes: the hybrid grid
  of mesh_topology.py ('model' inside a node)."""
  devices = jax.devices() if devices is None else devices
  n = len(devices)
  if data == -1:
    if n % model:
      raise InputError(f"config.mesh.model={model} does not divide the {n} devices")
    data = n // model
  if data * model == 1:
    devices = devices[:1]
  elif data * model != n:
    raise InputError(
      f"config.mesh: {data} x {model} needs {data * model} devices, have {n} "
      f"(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={data * model} "
      f"fakes them)"
    )
  grid = mesh_topology.hybrid_grid(devices, data, model) if data * model > 1 else None
  if grid is not None:
    return jax.sharding.Mesh(grid, ALL, axis_types=(AxisType.Auto,) * 2)
  return jax.make_mesh((data, model), ALL, axis_types=(AxisType.Auto,) * 2, devices=devices)


def padded_rows(num_labels: int, mesh: jax.sharding.Mesh) -> int:
  """Rows of W after padding to a multiple of the 'model' axis (padded rows are never
  sampled and never predicted)."""
  m = mesh.shape["model"]
  return -(-num_labels // m) * m


def from_host(x: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A host array that every process holds whole, as a global array split by `sharding`;
  each process reads only the slices its devices hold.

  Args:
    x: the host array (the same on every process).
    sharding: its layout over the devices.
  Returns:
    The global array.
  """
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def shard_batch(batch: TrainBatch, mesh: jax.sharding.Mesh) -> TrainBatch:
  """Host arrays -> global arrays; each process only reads the slices its devices hold."""
  return jax.tree.map(
    lambda x, spec: from_host(x, NamedSharding(mesh, spec)), batch, batch_specs(batch)
  )


def process_token_rows(mesh: jax.sharding.Mesh, micro_batches: int, micro_batch: int) -> np.ndarray:
  """(A, B/A) bool: the queries whose tokens this process's devices hold."""
  sharding = NamedSharding(mesh, _spec(INPUT_AXES, True))
  mask = np.zeros((micro_batches, micro_batch), bool)
  for idx in sharding.addressable_devices_indices_map((micro_batches, micro_batch, 1)).values():
    mask[idx[:2]] = True
  return mask


def _local_indices(mesh: jax.sharding.Mesh, axis: str) -> list[int]:
  """The indices along mesh axis `axis` that hold at least one of this process's devices."""
  local = {d.id for d in jax.local_devices()}
  devices = np.moveaxis(mesh.devices, mesh.axis_names.index(axis), 0)
  return [i for i in range(mesh.shape[axis]) if any(d.id in local for d in devices[i].flat)]


def local_data_groups(mesh: jax.sharding.Mesh) -> list[int]:
  """The data groups ('data' indices) of this process's devices: the groups whose queries'
  labels (and so hard negatives) it feeds to its devices."""
  return _local_indices(mesh, "data")


def local_model_shards(mesh: jax.sharding.Mesh) -> list[int]:
  """The W shards ('model' indices) that live on this process's devices."""
  return _local_indices(mesh, "model")
