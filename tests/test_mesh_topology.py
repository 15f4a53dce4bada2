"""Meshes over several nodes: the hybrid grid keeps 'model' inside a node, is validated,
and trains (on CPU, with the 8 fake devices split into two stand-in nodes)."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from astra_jax.parallel import mesh_topology, sharding
from astra_jax.runtime.errors import InputError
from astra_jax.training import checkpoint, train


@dataclasses.dataclass(frozen=True)
class FakeGpu:
  """What a GPU device of a two-node run reports (one process per GPU)."""

  id: int
  process_index: int
  slice_index: int
  device_kind: str = "NVIDIA H100 80GB HBM3"
  platform: str = "gpu"


def two_nodes(per_node=8):
  return [FakeGpu(i, i, i // per_node) for i in range(2 * per_node)]


def test_jax_make_mesh_refuses_two_nodes_and_the_hybrid_grid_keeps_model_in_a_node():
  devices = two_nodes()
  # What made two nodes crash at mesh creation with jax 0.10.
  with pytest.raises(ValueError, match="does not support multi-slice"):
    jax.make_mesh((4, 4), ("data", "model"), devices=devices)
  grid = mesh_topology.hybrid_grid(devices, 4, 4)
  assert grid.shape == (4, 4)
  # Node 0's devices fill the first two data rows, node 1's the last two; every row (one
  # W shard group) is on one node, in device-id order (what jax does within a GPU node).
  assert [[d.id for d in row] for row in grid] == [
    [0, 1, 2, 3],
    [4, 5, 6, 7],
    [8, 9, 10, 11],
    [12, 13, 14, 15],
  ]
  for row in grid:
    assert len({d.slice_index for d in row}) == 1
  # model = a whole node: one data row per node.
  grid = mesh_topology.hybrid_grid(devices, 2, 8)
  assert [{d.slice_index for d in row} for row in grid] == [{0}, {1}]


def test_hybrid_grid_errors_and_the_single_node_case():
  with pytest.raises(
    InputError,
    match=r"config.mesh.model=3 must divide a node's 8 devices "
    r"\(2 nodes\)",
  ):
    mesh_topology.hybrid_grid(two_nodes(), 16 // 3, 3)
  uneven = two_nodes()[:-1]
  with pytest.raises(InputError, match=r"nodes hold \[7, 8\] devices"):
    mesh_topology.hybrid_grid(uneven, 15, 1)
  one_node = [FakeGpu(i, i, 0) for i in range(8)]
  assert mesh_topology.hybrid_grid(one_node, 2, 4) is None  # jax.make_mesh's grid
  assert mesh_topology.hybrid_grid(jax.devices(), 4, 2) is None  # CPU: no slice_index


def _first_losses(tmp_path, small_synthetic, name):
  """Two steps of the trainer on a (4, 2) mesh; the losses it logged and the mesh."""
  c = small_synthetic()
  c.train.batch_size, c.train.profile_steps, c.train.log_every_steps = 64, 0, 1
  c.negatives.strategy, c.negatives.k_r = "random", 32
  c.mesh.data, c.mesh.model = -1, 2
  c.train.stop_after_steps, c.checkpoint.enabled = 2, False
  meshes = []
  original = sharding.make_mesh

  def spy(*args, **kwargs):
    meshes.append(original(*args, **kwargs))
    return meshes[-1]

  sharding.make_mesh = spy
  try:
    with pytest.raises(checkpoint.Preempted, match="stop_after_steps at epoch 0 step 2"):
      train.train_and_evaluate(c, str(tmp_path / name))
  finally:
    sharding.make_mesh = original
  lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
  return [json.loads(x)["loss"] for x in lines], meshes[0]


@pytest.mark.e2e
def test_a_training_step_on_a_two_node_mesh(tmp_path, monkeypatch, small_synthetic):
  reference, mesh = _first_losses(tmp_path, small_synthetic, "one_node")
  assert [[d.id for d in row] for row in mesh.devices] == [[0, 1], [2, 3], [4, 5], [6, 7]]
  # Two stand-in nodes interleaved over the 8 CPU devices: even ids and odd ids.
  monkeypatch.setattr(mesh_topology, "node_index", lambda d: d.id % 2)
  losses, mesh = _first_losses(tmp_path, small_synthetic, "two_nodes")
  assert mesh.shape == {"data": 4, "model": 2}
  assert [[d.id for d in row] for row in mesh.devices] == [[0, 2], [4, 6], [1, 3], [5, 7]]
  # The same computation laid out on other devices: the same losses.
  assert len(losses) == 2 and all(np.isfinite(losses))
  np.testing.assert_allclose(losses, reference, rtol=1e-4)
