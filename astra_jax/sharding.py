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

from astra_jax import mesh_topology, sparse_momentum
from astra_jax.errors import InputError

ALL = ("data", "model")
# Logical axis -> mesh axes. Batch arrays carry a leading micro-batch axis (never split).
RULES = {"query": ALL, "query_group": "data", "label_shard": "model", "replicated": None}
_LOGICAL = {  # per batch key: the logical name of each axis after the micro-batch axis
    "input_ids": ("query", None), "pos_ids": ("query_group", None),
    "pos_mask": ("query_group", None), "pos_weight": ("query_group",),
    "hard_ids": ("query_group", "label_shard"),
    "hard_mask": ("query_group", "label_shard"), "rand_ids": ("label_shard",),
    "rand_mask": ("query_group", "label_shard"), "rand_weight": ("label_shard",),
    "all_pos_ids": ("query_group", None)}
# Per-query random draws (negatives.random_draws=per_query) are laid out like hard negatives.
_PER_QUERY_LOGICAL = {"rand_ids": ("query_group", "label_shard")}


def kernel_spec(key: str, ndim: int) -> P:
  """The PartitionSpec of one label array of a micro-batch; `ndim` tells shared random draws
  (rand_ids of ndim 1) from per-query ones (ndim 2)."""
  axes = _LOGICAL[key]
  if len(axes) != ndim:
    axes = _PER_QUERY_LOGICAL.get(key, axes)
  if len(axes) != ndim:
    raise ValueError(f"batch[{key!r}] has {ndim} axes per micro-batch, expected {len(axes)}")
  return P(*(RULES.get(a) for a in axes))


def batch_spec(key: str, ndim: int) -> P:
  """The PartitionSpec of a batch array with its leading micro-batch axis."""
  return P(None, *kernel_spec(key, ndim - 1))


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
    raise InputError(f"config.mesh: {data} x {model} needs {data * model} devices, have {n} "
                     f"(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={data * model} "
                     f"fakes them)")
  grid = mesh_topology.hybrid_grid(devices, data, model) if data * model > 1 else None
  if grid is not None:
    return jax.sharding.Mesh(grid, ALL, axis_types=(AxisType.Auto,) * 2)
  return jax.make_mesh((data, model), ALL, axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


def padded_rows(num_labels: int, mesh: jax.sharding.Mesh) -> int:
  """Rows of W after padding to a multiple of the 'model' axis (padded rows are never
  sampled and never predicted)."""
  m = mesh.shape["model"]
  return -(-num_labels // m) * m


# The momentum state's layout: per-row arrays split like W, the catch-up table replicated.
MOMENTUM_SPEC = sparse_momentum.MomentumState(P("model"), P("model"), P(), P())


def momentum_shardings(mesh: jax.sharding.Mesh) -> sparse_momentum.MomentumState:
  """MOMENTUM_SPEC as shardings on `mesh`."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), MOMENTUM_SPEC)


def shard_params(params: dict, opt_state: dict, mesh: jax.sharding.Mesh):
  """Encoder and optimizer state replicated, V (and the classifier's momentum state's
  per-row arrays) split by rows over 'model'."""
  rep = NamedSharding(mesh, P())
  params = {"encoder": jax.device_put(params["encoder"], rep),
            "classifier": jax.device_put(params["classifier"], NamedSharding(mesh, P("model")))}
  rest = {k: v for k, v in opt_state.items() if k != "momentum"}
  out = jax.device_put(rest, rep)
  if "momentum" in opt_state:
    out["momentum"] = jax.device_put(opt_state["momentum"], momentum_shardings(mesh))
  return params, out


def shard_batch(batch: dict, mesh: jax.sharding.Mesh) -> dict:
  """Host arrays -> global arrays; each process only reads the slices its devices hold."""
  out = {}
  for k, v in batch.items():
    sharding = NamedSharding(mesh, batch_spec(k, v.ndim))
    out[k] = jax.make_array_from_callback(v.shape, sharding, lambda idx, v=v: v[idx])
  return out


def process_token_rows(mesh: jax.sharding.Mesh, micro_batches: int, micro_batch: int
                       ) -> np.ndarray:
  """(A, B/A) bool: the queries whose tokens this process's devices hold."""
  sharding = NamedSharding(mesh, batch_spec("input_ids", 3))
  mask = np.zeros((micro_batches, micro_batch), bool)
  for idx in sharding.addressable_devices_indices_map((micro_batches, micro_batch, 1)).values():
    mask[idx[:2]] = True
  return mask


def local_model_shards(mesh: jax.sharding.Mesh) -> list[int]:
  """The W shards ('model' indices) that live on this process's devices."""
  local = {d.id for d in jax.local_devices()}
  return [m for m in range(mesh.shape["model"])
          if any(d.id in local for d in mesh.devices[:, m])]
