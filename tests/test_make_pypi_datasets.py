"""benchmarks/make_pypi_datasets.py: requirement and keyword parsing by hand-checked cases,
and `build` on a tiny crawl written here (no network)."""

import json
import os

from benchmark_import import benchmark_module

from astra_jax.data import xc_format

tool = benchmark_module("make_pypi_datasets")


def test_requirement_name_normalises_and_drops_extras():
  assert tool.requirement_name("Requests (>=2.0)") == "requests"
  assert tool.requirement_name("zope.interface>=5; python_version < '3.8'") == "zope-interface"
  assert tool.requirement_name("typing_extensions") == "typing-extensions"
  assert tool.requirement_name("pytest; extra == 'test'") is None
  assert tool.requirement_name("  ") is None


def test_keyword_labels_split_on_commas_else_spaces():
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


def test_build_holds_out_30_percent_of_the_rows_as_the_test_split(tmp_path):
  raw = tmp_path / "raw"
  os.makedirs(raw)
  with open(raw / "projects.jsonl", "w") as f:
    for i in range(10):
      info = {"name": f"p{i}", "summary": f"tool {i}", "keywords": "web", "requires_dist": []}
      f.write(json.dumps({"query": f"p{i}", "info": info}) + "\n")
  (raw / "labels.jsonl").write_text("")
  tool.build(str(raw), str(tmp_path))
  d = tmp_path / "pypi-keywords" / "raw_data"
  train = xc_format.read_texts(d / "train.raw.txt")
  test = xc_format.read_texts(d / "test.raw.txt")
  assert (len(train), len(test)) == (7, 3)
  assert sorted(train + test) == sorted(f"p{i}: tool {i}" for i in range(10))
