r"""A real extreme-classification dataset from a Debian binary index: what a package depends on.

  apt-cache dumpavail > avail.txt
  PYTHONPATH=. python benchmarks/make_debian_depends.py --avail=avail.txt --out=DIR

A data point is a binary package's `name: short description`; its labels are the packages
it depends on (`Depends` and `Pre-Depends`; the first alternative of each group, version
and architecture qualifiers stripped; the package itself left out), restricted to packages
of the index; a label's text is that package's `name: short description`. Rows with no
label are dropped, 30% of the rows are the test split (seed 0), and the files are the
raw-text layout of the other datasets (`raw_data/{train,test,label}.raw.txt`,
`trn_X_Y.txt`, `tst_X_Y.txt`).

It is a third dataset of Debian's package graph beside debian-recommends and
debian-builddeps, built from whatever index the machine has: an index is a release and a
day, so the dataset is the index it was built from.
"""

from __future__ import annotations

import re

from absl import app, flags

from astra_jax.data import xc_format

_FIELDS = ("Pre-Depends", "Depends")
_NAME_END = re.compile(r"[\s(:\[<]")


def parse_index(path: str) -> dict[str, dict[str, str]]:
  """Each package's fields from a `dumpavail` file; a name's first stanza wins.

  Args:
    path: the output of `apt-cache dumpavail` (RFC 822 stanzas, blank-line separated).

  Returns:
    The fields of each package, keyed by its name; a field's continuation lines follow its
    first line, one per line.
  """
  packages: dict[str, dict[str, str]] = {}
  stanza: dict[str, str] = {}
  key = None
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in list(f) + ["\n"]:
      line = line.rstrip("\n")
      if not line:
        if "Package" in stanza:
          packages.setdefault(stanza["Package"], stanza)
        stanza, key = {}, None
      elif line[0] in " \t":
        if key:
          stanza[key] += "\n" + line.strip()
      else:
        key, _, value = line.partition(":")
        stanza[key] = value.strip()
  return packages


def dependencies(stanza: dict[str, str]) -> set[str]:
  """The packages a stanza depends on: each group's first alternative, qualifiers stripped."""
  out = set()
  for field in _FIELDS:
    for group in stanza.get(field, "").replace("\n", " ").split(","):
      first = group.split("|")[0].strip()
      if first:
        out.add(_NAME_END.split(first, 1)[0])
  return out


def _text(name: str, stanza: dict[str, str]) -> str:
  # The first line of a description is the short one; the long one follows it when the
  # index carries it (a binary index usually leaves it to its translation files).
  short = stanza.get("Description", "").split("\n", 1)[0]
  return f"{name}: {' '.join(short.split())}"


def build(avail: str, out: str) -> None:
  """Writes the dataset (module docstring) to `out`."""
  packages = parse_index(avail)
  points = []
  for name in sorted(packages):
    labels = sorted(d for d in dependencies(packages[name]) if d in packages and d != name)
    if labels:
      points.append((_text(name, packages[name]), labels))
  label_texts = {name: _text(name, packages[name]) for _, names in points for name in names}
  train, test, num_labels = xc_format.write_raw_dataset(out, points, label_texts)
  print(f"{out}: {train} train / {test} test points, {num_labels} labels")


def main(argv):
  del argv
  build(flags.FLAGS.avail, flags.FLAGS.out)


if __name__ == "__main__":
  flags.DEFINE_string("avail", None, "the output of `apt-cache dumpavail`")
  flags.DEFINE_string("out", None, "the dataset's folder")
  flags.mark_flags_as_required(["avail", "out"])
  app.run(main)
