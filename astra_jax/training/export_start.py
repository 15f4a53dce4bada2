"""A run that continues from an exported model (`train.init_from=WORKDIR`): its encoder's
weights and its W's rows, each data label's row found by the label's text.

Matching by text, not by id, lets the data's label list differ from the export's order: a
model grown with new labels (serving/grow.py) appends them, while the dataset that adds
their training pairs may number them anywhere. Labels that share a text (catalogues have
them) are matched in order: the data's k-th label with a text gets the export's k-th row
with it. A data label whose text the export lacks
starts as `classifier.init` says (a new label); an export label the data lacks stops the
run, since a continued run must keep every label it had (retire one instead: serving/grow.py).
"""

from __future__ import annotations

import jax
import numpy as np
from absl import logging

from astra_jax.runtime.errors import InputError
from astra_jax.serving import export


def export_rows(
  workdir: str, data_label_texts: list[str] | None
) -> tuple[np.ndarray, np.ndarray, int]:
  """Where each data label's row is in WORKDIR/model's W.

  Args:
    workdir: the workdir of the exported model the run continues from.
    data_label_texts: the dataset's label texts, in its label order.
  Returns:
    (source (L,) int64: the export's row for each data label, -1 for a new label; the
    export's W, (L_export, d) float32 memory-mapped; the export's trained labels: its rows
    from there on were grown from their texts, never trained).
  Raises:
    InputError: no exported model, label texts missing on either side, or an export label
      whose text the data lacks (named, with how many more).
  """
  model = export.load_model(workdir)
  where = f"config.train.init_from={workdir}"
  if model.label_texts is None or data_label_texts is None:
    side = "the exported model" if model.label_texts is None else "the dataset"
    raise InputError(f"{where}: {side} has no label texts, which map its labels to the data's")
  rows_of: dict[str, list[int]] = {}
  for i, text in enumerate(model.label_texts):
    rows_of.setdefault(text.strip(), []).append(i)
  taken: dict[str, int] = {}
  source = np.full(len(data_label_texts), -1, np.int64)
  for j, text in enumerate(data_label_texts):
    key = text.strip()
    k = taken.get(key, 0)
    if k < len(rows_of.get(key, ())):
      source[j], taken[key] = rows_of[key][k], k + 1
  missing = np.setdiff1d(np.arange(len(model.label_texts)), source[source >= 0])
  missing = np.setdiff1d(missing, model.meta.get("retired", []))
  if len(missing):
    first = int(missing[0])
    raise InputError(
      f"{where}: the export's label {first} ({model.label_texts[first]!r}) and "
      f"{len(missing) - 1} more are not among the dataset's label texts; a continued run "
      "keeps every label (retire one with python -m astra_jax.extend --retire)"
    )
  return source, model.classifier, model.trained_labels


def continue_classifier(w_start: jax.Array, source: np.ndarray, exported: np.ndarray) -> jax.Array:
  """`w_start` (rows >= L, d; split by rows over the mesh) with each data label's row
  replaced by the export's row, shard by shard where it lives: a process copies only the
  rows its devices hold, as in a multi-process run it can read no others."""
  pieces = []
  for piece in w_start.addressable_shards:
    lo = piece.index[0].start or 0
    host = np.array(piece.data, np.float32)  # this device's rows, a copy to write into
    ids = np.arange(lo, min(lo + len(host), len(source)))
    known = ids[source[ids] >= 0]
    host[known - lo] = np.asarray(exported[source[known]], np.float32)[:, piece.index[1]]
    pieces.append(jax.device_put(host, piece.device))
  logging.info(
    "W: %d rows from the exported model, %d new labels from classifier.init",
    int((source >= 0).sum()),
    int((source < 0).sum()),
  )
  return jax.make_array_from_single_device_arrays(w_start.shape, w_start.sharding, pieces)


def new_rows(
  source: np.ndarray, trained: int, rows: int, layout: jax.sharding.NamedSharding
) -> jax.Array:
  """The (rows,) bool mask of the data labels the export never trained (`train.freeze_old_rows`:
  the rows a step may change): those it lacks and those it was grown with (rows from
  `trained` on), padding rows False, laid out as `layout` says: each process builds only the
  pieces its devices hold."""
  mask = np.zeros(rows, bool)
  mask[: len(source)] = (source < 0) | (source >= trained)
  logging.info("train.freeze_old_rows: %d of %d rows trainable", int(mask.sum()), len(source))
  return jax.make_array_from_callback((rows,), layout, lambda index: mask[index])
