r"""How growing a trained model scales with the number of new labels.

  python benchmarks/grow_scaling.py --workdir=WD --new_labels=2e3,2e4,2e5 --out=grow_scaling.jsonl

WD holds an exported model with label texts. For each N, N new label texts are made from the
model's own (label i's text with " variant j" appended, so every one is new and reads like a
label of the same catalogue), and the model is grown with them into a temporary workdir
(serving/grow.py). One JSON line per N: old and new label counts, the grow's seconds (the
encoder pass over the fitted and the new texts, the ridge fit, the copy of W and the
export), and seconds per 1,000 new labels.
"""

import tempfile

import jsonl  # benchmarks/jsonl.py
from absl import app, flags

from astra_jax.serving import export, grow

flags.DEFINE_string("workdir", None, "a workdir with an exported model")
flags.DEFINE_list("new_labels", ["2e3", "2e4", "2e5"], "new label counts")
flags.DEFINE_string("out", None, "append JSON lines here")
flags.mark_flags_as_required(["workdir"])


def main(_):
  F = flags.FLAGS
  old = export.load_model(F.workdir).label_texts
  for n in (int(float(x)) for x in F.new_labels):
    texts = [f"{old[i % len(old)]} variant {i // len(old) + 1}" for i in range(n)]
    with tempfile.TemporaryDirectory() as out:
      report = grow.grow_model(F.workdir, texts, out)
    jsonl.emit(
      {
        "old_labels": report.old_labels,
        "new_labels": n,
        "fit_labels": report.fit_labels,
        "grow_s": report.seconds,
        "s_per_1000_new": round(1000 * report.seconds / n, 3),
      },
      F.out,
    )


if __name__ == "__main__":
  app.run(main)
