"""What the hosts hold in training: a refresh worker's and a training process's memory,
and a node's, where the files every process maps (label cache, token memmaps) count once
and each process's own files once per process."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from astra_jax.plan.quantities import Quantities, split_rows
from astra_jax.plan.records import Item, resident


class HostItems(NamedTuple):
  """A node's memory in training, by process kind, and what the estimate leaves out."""

  worker: list[Item]  # a refresh worker process
  trainer: list[Item]  # a training process
  node: list[Item]  # the node: every process and worker, shared files once
  notes: list[str]


def _worker_items(q: Quantities) -> list[Item]:
  R, d, S, mined, own_rows, rows = q.R, q.d, q.S, q.mined, q.own_rows, q.rows
  if q.index_kind == "scann":
    # One ScaNN index per shard, flat or with leaves trained in groups: its fp32 copy of
    # the rows, the build's own copy, and the quantized codes (d / 2 bytes per row and
    # leaf it is in, at most a quarter of the shard with SOAR).
    worker = [
      Item(
        f"ANN index, one shard (ScaNN: fp32 copy + codes, {R:,} rows)",
        2 * R * d * 4,
        "2 x W shard",
      )
    ]
  else:
    worker = [
      Item(
        f"exact index ({R:,} rows + one 4096-query score block)",
        R * d * 4 + 4096 * R * 4 * 2,
        "W shard + 2 x 4096 x rows x 4",
      )
    ]
  return worker + [
    Item("W snapshot of one shard (loaded)", R * d * 4, "W shard"),
    Item(
      f"mined hard negatives being written ({own_rows:,} x {S} x {mined} int32)",
      q.negatives_own,
      "N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      f"query embeddings (the run's one file, {rows:,} x {d} fp32)",
      q.collection,
      "N x d x 4",
      paged=True,
    ),
  ]


def _trainer_items(q: Quantities) -> list[Item]:
  R, d, S, mined, own_rows, rows = q.R, q.d, q.S, q.mined, q.own_rows, q.rows
  return [
    Item(
      f"W rows of its {S} shard(s) copied for a refresh's snapshot",
      S * R * d * 4,
      "shards per process x W shard",
    ),
    Item(
      f"hard negatives in use ({own_rows:,} x {S} x {mined} int32)",
      q.negatives_own,
      "N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      f"query embeddings being collected ({rows:,} x {d} fp32, process 0 writes them)",
      q.collection,
      "N x d x 4",
      paged=True,
    ),
  ]


def host_items(q: Quantities, data_config) -> HostItems:
  """A refresh worker's, a training process's and a node's memory (module docstring).

  Args:
    q: the plan's quantities.
    data_config: the config's `data`; its validation split (`data.validation_*`) keeps the
      kept rows' ids and a copy of the held-out rows' labels in RAM (data/validation.py).
  """
  rows, T, Pn = q.rows, q.T, q.Pn
  notes = []
  worker = _worker_items(q)
  trainer = _trainer_items(q)
  tokens = Item(
    f"token memmaps ({rows:,} training rows x {T} int32)", rows * T * 4, "N x T x 4", paged=True
  )
  trainer.insert(0, tokens)
  label_cache = Item(
    f"training label matrix (label cache, ~{q.nnz_file:,} pairs)",
    q.label_cache_bytes,
    "(N + 1) x 8 + nnz x 4 + L x 4",
    paged=True,
  )
  kept, held_out = split_rows(q, data_config)
  # A validation split's kept rows are read from the label cache through their row ids
  # (sparse_rows.SelectedRows); a process writes the ids beside its refresh worker's inputs.
  row_ids = Item(
    f"validation split: the kept rows' ids, its process's .npy ({kept:,} int64)",
    kept * 8,
    "N kept x 8",
    paged=True,
  )
  if q.nnz:
    worker.append(
      dataclasses.replace(
        label_cache, name=f"training positives (label cache, ~{q.nnz_file:,} pairs)"
      )
    )
    if held_out and q.schedule.uses_index:
      worker.append(row_ids)
    trainer.insert(0, label_cache)
    if held_out:
      trainer[1:1] = [
        Item(f"validation split: the kept rows' ids ({kept:,} int64)", kept * 8, "N kept x 8"),
        Item(
          f"validation split: the held-out rows' labels, copied (~{int(held_out * q.lpp):,} pairs)",
          (held_out + 1) * 8 + int(held_out * q.lpp) * 4,
          "(N held out + 1) x 8 + their nnz x 4",
        ),
      ]
  else:
    notes.append(
      "the label matrix is not counted (labels per point unknown): its cache, "
      "(N + 1) x 8 + nnz x 4 + L x 4 bytes, is mapped once per node"
    )

  # A node in training: each process's and worker's own memory, each process's own files,
  # and the files every process maps (label cache, token memmaps) once.
  per = f"x {Pn} process{'es' if Pn > 1 else ''}"
  node = [
    Item(
      f"training processes' resident memory ({per})",
      Pn * resident(trainer),
      "processes per node x the process's resident",
    ),
    Item(
      f"refresh workers' resident memory ({per})",
      Pn * resident(worker),
      "processes per node x the worker's resident",
    ),
    Item("token memmaps (once per node)", tokens.bytes, tokens.formula, paged=True),
  ]
  if q.nnz:
    node.append(
      Item("label cache (once per node)", q.label_cache_bytes, label_cache.formula, paged=True)
    )
  if q.nnz and held_out and q.schedule.uses_index:
    node.append(
      dataclasses.replace(
        row_ids, name=f"validation split: kept rows' ids, .npy ({per})", bytes=Pn * row_ids.bytes
      )
    )
  node += [
    Item(
      f"hard negatives in use ({per})",
      Pn * q.negatives_own,
      "processes x N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      f"hard negatives being mined ({per})",
      Pn * q.negatives_own,
      "processes x N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      "query-embedding collection (one file for every process)",
      q.collection,
      "N x d x 4",
      paged=True,
    ),
  ]
  return HostItems(worker=worker, trainer=trainer, node=node, notes=notes)
