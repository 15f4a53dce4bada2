"""What a score beyond W costs after training: the label texts' embeddings
(`scoring.label_text_weight`, xc/score_fusion.py), held by every process, and the neighbour
vote's memory (`scoring.neighbour_weight`, xc/neighbour_vote.py): its keys whole on every
host for a ScaNN search, else split over every GPU (ann/mesh_memory.py) where a GPU's share
fits beside the trained state (memory_search.LAYOUTS), else each process's share on its
host (ann/process_memory.py); its labels, views of the data's label rows (no bytes beyond
training's); and the FLOP of the vote's search (exact, or through a ScaNN index:
ann/memory_search.py).

And the lexical terms (`scoring.lexical_*`, xc/lexical.py): the TF-IDF vectors of every
label text and of every voting row, held by each process on its host, at
LEXICAL_NNZ_PER_TEXT non-zeros a text (an assumption: the Debian datasets' texts of about
60 characters have 156-159).

These terms are for datasets of up to a few million rows; at SS-20M's 146M training rows
the plan shows what turning them on would take rather than refusing it.
"""

from __future__ import annotations

import dataclasses

from astra_jax.ann import index, memory_search
from astra_jax.plan.quantities import Quantities, split_rows
from astra_jax.plan.records import Item, VoteSearchCost

# neighbour_vote.MAX_VOTES, the labels a query's vote keeps: that module imports jax, which
# the planner never does (tests/test_plan.py checks both).
VOTE_SLOTS = 256
# TF-IDF non-zeros of one short text (word 1-2-grams and character 2-4-grams), assumed.
LEXICAL_NNZ_PER_TEXT = 160


@dataclasses.dataclass(frozen=True)
class ScoreExtras:
  """A score's extras.

  Attributes:
    items: host RAM of each process after training (none when the score is W alone).
    device: memory of each GPU after training, beside the trained state.
    disk: what the export adds (`vote_memory_keys.npy`, `vote_memory.npz`).
    vote_search: the vote's search cost; None without the vote.
  """

  items: list[Item]
  device: list[Item]
  disk: list[Item]
  vote_search: VoteSearchCost | None


def _uses(config, field: str) -> bool:
  sc = config.get("scoring", {})
  return bool(sc.get(field, 0.0)) or any(sc.get(f"{field}_choices", ()))


def score_extras(
  config,
  q: Quantities,
  num_train: int,
  processes: int = 1,
  accelerator: bool = True,
  device_room: int | None = None,
) -> ScoreExtras:
  """The extras of `config.scoring` at the plan's sizes.

  Args:
    config: the experiment config.
    q: the plan's quantities (L, d, test rows, positives per row).
    num_train: the original training rows (the memory: the training and validation rows).
    processes: the run's processes (each keeps the votes of the validation rows it ranks).
    accelerator: whether the run's devices are GPUs or TPUs (`auto` then searches exactly).
    device_room: a GPU's free bytes after training (None: room for any memory).
  Returns:
    The ScoreExtras.
  """
  items, device, disk, search = [], [], [], None
  if _uses(config, "label_text_weight"):
    items.append(
      Item(f"label-text embeddings E(z_l) ({q.L:,} x {q.d} fp32)", q.L * q.d * 4, "L x d x 4")
    )
  if _uses(config, "neighbour_weight"):
    n, d = num_train, q.d
    keys = Item(
      f"vote memory: unit E(x) of {n:,} training rows (fp32), whole for ScaNN",
      n * d * 4,
      "N x d x 4",
    )
    # The memory's labels are views of the data's label rows (training, then validation):
    # no bytes beyond training's; the export streams them to vote_memory.npz.
    nnz = int(n * q.lpp) if q.lpp else 0
    labels = Item(
      f"vote memory: their labels (CSR, ~{nnz:,} pairs)",
      (n + 1) * 8 + nnz * 4,
      "(N + 1) x 8 + nnz x 4",
    )
    sc = config.scoring
    search_kind = memory_search.SEARCHES[sc.get("neighbour_search", "auto")]
    rows = sc.get("neighbour_search_rows", memory_search.SCANN_ROWS_PER_QUERY)
    scann = search_kind.uses_scann(n, rows, accelerator)
    layout = memory_search.LAYOUTS[sc.get("neighbour_memory", "auto")]
    # A ScaNN index is built over every row: the keys are gathered whole onto every process.
    on_devices = not scann and layout.on_devices(n, d, q.G, device_room)
    if scann:
      items.append(keys)
    elif on_devices:  # each device its share of the keys and their memory rows (int32)
      device.append(
        Item(
          f"vote memory: its {-(-n // q.G):,} keys of the {n:,} (fp32) and their row ids",
          memory_search.device_share_bytes(n, d, q.G),
          "N / G x (d x 4 + 4)",
        )
      )
    else:  # each process its devices' share of the keys and their memory rows (int64)
      items.append(
        Item(
          f"vote memory: the process's {-(-n // processes):,} keys (fp32) and row ids"
          f"{' (no room on the GPUs)' if layout.name == 'auto' else ''}",
          -(-n // processes) * (4 * d + 8),
          "N / processes x (d x 4 + 8)",
        )
      )
    disk += [
      Item("export: vote_memory_keys.npy", keys.bytes, "N x d x 4"),
      Item("export: vote_memory.npz (their labels)", labels.bytes, "as in memory"),
    ]
    _, validation = split_rows(q, config.data)
    if validation:
      # Each process's share, taken by the choice's first candidate and kept for the others
      # in the process's vote_cache/ (training/neighbour_memory.py), read back
      # memory-mapped, removed once the validation split's evaluation has read it.
      own = -(-validation // processes)
      cache = Item(
        f"its validation rows' votes ({own:,} x {VOTE_SLOTS} ids + values)",
        own * VOTE_SLOTS * 8,
        "N_val / processes x max_votes x (4 + 4)",
        paged=True,
      )
      items.append(cache)
      disk.append(
        Item(
          f"vote_cache/ of the {processes} process(es) until the run ends (the validation "
          "rows' votes)",
          processes * cache.bytes,
          "processes x N_val / processes x max_votes x (4 + 4)",
        )
      )
    queries = q.num_test + validation
    if scann:
      params = memory_search.scann_params(n, sc.get("neighbours", 50), rows)
      scored = index.rows_scored_per_query(n, params) + params.num_leaves
      # The index is built on the host from the keys gathered onto every process; ScaNN
      # keeps a float32 copy of the rows to re-rank with, 4-bit codes of each pair of
      # dimensions and each row's leaf.
      items.append(
        Item(
          f"vote memory: its ScaNN index ({params.num_leaves:,} leaves)",
          n * (4 * d + d // 4 + 4),
          "N x (4 d + d / 4 + 4)",
        )
      )
      search = VoteSearchCost(
        True,
        scored,
        2.0 * queries * scored * d,
        2.0 * n * params.num_leaves * d,
        n,
        q.num_test,
        validation,
        on_devices,
      )
    else:
      flop = 2.0 * queries * n * d
      search = VoteSearchCost(False, n, flop, 0.0, n, q.num_test, validation, on_devices)
  if _uses(config, "lexical_label_text_weight") or _uses(config, "lexical_neighbour_weight"):
    nnz = LEXICAL_NNZ_PER_TEXT
    lexical = [
      Item(
        f"lexical terms: TF-IDF of {q.L:,} label texts (CSR, ~{nnz} non-zeros each)",
        q.L * nnz * 8 + (q.L + 1) * 8,
        "L x nnz x (4 + 4) + (L + 1) x 8",
      ),
      Item(
        f"lexical terms: TF-IDF of {num_train:,} voting rows (CSR, ~{nnz} non-zeros each)",
        num_train * nnz * 8 + (num_train + 1) * 8,
        "N x nnz x (4 + 4) + (N + 1) x 8",
      ),
    ]
    items += lexical
    disk += [
      Item(f"export: lexical/{x.name.split(':', 1)[1]}", x.bytes, x.formula) for x in lexical
    ]
  return ScoreExtras(items, device, disk, search)
