"""A run's preparation (one builder per node: the label files parsed, then the texts
tokenized) and every file the run writes: caches, refresh inputs, negatives generations,
checkpoints and the export."""

from __future__ import annotations

from typing import NamedTuple

from astra_jax.plan.inputs import padded_rows
from astra_jax.plan.quantities import Quantities, split_rows
from astra_jax.plan.records import Item, NodeLayout

# Preparation, measured by benchmarks/data_scale.py (docs/results/data.md): the label
# parse's anonymous memory is bounded by its 16 MB blocks and tokenization's by its batches
# of 8192 texts; per CPU second the parse reads PARSE_BYTES_PER_CPU_S of label text and a
# word-level tokenizer turns TOKENIZE_ROWS_PER_CPU_S 32-token texts into ids (WordPiece is
# slower).
PARSE_PEAK_BYTES = 720 * 10**6
TOKENIZE_PEAK_BYTES = 150 * 10**6
PARSE_BYTES_PER_CPU_S = 64 * 10**6
TOKENIZE_ROWS_PER_CPU_S = 20_000
# "id:1 " per positive: the id's digits + 4 bytes of separators and value on average.
LABEL_TEXT_SEPARATOR_BYTES = 4
# Negatives files a process has on disk at most: the one in use and the one being mined
# (negatives/manager.py runs one worker at a time and deletes the file replaced at the swap).
NEGATIVES_GENERATIONS = 2


class Preparation(NamedTuple):
  """A node's preparation: its phases' peak memory (one after the other) and its work."""

  items: list[Item]
  seconds: dict  # label_text_bytes, parse_cpu_s, tokenize_rows, tokenize_cpu_s


def preparation(q: Quantities) -> Preparation:
  """The label parse's and tokenization's memory and CPU seconds (module docstring)."""
  digits = len(str(max(q.L - 1, 1)))
  text_bytes = (q.nnz_file + q.test_nnz) * (digits + LABEL_TEXT_SEPARATOR_BYTES)
  # The phases run one after the other: the peak is the larger (Plan.prep_peak).
  items = [
    Item("label parse (16 MB blocks), measured", PARSE_PEAK_BYTES, "bounded by the block"),
    Item(
      "tokenization (batches of 8192 texts), measured", TOKENIZE_PEAK_BYTES, "bounded by the batch"
    ),
  ]
  seconds = {
    "label_text_bytes": text_bytes,
    "parse_cpu_s": round(text_bytes / PARSE_BYTES_PER_CPU_S),
    "tokenize_rows": q.token_rows,
    "tokenize_cpu_s": round(q.token_rows / TOKENIZE_ROWS_PER_CPU_S),
  }
  return Preparation(items=items, seconds=seconds)


def disk_items(config, q: Quantities) -> list[Item]:
  """Every file the run writes: the caches (beside the data, once), the refresh files of
  each process (the inputs of the refresh last consumed stay beside those being collected:
  a resume reruns it), the negatives generations, the checkpoints and the export."""
  P, L, M, d, T, Pn, S, R = q.P, q.L, q.M, q.d, q.T, q.Pn, q.S, q.R
  token_rows = q.token_rows
  test_cache = (q.num_test + 1) * 8 + q.test_nnz * 4
  state = (
    4 * P
    + 8 * P
    + padded_rows(L, M) * d * 4
    + (padded_rows(L, M) * d * 4 if config.optim.classifier_momentum else 0)
  )
  keep = config.checkpoint.keep
  per = f"x {Pn} process{'es' if Pn > 1 else ''}"
  disk = [
    Item(
      f"token memmaps ({token_rows:,} rows x {T} int32: train, label texts, test)",
      token_rows * T * 4,
      "(N + test) x T x 4",
    )
  ]
  if q.nnz:
    disk.append(
      Item(
        "label caches (training + test labels)",
        q.label_cache_bytes + test_cache,
        "(N + 1) x 8 + nnz x 4 + L x 4, and the test rows'",
      )
    )
  kept, held_out = split_rows(q, config.data)
  if q.nnz and held_out and q.schedule.uses_index:
    disk.append(
      Item(
        f"validation split: the kept rows' ids, for the refresh workers ({per})",
        Pn * kept * 8,
        "processes x N kept x 8",
      )
    )
  return disk + [
    Item(
      f"refresh inputs, 2 refreshes' (the embeddings once, W snapshots {per})",
      2 * (q.collection + Pn * S * R * d * 4),
      "2 x (N x d x 4 + processes x shards per process x W shard)",
    ),
    Item(
      f"hard negatives, {NEGATIVES_GENERATIONS} generations: in use + being mined ({per})",
      Pn * NEGATIVES_GENERATIONS * q.negatives_own,
      f"processes x {NEGATIVES_GENERATIONS} x N x its data groups / data"
      " x shards per process x k_mined x 4",
    ),
    Item(
      f"checkpoints: the last {keep}, the best by P@5, one being written",
      (keep + 2) * state,
      "(keep + 2) x (P x 12 + L x d x 4 [+ momentum L x d x 4])",
    ),
    Item(
      "export (encoder + W; + tokenizer and label texts)", 4 * P + L * d * 4, "P x 4 + L x d x 4"
    ),
  ]


def layout_notes(config, q: Quantities, layout: NodeLayout) -> list[str]:
  """What a reader of the plan should know about the nodes, processes and the dataset."""
  notes = []
  Pn, S, M = q.Pn, q.S, q.M
  if layout.nodes > 1:
    notes.append(
      f"{layout.nodes} nodes: the caches, checkpoints and export are written once "
      f"(shared storage); each node's processes write the per-process files above"
    )
  if layout.nodes * Pn > M // S:
    notes.append(
      f"{layout.nodes * Pn} processes for {M // S} distinct group(s) of W shards: "
      f"the processes holding the same shards (data replicas) divide their queries, "
      f"each mining {q.own_rows:,} of the {q.rows:,} rows"
    )
  if S > 1:
    notes.append(
      f"a refresh worker mines for its process's {S} W shards ({q.R:,} rows each), "
      f"one index at a time"
    )
  if q.ds and not q.ds.public and not config.data.synthetic.enabled:
    notes.append(
      f"{q.ds.name} is proprietary: this plans the real dataset's size; its "
      f"synthetic stand-in is {q.ds.config}:synthetic"
    )
  return notes
