"""ScaNN over the trained classifier rows W, and over the neighbour vote's memory, for
prediction.

Built once per exported model with the same deterministic builder the hard-negative miner
uses (`ann.index.ScannIndex`), saved with ScaNN's own serialization into
WORKDIR/model/scann/ (atomically: a temporary directory renamed into place) together with
`astra_index.json` (the model id and knobs it was built for), and reloaded on the next
start when those still match. A re-export of the model replaces model/ and with it the
stale index. The vote's memory (when its search takes ScaNN: ann/memory_search.py) keeps its
index the same way in WORKDIR/model/vote_scann/ (`MemoryIndexStore`).

Scores of the returned candidates are recomputed exactly as <w_l, e> from W, so the ScaNN
and exact paths report the same numbers for the same labels; rows for which ScaNN returns
fewer than k candidates (only with extreme knobs) are completed by exact search.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Callable

import numpy as np
from absl import logging

from astra_jax.ann.index import ExactIndex, ScannIndex, ScannParams
from astra_jax.runtime import tmpnames
from astra_jax.serving.export import replace_dir

INDEX_DIR = "scann"
MEMORY_INDEX_DIR = "vote_scann"  # the neighbour vote's memory's index (vote_memory.py)
META_FILE = "astra_index.json"
_SERIAL_MAX = 16  # up to this many queries, search in the calling thread (no pool hand-off)
# Fewer rows than this: exact search (ScaNN's 16 leaves and 16-centre quantizer need more).
MIN_ROWS = 64


def serving_params(
  num_rows: int, k: int = 10, num_leaves: int = 0, leaves_to_search: int = 0, reorder: int = 0
) -> ScannParams:
  """Knobs for top-k prediction (zeros: scaled to L): ~2 sqrt(L) leaves like the miner, a
  fifth of them (at least 64) searched, max(10 k, 200) candidates re-ranked exactly, and a
  partitioner made for inner products: AVQ centres (eta 1) and SOAR spilling (lambda 1.5).

  Why: a query's top labels are spread over several leaves (it matches its positives'
  groups, not one cluster), so plain k-means leaves need a wide search; AVQ + SOAR lose
  the least P@1 for the leaves searched, at a somewhat longer build, and re-ranking more
  than 200 adds nothing (docs/results/implementation_notes.md)."""
  leaves = num_leaves or int(min(max(2 * math.sqrt(num_rows), 16), 20000))
  search = leaves_to_search or max(min(leaves, 64), leaves // 5)
  return ScannParams(
    leaves,
    min(search, leaves),
    reorder or max(10 * k, 200),
    min(num_rows, max(250_000, 50 * leaves)),
    avq=1.0,
    soar_lambda=1.5,
  )


class ScannLabels:
  """search(embeddings, k) -> (scores, ids), best first, over the rows of W."""

  def __init__(self, index: ScannIndex, w: np.ndarray, loaded: bool, build_s: float):
    self.index, self.w = index, w
    self.loaded, self.build_s = loaded, build_s

  def search(self, emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    q = np.ascontiguousarray(emb, np.float32)
    L = len(self.w)
    k = min(k, L)
    if len(q) == 0:
      return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
    searcher, pre = self.index.searcher, max(self.index.params.reorder, k)
    if len(q) <= _SERIAL_MAX:
      ids, dist = searcher.search_batched(q, k, pre)
    else:
      ids, dist = searcher.search_batched_parallel(q, k, pre)
    ids = np.where(np.isnan(dist), -1, ids.astype(np.int64))  # ScaNN pads short rows with nan
    short = (ids < 0).any(1)
    if short.any():
      ids[short] = ExactIndex(self.w).search(q[short], k)
    scores = np.einsum("nkd,nd->nk", self.w[ids], q)  # exact <w_l, e> for the candidates
    order = np.argsort(-scores, axis=1, kind="stable")
    return (
      np.take_along_axis(scores, order, 1).astype(np.float32),
      np.take_along_axis(ids, order, 1).astype(np.int32),
    )


def _read_meta(path: str) -> dict | None:
  try:
    with open(os.path.join(path, META_FILE)) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None


def open_scann(
  model_path: str, model_id: str, w: np.ndarray, params: ScannParams, rebuild: bool = False
) -> ScannLabels:
  """The cached index in model_path/scann when it was built for this model and these knobs,
  else a new one (saved there for next time; a read-only model dir only logs a warning)."""
  index, loaded, build_s = cached_index(
    os.path.join(model_path, INDEX_DIR),
    model_id,
    lambda: ScannIndex(np.asarray(w, np.float32), 10, params),
    w.shape,
    params,
    "classifier rows",
    rebuild,
  )
  return ScannLabels(index, w, loaded, build_s)


def cached_index(
  path: str,
  model_id: str,
  build: Callable[[], ScannIndex],
  shape: tuple[int, int],
  params: ScannParams,
  what: str,
  rebuild: bool = False,
  threads: int = 0,
) -> tuple[ScannIndex, bool, float]:
  """The ScaNN index saved in directory `path` when it was built for this model, rows and
  knobs, else `build()`'s, saved there for next time (a read-only model dir only logs a
  warning).

  Args:
    path: the index's directory inside the model directory.
    model_id: the model's id (model.json): a re-export makes a new one.
    build: builds the index over the rows.
    shape: the rows' (count, width).
    params: the knobs it is built with.
    what: the rows, in words, for the log.
    rebuild: build even when a matching index is saved.
    threads: a loaded index's search threads (0: ScaNN's default).
  Returns:
    (the index, whether it was loaded, the build's seconds when it was built).
  """
  want = {
    "model_id": model_id,
    "num_rows": int(shape[0]),
    "dim": int(shape[1]),
    "params": dataclasses.asdict(params),
  }
  have = None if rebuild else _read_meta(path)
  if have is not None and {k: have.get(k) for k in want} == want:
    t0 = time.time()
    try:
      index = ScannIndex.load(path, params, threads)
      # Another process may have replaced the directory while this one read it.
      replaced = _read_meta(path) != have
    except (RuntimeError, OSError, ValueError) as e:
      index, replaced = None, True
      logging.info("could not load the ScaNN index in %s (%s)", path, e)
    if not replaced:
      logging.info("loaded the ScaNN index from %s in %.1fs", path, time.time() - t0)
      return index, True, have.get("build_s", 0.0)
    logging.info("the ScaNN index in %s changed while loading; building one", path)
  elif have is not None:
    logging.info(
      "the ScaNN index in %s was built for another model or other knobs; rebuilding", path
    )
  t0 = time.time()
  index = build()
  build_s = round(time.time() - t0, 2)
  logging.info("built a ScaNN index over %d x %d %s in %.1fs (%s)", *shape, what, build_s, params)
  parent, name = os.path.split(path)
  tmp = os.path.join(parent, f".{name}.tmp-{tmpnames.unique_suffix()}")
  try:
    shutil.rmtree(tmp, ignore_errors=True)
    index.save(tmp)
    with open(os.path.join(tmp, META_FILE), "w") as f:  # last: marks the index complete
      json.dump(dict(want, build_s=build_s), f, indent=1)
    replace_dir(tmp, path)
  except OSError as e:
    shutil.rmtree(tmp, ignore_errors=True)
    logging.warning(
      "could not save the ScaNN index into %s (%s); it is rebuilt on every start", path, e
    )
  return index, False, build_s


@dataclasses.dataclass(frozen=True)
class MemoryIndexStore:
  """Where a model's vote memory keeps its ScaNN index (vote_memory.IndexStore):
  model_path/MEMORY_INDEX_DIR, reused while the model and the index's knobs are the same.

  Attributes:
    model_path: the model directory.
    model_id: its id.
  """

  model_path: str
  model_id: str

  def get(
    self,
    build: Callable[[], ScannIndex],
    shape: tuple[int, int],
    params: ScannParams,
    threads: int = 0,
  ) -> ScannIndex:
    path = os.path.join(self.model_path, MEMORY_INDEX_DIR)
    return cached_index(path, self.model_id, build, shape, params, "memory rows", False, threads)[0]
