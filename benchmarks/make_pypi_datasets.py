r"""Two real extreme-classification datasets from the Python Package Index's metadata.

  PYTHONPATH=. python benchmarks/make_pypi_datasets.py crawl --out=RAW [--sample=45000] [--seed=2]
  PYTHONPATH=. python benchmarks/make_pypi_datasets.py build --raw=RAW --out=DIR

`crawl` draws `--sample` project names from PyPI's simple index (seeded), fetches each
project's JSON metadata (`https://pypi.org/pypi/NAME/json`) and appends its name, summary,
keywords and requirements to `RAW/projects.jsonl`; then it fetches the
packages those projects require, for their summaries (the label texts), into
`RAW/labels.jsonl`. Both files are appended to line by line, so an interrupted crawl
resumes where it stopped. PyPI changes every day: a dataset is the crawl it was built from.

`build` writes two datasets in the raw-text layout (`raw_data/{train,test,label}.raw.txt`,
`trn_X_Y.txt`, `tst_X_Y.txt`; 30% of the rows as the test split, seed 0):

- `DIR/pypi-requires`: a data point is a project's `name: summary`; its labels are the
  projects it requires (`Requires-Dist` without an `extra` marker, names normalised as
  PEP 503 says), restricted to projects PyPI knows; a label's text is its `name: summary`.
  A package graph like the Debian datasets', but another ecosystem's.
- `DIR/pypi-keywords`: the same data points; the labels are their authors' keywords
  (split on commas, else on spaces; lower-cased), those that at least two projects use; a
  label's text is the keyword. A tagging task: no package graph.

Rows with an empty summary or no label are dropped.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from absl import app, flags

from astra_jax.data import xc_format

_FIELDS = ("name", "summary", "keywords", "requires_dist")
_LIST_PUNCTUATION = " \"'[](){}"
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalise(name: str) -> str:
  """A project name as PEP 503 compares them (the PEP's own function)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str | None:
  """The project a `Requires-Dist` entry requires; None for an optional (`extra`) one."""
  spec, _, marker = requirement.partition(";")
  if "extra" in marker:
    return None
  m = _REQUIREMENT.match(spec)
  return normalise(m.group(1)) if m else None


def keyword_labels(keywords: str | None) -> list[str]:
  """An author's keywords as labels: split on commas if it has any, else on spaces."""
  if not keywords:
    return []
  parts = keywords.split(",") if "," in keywords else keywords.split()
  # Some authors write a Python list ("['cli', 'web']"): its quotes and brackets go.
  out = {" ".join(p.lower().split()).strip(_LIST_PUNCTUATION) for p in parts}
  return sorted(k for k in out if len(k) <= 40 and any(c.isalnum() for c in k))


def _fetch(name: str) -> dict | None:
  for attempt in range(3):
    try:
      with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=30) as r:
        info = json.load(r)["info"]
      return {k: info.get(k) for k in _FIELDS}
    except urllib.error.HTTPError as e:
      if e.code == 404:
        return None
    except (OSError, ValueError):
      pass
    time.sleep(1 + attempt)
  return None


def _done(path: str) -> set[str]:
  if not os.path.exists(path):
    return set()
  with open(path) as f:
    return {json.loads(line)["query"] for line in f}


def _crawl(names: list[str], path: str, threads: int) -> None:
  todo = [n for n in names if n not in _done(path)]
  start = time.time()
  with open(path, "a") as out, ThreadPoolExecutor(threads) as pool:
    for i, (name, record) in enumerate(zip(todo, pool.map(_fetch, todo))):
      out.write(json.dumps({"query": name, "info": record}) + "\n")
      if (i + 1) % 2000 == 0:
        out.flush()
        print(f"{path}: {i + 1}/{len(todo)} in {time.time() - start:.0f}s", flush=True)


def _read(path: str) -> dict[str, dict]:
  with open(path) as f:
    records = (json.loads(line) for line in f)
    return {normalise(r["info"]["name"]): r["info"] for r in records if r["info"]}


def crawl(out: str, sample: int, seed: int, threads: int) -> None:
  """The `crawl` command (module docstring)."""
  os.makedirs(out, exist_ok=True)
  with urllib.request.urlopen("https://pypi.org/simple/", timeout=120) as r:
    names = re.findall(r'href="([^"/]+)/"', r.read().decode())
  random.Random(seed).shuffle(names)
  _crawl(sorted(names[:sample]), os.path.join(out, "projects.jsonl"), threads)
  projects = _read(os.path.join(out, "projects.jsonl"))
  wanted = {
    n for p in projects.values() for r in p.get("requires_dist") or () if (n := requirement_name(r))
  }
  _crawl(sorted(wanted - set(projects)), os.path.join(out, "labels.jsonl"), threads)


def _text(info: dict) -> str | None:
  summary = " ".join((info.get("summary") or "").split())
  return f"{normalise(info['name'])}: {summary}" if summary else None


def _write(outdir: str, points: list[tuple[str, list[str]]], label_text: dict[str, str]) -> None:
  train, test, labels = xc_format.write_raw_dataset(outdir, points, label_text)
  print(f"{outdir}: {train} train / {test} test points, {labels} labels")


def build(raw: str, out: str) -> None:
  """The `build` command (module docstring)."""
  projects = _read(os.path.join(raw, "projects.jsonl"))
  known = {**_read(os.path.join(raw, "labels.jsonl")), **projects}
  requires, keywords = [], []
  for name in sorted(projects):
    info = projects[name]
    text = _text(info)
    if text is None:
      continue
    deps = {requirement_name(r) for r in info.get("requires_dist") or ()}
    deps = sorted(d for d in deps if d and d != name and d in known)
    if deps:
      requires.append((text, deps))
    keywords.append((text, keyword_labels(info.get("keywords"))))
  counts: dict[str, int] = {}
  for _, ks in keywords:
    for k in ks:
      counts[k] = counts.get(k, 0) + 1
  keywords = [(t, [k for k in ks if counts[k] >= 2]) for t, ks in keywords]
  keywords = [(t, ks) for t, ks in keywords if ks]
  dep_text = {n: _text(i) or normalise(i["name"]) for n, i in known.items()}
  _write(os.path.join(out, "pypi-requires"), requires, dep_text)
  _write(os.path.join(out, "pypi-keywords"), keywords, {k: k for k in counts})


def _define_flags() -> None:
  # Defined when run, not on import: the tests import this module beside other scripts of
  # benchmarks/ that define flags of the same names.
  flags.DEFINE_string("out", None, "crawl: the raw folder; build: the datasets' parent folder")
  flags.DEFINE_string("raw", None, "build: the crawl's folder")
  flags.DEFINE_integer("sample", 45000, "crawl: project names drawn from the simple index")
  flags.DEFINE_integer("seed", 2, "crawl: the draw's seed")
  flags.DEFINE_integer("threads", 24, "crawl: concurrent requests")
  flags.mark_flag_as_required("out")


def main(argv):
  if len(argv) != 2 or argv[1] not in ("crawl", "build"):
    raise app.UsageError("usage: make_pypi_datasets.py crawl|build (see the docstring)")
  f = flags.FLAGS
  if argv[1] == "crawl":
    crawl(f.out, f.sample, f.seed, f.threads)
  else:
    build(f.raw, f.out)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
