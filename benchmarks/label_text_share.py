r"""How much of a trained model's accuracy the label texts alone carry.

  PYTHONPATH=. python benchmarks/label_text_share.py \
      --workdirs=workdir/reproduce/scale0.01_epochs15/full --out=label_text_share.jsonl

For each finished run: test P@1 / P@5 ranking labels by the classifiers, w_l.E(x), and by
the label texts under the same trained encoder, E(z_l).E(x) (no classifier: what a
dual encoder scores), and their P@1 ratio. On the real LF-AmazonTitles-131K text-only dual
encoders reach 0.91-0.97 of ASTRA's P@1 (the paper's tab:dualencoder); a stand-in whose
ratio is above 1 is one where label texts say all there is to learn, and an index on label
embeddings is then as aligned with the loss as one on the classifiers.
One JSON line per workdir: workdir, data_dir, classifier_P@1, classifier_P@5,
label_text_P@1, label_text_P@5, ratio_P@1.
"""

import json
import os

import jsonl  # benchmarks/jsonl.py
import numpy as np
from absl import app, flags

from astra_jax.evaluation import baselines, metrics
from astra_jax.serving.predictor import Predictor

flags.DEFINE_list(
  "workdirs",
  None,
  "finished runs (each holding model/ and config.json) on data with label texts, in any "
  "layout training reads (renee, ngame, json)",
)
flags.DEFINE_string("out", None, "append JSON lines here")


def ranked(queries: np.ndarray, rows: np.ndarray, filter_pairs: np.ndarray) -> np.ndarray:
  """Top 5 labels per query by dot product, the filter file's pairs removed first."""
  k = min(5 + metrics.max_filtered_per_row(filter_pairs), len(rows))
  out = np.empty((len(queries), k), np.int64)
  for start in range(0, len(queries), 1024):  # (1024, L) scores at a time
    scores = queries[start : start + 1024] @ rows.T
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
    out[start : start + 1024] = np.take_along_axis(top, order, 1)
  return metrics.remove_filtered(out, filter_pairs, 5)


def measure(workdir: str) -> dict:
  with open(os.path.join(workdir, "config.json")) as f:
    data = json.load(f)["data"]
  d = data["dir"]  # as training read it: relative to the directory it ran in
  texts = baselines.load_texts(
    d, use_content=data.get("use_content", False), filter_self=data.get("filter_self", "off")
  )
  if texts.label_texts is None:
    raise ValueError(f"{d}: no label texts to rank by")
  p = Predictor.from_workdir(workdir, index="exact")
  queries = p.encode(p.to_tokens(texts.test_texts)[0])
  labels = p.encode(p.to_tokens(texts.label_texts)[0])
  row = {"workdir": workdir, "data_dir": d}
  for name, rows in (("classifier", np.asarray(p.model.classifier)), ("label_text", labels)):
    ranked_ids = ranked(queries, rows, texts.test_filter)
    m = metrics.as_percent(metrics.compute(ranked_ids, texts.test_labels, ks=(1, 5)))
    row[f"{name}_P@1"], row[f"{name}_P@5"] = m["P@1"], m["P@5"]
  row["ratio_P@1"] = row["label_text_P@1"] / max(row["classifier_P@1"], 1e-9)
  return row


def main(_):
  for wd in flags.FLAGS.workdirs:
    jsonl.emit(measure(wd), flags.FLAGS.out, digits=3)


if __name__ == "__main__":
  flags.mark_flag_as_required("workdirs")
  app.run(main)
