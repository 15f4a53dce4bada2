r"""Precision of the served predictions, ScaNN against exact, on a trained model's test split.

  python benchmarks/serve_quality.py --workdir=workdir/demo [--out=serve_quality.json]

Reads the test texts and labels of the dataset the model was trained on (its saved config),
predicts them from text with `Predictor` twice (exact, ScaNN with the default or given
knobs) and scores both with the training evaluation's metrics (filter file applied). Also
reports training's own final test metrics (results.json) next to the exact path's, which
should agree: the same tokenization, encoder and W. Writes one JSON object.
"""

import dataclasses
import json
import os
import time

from absl import app, flags

from astra_jax.data import dataset, xc_format, xc_lines
from astra_jax.evaluation import metrics
from astra_jax.serving.predictor import Predictor

flags.DEFINE_string("workdir", None, "training workdir with model/")
flags.DEFINE_integer("k", 5, "metrics at 1, 3 and this")
flags.DEFINE_integer("max_rows", 0, "first rows of the test split only (0: all)")
flags.DEFINE_string("scann_knobs", "", "e.g. leaves_to_search=32,reorder=100 (default: scaled)")
flags.DEFINE_string("out", None, "write the JSON here too")
flags.mark_flags_as_required(["workdir"])


def test_split(cfg: dict, n: int):
  d, dc = cfg["data"]["dir"], cfg["data"]
  layout = dc["layout"] if dc["layout"] != "auto" else dataset.detect_layout(d)
  texts = xc_format.read_texts(
    os.path.join(d, dataset.LAYOUTS[layout][1]), "auto", dc["use_content"]
  )
  if layout == "json":
    num_labels = sum(
      1 for _ in xc_lines.numbered_lines(os.path.join(d, dataset.LAYOUTS["json"][2]))
    )
    truth = xc_format.read_json_labels(os.path.join(d, dataset.LAYOUTS["json"][1]), num_labels)
  else:
    truth = xc_format.read_sparse(os.path.join(d, "tst_X_Y.txt"))
  filt_path = dataset.filter_file_path(d, dc["filter_file"])
  filt = xc_format.read_filter(filt_path, truth.num_rows, truth.num_cols) if filt_path else None
  n = n or len(texts)
  if filt is not None:
    filt = filt[filt[:, 0] < n]
  return texts[:n], truth.head(min(n, truth.num_rows)), filt


def evaluate(predictor, texts, truth, filt, k: int) -> dict:
  extra = metrics.max_filtered_per_row(filt) if filt is not None else 0
  t0 = time.time()
  out = predictor.predict(texts, k + extra)
  seconds = time.time() - t0
  ids = metrics.remove_filtered(out.ids, filt, k) if filt is not None else out.ids[:, :k]
  m = metrics.as_percent(metrics.compute(ids, truth, ks=tuple(sorted({1, 3, k}))))
  return {"metrics": m, "queries_per_s": round(len(texts) / seconds, 1), "ids": ids}


def main(_):
  F = flags.FLAGS
  with open(os.path.join(F.workdir, "model", "config.json")) as f:
    cfg = json.load(f)
  texts, truth, filt = test_split(cfg, F.max_rows)
  knobs = {k: int(v) for k, v in (kv.split("=") for kv in F.scann_knobs.split(",") if kv)}
  exact = evaluate(Predictor.from_workdir(F.workdir, "exact"), texts, truth, filt, F.k)
  p = Predictor.from_workdir(F.workdir, "scann", scann_knobs=knobs)
  scann = evaluate(p, texts, truth, filt, F.k)
  overlap = (exact["ids"][:, :, None] == scann["ids"][:, None, :]).any(-1).mean()
  res_path = os.path.join(F.workdir, "results.json")
  trained = None
  if os.path.exists(res_path):
    with open(res_path) as f:
      trained = {k: v for k, v in json.load(f)["metrics"].items() if k.startswith(("P@", "nDCG@"))}
  result = {
    "workdir": os.path.abspath(F.workdir),
    "num_test": len(texts),
    "k": F.k,
    "num_labels": len(p.model.classifier),
    "scann_params": dataclasses.asdict(p.index.index.params),
    "exact": {k: v for k, v in exact.items() if k != "ids"},
    "scann": {k: v for k, v in scann.items() if k != "ids"},
    "scann_minus_exact": {
      k: round(scann["metrics"][k] - exact["metrics"][k], 3) for k in exact["metrics"]
    },
    f"overlap@{F.k}": round(float(overlap), 4),
    "training_final_eval": trained,
  }
  text = json.dumps(result, indent=1)
  print(text)
  if F.out:
    with open(F.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  app.run(main)
