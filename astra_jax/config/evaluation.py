"""The evaluation fields (`config.eval`): periodic and final evaluations, their search and
diagnostics."""

from __future__ import annotations

import ml_collections

from astra_jax.config.require import require


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the sections `eval` with their defaults."""
  c.eval = ml_collections.ConfigDict()
  c.eval.ks = (1, 3, 5)
  c.eval.batch_size = 1024
  c.eval.label_block = 32768
  c.eval.max_test_rows = 0  # 0: all; >0 evaluates the first rows only (periodic evals)
  # The final evaluation records its progress every this many test rows (rows done and the
  # metrics' partial sums), so that a preempted run resumes it instead of starting over.
  c.eval.progress_rows = 65536
  # 0: the final evaluation scores every test row; > 0: the first this many only (smoke runs
  # at a huge L), said in a warning, results.json's num_test_evaluated and "degraded".
  c.eval.final_max_rows = 0
  # exact: the final evaluation ranks over all of W; scann: also through the exported
  # model's serving index (results.json's "ann_eval"; docs/evaluation.md).
  c.eval.search = "exact"
  # > 0: beside each evaluation, P@k of a k-NN vote over the encoder's embeddings of the
  # training rows with this many neighbours (evaluation/knn.py); 0: off.
  c.eval.knn_diagnostic = 0
  # With a fused score (scoring.label_text_weight > 0), also report each evaluation's P@k by
  # W alone ("W-alone P@k"): one more evaluation pass each time.
  c.eval.classifier_alone = False
  # results.json: the TF-IDF kNN baseline beside popularity (evaluation/baselines.py; needs
  # scikit-learn, skipped without it).
  c.eval.tfidf_baseline = False
  # results.json's "peer_baselines": the XC libraries of evaluation/peers.py, comma-separated
  # (xrlinear,parabel,bonsai,plt), trained on the run's training rows and scored like the
  # model on its test split; they need the peers' environment (`make peers`). "": none.
  c.eval.peers = ""


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field of `eval`."""
  require(c.eval.progress_rows >= 1, "eval.progress_rows", "must be >= 1")
  require(c.eval.final_max_rows >= 0, "eval.final_max_rows", "must be >= 0 (0: every test row)")
  require(
    c.eval.search in ("exact", "scann"),
    "eval.search",
    f"must be exact or scann, got {c.eval.search!r}",
  )
  require(c.eval.knn_diagnostic >= 0, "eval.knn_diagnostic", "must be >= 0")
  from astra_jax.evaluation.peers import PEERS  # jax-free

  unknown = sorted({m for m in c.eval.peers.split(",") if m} - set(PEERS))
  require(not unknown, "eval.peers", f"unknown {unknown}; the peers are {sorted(PEERS)}")
