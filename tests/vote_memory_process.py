"""One of test_multiprocess.py's four processes holding the neighbour vote's memory: the
memory of test_mesh_memory's problem split over the processes' hosts and over the devices,
each process's votes for its rows of a query block written to OUT/process<i>.npz, the
exported keys to OUT/keys_<layout>.npy.

Usage: python tests/vote_memory_process.py OUT (with JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID set).
"""

import os
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vote_memory_problem import ENCODE, problem  # noqa: E402

from astra_jax.ann import mesh_memory, process_memory  # noqa: E402
from astra_jax.parallel import mesh_embedding, sharding  # noqa: E402
from astra_jax.runtime import distributed  # noqa: E402
from astra_jax.serving import export  # noqa: E402
from astra_jax.xc import neighbour_vote  # noqa: E402

QUERIES = 16
VOTE = neighbour_vote.NeighbourVote(0.5, 9, 0.1, 8, search="exact")


def main(out: str) -> None:
  mesh = sharding.make_mesh(2, 2, jax.devices())
  table, sources, labels, _, rng = problem(seed=4, num_labels=12)
  queries = rng.normal(size=(QUERIES, 8)).astype(np.float32)
  placed = jax.make_array_from_callback(
    queries.shape, NamedSharding(mesh, P(sharding.ALL)), lambda index: queries[index]
  )
  held = [s.data.shape[0] for s in placed.addressable_shards]
  found = {"positions": mesh_embedding.held_positions(placed, held)}
  memories = {
    "hosts": process_memory.embed_process_memory(mesh, ENCODE, table, sources, labels, 8),
    "devices": mesh_memory.embed_memory(mesh, ENCODE, table, sources, labels, 8),
  }
  found["host_rows"] = memories["hosts"].rows
  for layout, memory in memories.items():
    for name, view in (("all", memory), ("head", memory.head(37))):
      votes = view.own_votes(placed, held, VOTE)
      found[f"{layout}_{name}_ids"], found[f"{layout}_{name}_values"] = votes.ids, votes.values
    # Two blocks in one search (the second the queries in reverse): each block's own votes.
    flipped = jax.make_array_from_callback(
      queries.shape, placed.sharding, lambda index: queries[::-1][index]
    )
    pair = memory.own_votes_blocks([(placed, held), (flipped, held)], VOTE)
    for name, votes in zip(("pair0", "pair1"), pair):
      found[f"{layout}_{name}_ids"], found[f"{layout}_{name}_values"] = votes.ids, votes.values
    export.write_memory_keys(memory, os.path.join(out, f"keys_{layout}.npy"))
  np.savez(os.path.join(out, f"process{jax.process_index()}.npz"), **found)


if __name__ == "__main__":
  distributed.initialize("on")  # before anything touches a backend
  main(sys.argv[1])
