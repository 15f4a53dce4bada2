r"""Growing a model with labels it never saw, measured on a real dataset: by text alone, then
by a short update on their training pairs, against a full retrain.

  python benchmarks/grow_protocol.py --data=DIR --work=WORK --out=grow_protocol.jsonl \
      [--config=experiments/xc_text.py:ngram] [--holdout=0.1] [--seed=0]

DIR is a dataset in the XC raw layout (raw_data/{train,test,label}.raw.txt, trn_X_Y.txt,
tst_X_Y.txt). A share --holdout of the labels, drawn by --seed, is held out: the training
run sees neither them nor any training pair of theirs (WORK/data_without: the other labels,
renumbered, every training row kept). Then:

  before: the model trained on the rest (`python -m astra_jax.main`, --config);
  zero-shot: that model grown with the held-out labels' texts (serving/grow.py);
  text alone: the same trained encoder ranking every label by cos(E(x), E(z_l));
  few-shot (with --few_shot_epochs=E): the grown model trained on, for E epochs, with
    every training pair, the held-out labels' included (`train.init_from`: rows matched by
    text; no warm start; hard negatives mined from the grown W before the first epoch);
  retrain (with --retrain): the config trained on all labels, the full retrain growing
    is to avoid.

Each is scored on the dataset's test split in its original label ids, each row's own item
filtered as the config does (`data.filter_self=auto` for debian-recommends-20k): P@1 / P@5 /
PSP@5 on all test rows, on the rows with a held-out label, and P@1 by the other labels alone
(the truth restricted to the labels the model was trained on). One JSON line: sizes, the
seconds of training and of growing, and those metrics.
"""

import json
import os
import subprocess
import sys
import time

import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.data import xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import metrics
from astra_jax.serving import grow
from astra_jax.serving.predictor import Predictor

flags.DEFINE_string("data", None, "dataset directory (XC raw layout)")
flags.DEFINE_string("work", None, "working directory")
flags.DEFINE_string("config", "experiments/xc_text.py:ngram", "training config")
flags.DEFINE_float("holdout", 0.1, "share of the labels held out")
flags.DEFINE_integer("seed", 0, "which labels are held out")
flags.DEFINE_float("propensity_A", 0.55, "propensity constant A")
flags.DEFINE_float("propensity_B", 1.5, "propensity constant B")
flags.DEFINE_list("set", [], "more overrides of the training config, KEY=VALUE")
flags.DEFINE_integer("few_shot_epochs", 0, "> 0: the few-shot update of that many epochs")
flags.DEFINE_bool("retrain", False, "also train on all labels (the full retrain) and score it")
flags.DEFINE_string("out", None, "append the JSON line here")
flags.mark_flags_as_required(["data", "work"])
K = 5


def _rows(labels: SparseRows) -> list[list[int]]:
  return [labels.row(i).tolist() for i in range(labels.num_rows)]


def _write_uid(path: str, texts: list[str]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    for i, t in enumerate(texts):
      f.write(f"{i}->{t}\n")


def derived_dataset(data: str, out: str, keep: np.ndarray) -> None:
  """The dataset with only the labels `keep` (renumbered in that order); every row kept."""
  raw = os.path.join(data, "raw_data")
  label_texts = xc_format.read_texts(os.path.join(raw, "label.raw.txt"))
  new_id = np.full(len(label_texts), -1)
  new_id[keep] = np.arange(len(keep))
  for split, name in (("train", "trn_X_Y.txt"), ("test", "tst_X_Y.txt")):
    labels = xc_format.read_sparse(os.path.join(data, name), len(label_texts))
    rows = [[int(new_id[j]) for j in r if new_id[j] >= 0] for r in _rows(labels)]
    xc_format.write_sparse(os.path.join(out, name), SparseRows.from_lists(rows, len(keep)))
    texts = xc_format.read_texts(os.path.join(raw, f"{split}.raw.txt"))
    _write_uid(os.path.join(out, "raw_data", f"{split}.raw.txt"), texts)
  _write_uid(os.path.join(out, "raw_data", "label.raw.txt"), [label_texts[i] for i in keep])


def scores(pred: np.ndarray, truth: SparseRows, inv_prop: np.ndarray, rows=None) -> dict:
  if rows is not None:
    pred = pred[rows]
    truth = SparseRows.from_lists([truth.row(i).tolist() for i in rows], truth.num_cols)
  m = metrics.as_percent(metrics.compute(pred, truth, inv_prop, (1, 5)))
  return {k: round(m[k], 2) for k in ("P@1", "P@5", "PSP@5")}


def text_alone(p: Predictor, test_texts: list[str], label_texts: list[str]) -> np.ndarray:
  """Top K labels by cos(E(x), E(z_l)), each row's own item (same text) left out."""
  q = p.encode(p.to_tokens(test_texts)[0])
  z = p.encode(p.to_tokens(label_texts)[0])
  q /= np.linalg.norm(q, axis=1, keepdims=True).clip(1e-12)
  z /= np.linalg.norm(z, axis=1, keepdims=True).clip(1e-12)
  own = {}
  for j, t in enumerate(label_texts):
    own.setdefault(t.strip(), []).append(j)
  out = np.empty((len(q), K), np.int64)
  for s in range(0, len(q), 1024):
    sim = q[s : s + 1024] @ z.T
    for r, text in enumerate(test_texts[s : s + 1024]):
      sim[r, own.get(text.strip(), [])] = -np.inf
    out[s : s + 1024] = np.argsort(-sim, axis=1)[:, :K]
  return out


def _train(F, data_dir: str, workdir: str, extra: tuple[str, ...] = ()) -> dict:
  """Trains the config on `data_dir` into `workdir` unless it is done; its seconds, total
  and of the training stages (warm start + classifier stage)."""
  if not os.path.exists(os.path.join(workdir, "results.json")):
    cmd = [sys.executable, "-m", "astra_jax.main", f"--config={F.config}"]
    cmd += [f"--config.data.dir={data_dir}", f"--workdir={workdir}"]
    subprocess.run(cmd + [f"--config.{kv}" for kv in (*F.set, *extra)], check=True)
  with open(os.path.join(workdir, "results.json")) as f:
    r = json.load(f)
  stages = r.get("stage_seconds", {})
  return {
    "total_s": r["total_time_s"],
    "training_s": round(stages.get("warm_start", 0.0) + stages.get("training", 0.0), 1),
  }


def main(_):
  F = flags.FLAGS
  raw = os.path.join(F.data, "raw_data")
  label_texts = xc_format.read_texts(os.path.join(raw, "label.raw.txt"))
  L = len(label_texts)
  rng = np.random.default_rng(F.seed)
  held = np.sort(rng.choice(L, round(F.holdout * L), replace=False))
  keep = np.setdiff1d(np.arange(L), held)
  derived = os.path.join(F.work, "data_without")
  if not os.path.exists(os.path.join(derived, "tst_X_Y.txt")):
    derived_dataset(F.data, derived, keep)
  before_wd = os.path.join(F.work, "before")
  train_s = _train(F, derived, before_wd)
  t0 = time.time()
  report = grow.grow_model(before_wd, [label_texts[i] for i in held], os.path.join(F.work, "grown"))
  grow_s = time.time() - t0

  train_labels = xc_format.read_sparse(os.path.join(F.data, "trn_X_Y.txt"), L)
  test = xc_format.read_sparse(os.path.join(F.data, "tst_X_Y.txt"), L)
  test_texts = xc_format.read_texts(os.path.join(raw, "test.raw.txt"))
  inv_prop = metrics.inverse_propensity(train_labels, F.propensity_A, F.propensity_B)
  is_held = np.zeros(L, bool)
  is_held[held] = True
  with_held = [i for i in range(test.num_rows) if is_held[test.row(i)].any()]
  others = SparseRows.from_lists([[j for j in r if not is_held[j]] for r in _rows(test)], L)

  before = Predictor.from_workdir(before_wd, index="exact")
  grown = Predictor.from_workdir(os.path.join(F.work, "grown"), index="exact")
  to_original = {"before": keep, "grown": np.concatenate([keep, held]), "retrain": np.arange(L)}
  predictors = [("before", before), ("grown", grown)]
  seconds = {"before": train_s, "grow": {"total_s": round(grow_s, 2)}}
  if F.few_shot_epochs:
    few_wd = os.path.join(F.work, f"few_shot_{F.few_shot_epochs}")
    update = (f"train.init_from={os.path.join(F.work, 'grown')}", "warmstart.epochs=0")
    update += (f"train.epochs={F.few_shot_epochs}", "negatives.tau_s=0", "negatives.tau_r=1")
    seconds["few_shot"] = _train(F, F.data, few_wd, update + ("train.eval_every_epochs=0",))
    predictors.append(("few_shot", Predictor.from_workdir(few_wd, index="exact")))
    to_original["few_shot"] = np.arange(L)
  if F.retrain:
    retrain_wd = os.path.join(F.work, "retrain")
    seconds["retrain"] = _train(F, F.data, retrain_wd)
    predictors.append(("retrain", Predictor.from_workdir(retrain_wd, index="exact")))
  preds = {}
  for name, p in predictors:
    ids = p.predict(test_texts, k=K).ids
    preds[name] = np.where(ids >= 0, to_original[name][np.maximum(ids, 0)], -1)
  grown_texts = [label_texts[i] for i in to_original["grown"]]
  preds["text_alone"] = to_original["grown"][text_alone(grown, test_texts, grown_texts)]
  row = {
    "data": os.path.abspath(F.data),
    "config": F.config,
    "num_labels": L,
    "held_out_labels": len(held),
    "test_rows": test.num_rows,
    "test_rows_with_held_out_label": len(with_held),
    "seconds": seconds,
    "map_fit_labels": report.fit_labels,
    "map_fit_r2": round(report.fit_r2, 4),
  }
  for name, pred in preds.items():
    row[name] = {
      "all_rows": scores(pred, test, inv_prop),
      "rows_with_held_out_label": scores(pred, test, inv_prop, with_held),
      "other_labels_P@1": scores(pred, others, inv_prop)["P@1"],
    }
  jsonl.emit(row, F.out)


if __name__ == "__main__":
  app.run(main)
