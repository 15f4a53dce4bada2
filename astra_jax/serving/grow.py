"""A trained model grown with new labels, without retraining (`python -m astra_jax.extend`).

New labels get W rows from their texts alone (zero-shot), by the map from text to row that
the trained labels show: a ridge regression w_l ~ M e_l + b over (a sample of) the trained
labels, e_l = E(z_l) / |E(z_l)| under the trained encoder, applied to each new text. A row
of the text's direction alone, at the trained rows' median norm, outranks the trained labels
(docs/serving.md): trained rows also carry what training pushed into all of them (the random
negatives' pull away from the queries), which b and M restore.
Old labels keep their ids and rows bit for bit; new ones are appended (ids L, L+1, ...); a
retired label keeps its id and row and is masked from every prediction (`model.json`'s
`retired`), so ids in logs and downstream tables never change meaning. The grown model is
a new exported model (serving/export.py's layout) that `Predictor` serves at once, its
ScaNN index built on first use; a model that mixes label-text similarity into its scores
(scoring.label_text_weight) ranks the new labels by it too. A model with a neighbour vote
(scoring.neighbour_weight) keeps its memory: its rows vote for old labels only until a
retrain puts new ones in their label rows. Lexical terms (scoring.lexical_*) likewise: the
new labels' texts join the TF-IDF label-text term, under the trained vocabularies.

Every check runs before anything is written: an empty text, a text that repeats an existing
label's (or another new one's), a retired id outside the grown label set, or a model this
code cannot read is one InputError naming the file and line, and no model appears.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np

from astra_jax.ann.vote_memory import Memory
from astra_jax.data import tokenize, xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.model import embedding
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export
from astra_jax.xc.score_fusion import unit_rows

# model.json keys save_model writes itself; every other key of the old model is carried over.
_OWN_KEYS = {
  "format_version",
  "model_id",
  "created",
  "encoder_arch",
  "encoder",
  "max_len",
  "pad_id",
  "num_labels",
  "embed_dim",
  "label_texts",
}
EMBED_BATCH = 1024
FIT_LABELS = 50_000  # trained labels the text -> row map is fitted on, at most
RIDGE = 1e-2  # the map's ridge, relative to the mean diagonal of the normal equations


@dataclasses.dataclass(frozen=True)
class GrowReport:
  """What a grow did."""

  path: str  # the new model directory
  old_labels: int
  new_labels: int
  retired: tuple[int, ...]  # every retired id of the grown model, old ones included
  fit_labels: int  # trained labels the text -> row map was fitted on
  fit_r2: float  # the share of the trained rows' variance the map explains on them
  seconds: float


def read_label_texts(path: str) -> list[str]:
  """New label texts, one per line (`uid->text` lines for *.raw.txt), stripped.

  Raises:
    InputError: the file is missing or a line is empty (named by its number).
  """
  if not os.path.exists(path):
    raise InputError(f"{path}: no such file of new label texts")
  texts = [t.strip() for t in xc_format.read_texts(path)]
  for line, text in enumerate(texts, 1):
    if not text:
      raise InputError(f"{path}:{line}: an empty label text")
  if not texts:
    raise InputError(f"{path}: no label texts in it")
  return texts


def read_ids(path: str) -> list[int]:
  """Label ids, one per line (blank lines skipped).

  Raises:
    InputError: the file is missing or a line is not an integer (named by its number).
  """
  if not os.path.exists(path):
    raise InputError(f"{path}: no such file of label ids")
  ids = []
  with open(path) as f:
    for line, text in enumerate(f, 1):
      if text.strip():
        try:
          ids.append(int(text))
        except ValueError:
          raise InputError(f"{path}:{line}: {text.strip()!r} is not a label id") from None
  return ids


def check_new_texts(old: list[str] | None, new: list[str], source: str) -> None:
  """Raises InputError at the first new text that repeats an existing label's text or an
  earlier new one (texts compared stripped); `source` names the file in the message."""
  num_old = len(old or ())
  seen: dict[str, int] = {}
  for i, t in enumerate(old or ()):
    seen.setdefault(t.strip(), i)
  for line, text in enumerate(new, 1):
    key = text.strip()
    if key in seen:
      first = seen[key]
      where = f"label {first}'s text" if first < num_old else f"line {first - num_old + 1}'s"
      raise InputError(f"{source}:{line}: {key!r} repeats {where}; a label's text names it once")
    seen[key] = num_old + line - 1


def fit_text_to_row(
  unit_texts: np.ndarray, rows: np.ndarray, ridge: float = RIDGE
) -> tuple[np.ndarray, float]:
  """The ridge map [e, 1] -> w fitted on trained labels.

  Args:
    unit_texts: (n, d) the labels' unit text embeddings.
    rows: (n, d) their trained rows.
    ridge: the penalty, relative to the mean diagonal of [e, 1]^T [e, 1].
  Returns:
    ((d + 1, d) the map, the last row the offset b; R^2 of the fit on these labels).
  """
  z = np.concatenate([unit_texts, np.ones((len(unit_texts), 1))], axis=1).astype(np.float64)
  gram = z.T @ z
  gram += ridge * np.trace(gram) / len(gram) * np.eye(len(gram))
  m = np.linalg.solve(gram, z.T @ rows.astype(np.float64))
  resid = rows - z @ m
  total = ((rows - rows.mean(0)) ** 2).sum()
  return m.astype(np.float32), float(1.0 - (resid**2).sum() / max(total, 1e-12))


def text_embedder(model: export.Model):
  """texts -> E(z) (n, d) float32 under the model's encoder and tokenizer, batched as
  training embeds (model/embedding.py: one compiled shape for every call)."""
  tokenizer = tokenize.load_tokenizer(model.tokenizer_dir)
  embed_fn = embedding.make_embed_fn(model.graphdef)

  def embed_texts(texts: list[str]) -> np.ndarray:
    tokens = tokenize.tokenize_texts(texts, tokenizer, model.max_len)
    return embedding.embed(embed_fn, model.encoder_params, tokens, EMBED_BATCH)

  return embed_texts


def _train_config(model_path: str) -> dict:
  path = os.path.join(model_path, "config.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _grown_memory(memory: Memory | None, num_labels: int) -> Memory | None:
  """The neighbour vote's memory over the grown label set (the same rows and votes)."""
  if memory is None:
    return None
  labels = memory.labels
  return Memory(memory.keys, SparseRows(labels.indptr, labels.indices, None, num_labels))


def grow_model(
  source_workdir: str,
  new_texts: list[str],
  out_workdir: str,
  retire: list[int] = (),
  source_name: str = "new labels",
) -> GrowReport:
  """Writes OUT_WORKDIR/model: the model of SOURCE_WORKDIR with `new_texts` appended as
  labels (zero-shot rows, module docstring) and `retire` masked.

  Args:
    source_workdir: a workdir holding an exported model (WORKDIR/model).
    new_texts: the new labels' texts, in the order their ids are given.
    out_workdir: where the grown model goes (its `model/`; may be source_workdir, whose
      model is then replaced atomically).
    retire: label ids (old or new) to mask from predictions.
    source_name: how error messages name where `new_texts` came from.
  Returns:
    The GrowReport.
  Raises:
    InputError: a check failed (module docstring); nothing was written.
  """
  t0 = time.time()
  model = export.load_model(source_workdir)
  old_l = len(model.classifier)
  if model.label_texts is None and new_texts:
    raise InputError(
      f"{export.model_dir(source_workdir)}: the model has no label texts (labels.txt), so a "
      "new label's text cannot be checked against the old ones"
    )
  check_new_texts(model.label_texts, new_texts, source_name)
  total = old_l + len(new_texts)
  for i in retire:
    if not 0 <= i < total:
      raise InputError(f"retired label id {i} is outside the grown model's ids 0..{total - 1}")
  retired = tuple(sorted(set(model.meta.get("retired", [])) | set(retire)))
  d = model.classifier.shape[1]
  new_rows, fit_n, r2 = np.zeros((0, d), np.float32), 0, 0.0
  if new_texts:
    # The map is fitted on trained rows only: rows an earlier growth made are its output.
    trained = model.trained_labels
    live = np.setdiff1d(np.arange(trained), [i for i in retired if i < trained])
    rng = np.random.default_rng(0)
    fit = np.sort(rng.choice(live, min(FIT_LABELS, len(live)), replace=False))
    fit_texts = [model.label_texts[i] for i in fit]
    embed_texts = text_embedder(model)
    mapping, r2 = fit_text_to_row(
      unit_rows(embed_texts(fit_texts)), np.asarray(model.classifier[fit], np.float32)
    )
    fit_n = len(fit)
    new_rows = (unit_rows(embed_texts(new_texts)) @ mapping[:-1] + mapping[-1]).astype(np.float32)
  extra = {k: v for k, v in model.meta.items() if k not in _OWN_KEYS}
  extra.update(
    retired=list(retired),
    grown_from={
      "model_id": model.meta["model_id"],
      "num_labels": old_l,
      "trained_labels": model.trained_labels,
    },
  )
  path = export.save_model(
    out_workdir,
    encoder_cfg=model.encoder_cfg,
    encoder_params=model.encoder_params,
    classifier=np.concatenate([np.asarray(model.classifier, np.float32), new_rows]),
    tokenizer_dir=model.tokenizer_dir,
    max_len=model.max_len,
    pad_id=model.pad_id,
    label_texts=None if model.label_texts is None else list(model.label_texts) + new_texts,
    train_config=_train_config(model.path),
    extra=extra,
    memory=_grown_memory(model.memory, total),
    lexical_index=None
    if model.lexical is None
    else model.lexical.with_labels(list(model.label_texts) + new_texts, total),
  )
  return GrowReport(path, old_l, len(new_texts), retired, fit_n, r2, round(time.time() - t0, 3))
