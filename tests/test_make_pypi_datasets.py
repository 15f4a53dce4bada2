"""benchmarks/make_pypi_datasets.py: requirement and keyword parsing by hand-checked cases,
and `build` on a tiny crawl written here (no network)."""

import json
import os

from benchmark_import import benchmark_module

from astra_jax.data import xc_format


def _tool():
  return benchmark_module("make_pypi_datasets")


def test_requirement_name_normalises_and_drops_extras():
  tool = _tool()
  assert tool.requirement_name("Requests (>=2.0)") == "requests"
  assert tool.requirement_name("zope.interface>=5; python_version < '3.8'") == "zope-interface"
  assert tool.requirement_name("typing_extensions") == "typing-extensions"
  assert tool.requirement_name("pytest; extra == 'test'") is None
  assert tool.requirement_name("  ") is None


def test_keyword_labels_split_on_commas_else_spaces():
  tool = _tool()
  assert tool.keyword_labels("Machine Learning, NLP ,nlp") == ["machine learning", "nlp"]
  assert tool.keyword_labels("cli  Tools") == ["cli", "tools"]
  assert tool.keyword_labels(None) == []
  assert tool.keyword_labels("x" * 41) == []
  assert tool.keyword_labels("['html', 'line_profiler', -]") == ["html", "line_profiler"]


def _write_crawl(raw):
  projects = [
    ("alpha", "first tool", "cli, web", ["requests", "pytest; extra == 'test'", "Alpha"]),
    ("beta", "second tool", "web", ["requests", "Not_Known"]),
    ("gamma", "", "solo", ["requests"]),  # no summary: dropped from both datasets
    ("delta", "fourth tool", "cli solo", []),
  ]
  os.makedirs(raw)
  with open(os.path.join(raw, "projects.jsonl"), "w") as f:
    for name, summary, keywords, requires in projects:
      info = {"name": name, "summary": summary, "keywords": keywords, "requires_dist": requires}
      f.write(json.dumps({"query": name, "info": info}) + "\n")
  with open(os.path.join(raw, "labels.jsonl"), "w") as f:
    f.write(
      json.dumps({"query": "requests", "info": {"name": "Requests", "summary": "HTTP"}}) + "\n"
    )
    f.write(json.dumps({"query": "not-known", "info": None}) + "\n")


def _dataset(d):
  texts, labels = [], []
  for split, short in (("train", "trn"), ("test", "tst")):
    texts += xc_format.read_texts(os.path.join(d, "raw_data", f"{split}.raw.txt"))
    y = xc_format.read_sparse(os.path.join(d, f"{short}_X_Y.txt"))
    labels += [list(y.row(i)) for i in range(y.num_rows)]
  names = xc_format.read_texts(os.path.join(d, "raw_data", "label.raw.txt"))
  return {t: sorted(names[j] for j in ls) for t, ls in zip(texts, labels)}


def test_build_writes_both_datasets(tmp_path):
  tool = _tool()
  raw = str(tmp_path / "raw")
  _write_crawl(raw)
  tool.build(raw, str(tmp_path))
  # Self-requirements, optional ones and projects PyPI does not know are not labels.
  assert _dataset(tmp_path / "pypi-requires") == {
    "alpha: first tool": ["requests: HTTP"],
    "beta: second tool": ["requests: HTTP"],
  }
  # A keyword only one kept project uses goes ("solo": gamma, which uses it too, is dropped).
  assert _dataset(tmp_path / "pypi-keywords") == {
    "alpha: first tool": ["cli", "web"],
    "beta: second tool": ["web"],
    "delta: fourth tool": ["cli"],
  }
