"""Metric tables as the command-line tools print them (training's results, the evaluator)."""

from __future__ import annotations

from collections.abc import Mapping

METRICS = ("P", "nDCG", "PSP", "PSnDCG")


def format_table(rows: Mapping[str, Mapping[str, float]], ks: tuple[int, ...] = (1, 3, 5)) -> str:
  """A fixed-width table: one row per method, one column per metric@k any row has.

  Args:
    rows: method name -> {"P@1": value, ...} (x100).
    ks: the cut-offs, in column order within each metric.
  Returns:
    The table's lines joined by newlines (a missing value prints as nan).
  """
  cols = [f"{m}@{k}" for m in METRICS for k in ks]
  cols = [c for c in cols if any(c in r for r in rows.values())]
  width = max(len(n) for n in rows) + 2
  lines = ["".ljust(width) + "".join(c.rjust(10) for c in cols)]
  for name, r in rows.items():
    lines.append(name.ljust(width) + "".join(f"{r.get(c, float('nan')):10.2f}" for c in cols))
  return "\n".join(lines)


def format_results(results: Mapping, results_path: str) -> str:
  """What `python -m astra_jax.main` prints after training: the run in one line, the
  metrics beside the baselines results.json holds, and where results.json is.

  Args:
    results: train.train_and_evaluate's results.
    results_path: where they were written.
  Returns:
    The text, starting with an empty line.
  """
  rows = {"astra_jax": results["metrics"]}
  if "ann_eval" in results:  # eval.search=scann: every test row through the serving index
    rows["astra_jax, ANN index"] = results["ann_eval"]["metrics"]
  rows["label popularity"] = results["popularity_baseline"]
  if "tfidf_knn_baseline" in results:
    rows["TF-IDF kNN"] = results["tfidf_knn_baseline"]
  if "tfidf_label_text_baseline" in results:
    rows["TF-IDF label text"] = results["tfidf_label_text_baseline"]
  rows.update(results.get("peer_baselines", {}))  # eval.peers: the XC libraries
  for prefix, name in (
    ("W-alone ", "W alone (no label-text term)"),  # eval.classifier_alone
    ("kNN-E ", "kNN over own E(x)"),  # eval.knn_diagnostic: a kNN vote instead of W
  ):
    part = {k[len(prefix) :]: v for k, v in results["metrics"].items() if k.startswith(prefix)}
    if part:
      rows[name] = part
  return "\n".join(
    [
      "",
      f"{results['num_labels']} labels, {results['num_train']} train / {results['num_test']} "
      f"test rows, {results['epochs']} epochs in {results['train_time_s']:.0f}s "
      f"(strategy {results['strategy']})",
      format_table(rows),
      f"\nresults: {results_path}",
    ]
  )
