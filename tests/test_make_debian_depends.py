"""benchmarks/make_debian_depends.py: a hand-written `dumpavail` file and the dataset it
must give."""

import os

from benchmark_import import benchmark_module

from astra_jax.data import xc_format

tool = benchmark_module("make_debian_depends")

_AVAIL = """\
Package: app
Version: 1.0
Depends: libc6 (>= 2.34), libfoo1 | libfoo-alt,
 app, missing-pkg
Pre-Depends: dpkg (>= 1.15)
Description: an application
 whose long description is not in the index

Package: libc6
Description: GNU C Library:
  Shared libraries

Package: libfoo1
Depends: libc6:any
Description: foo library

Package: dpkg
Description: package manager

Package: libfoo1
Depends: dpkg
Description: a second stanza of the same name, which the first one wins over
"""


def test_dependencies_take_each_groups_first_alternative_without_qualifiers():
  stanza = {"Depends": "a (>= 1), b:any | c, d [amd64], e<!nocheck>", "Pre-Depends": "f"}
  assert tool.dependencies(stanza) == {"a", "b", "d", "e", "f"}
  assert tool.dependencies({}) == set()


def test_build_writes_each_package_with_the_packages_it_depends_on(tmp_path):
  avail = tmp_path / "avail.txt"
  avail.write_text(_AVAIL)
  tool.build(str(avail), str(tmp_path / "d"))
  rows = {}
  d = tmp_path / "d"
  names = xc_format.read_texts(os.path.join(d, "raw_data", "label.raw.txt"))
  for split, short in (("train", "trn"), ("test", "tst")):
    texts = xc_format.read_texts(os.path.join(d, "raw_data", f"{split}.raw.txt"))
    y = xc_format.read_sparse(os.path.join(d, f"{short}_X_Y.txt"))
    rows.update({t: sorted(names[j] for j in y.row(i)) for i, t in enumerate(texts)})
  # The package itself and a package the index lacks are not labels; libc6 and dpkg
  # depend on nothing, so they are no data points; the first libfoo1 stanza is the one read.
  assert rows == {
    "app: an application": [
      "dpkg: package manager",
      "libc6: GNU C Library:",
      "libfoo1: foo library",
    ],
    "libfoo1: foo library": ["libc6: GNU C Library:"],
  }
