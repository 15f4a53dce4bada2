"""The XC libraries a user tries first, run on one dataset beside the model: PECOS
XR-Linear, Parabel and Bonsai (omikuji) and napkinXC's PLT.

Every peer trains on the same features, word 1-2-gram and char_wb 2-4-gram TF-IDF of the
texts (sublinear term frequencies, each row L2-normalised), with its authors' recommended
settings (`peer_runner.py` lists them), and its top 100 labels per test row are scored by
the project's own rank -> filter -> score path, so the filter, the metrics and the
propensities are the model's. docs/baselines.md has the protocol and what it measured.

The peers run in an environment of their own, started as a subprocess: libpecos 1.2.8 pins
numpy < 2 and scipy < 1.14, which jax 0.10 cannot share. `make peers` builds it
(.venv-peers); `--peers_python` or $ASTRA_PEERS_PYTHON names another.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile

import numpy as np
from absl import logging

from astra_jax.runtime import cpu_budget
from astra_jax.runtime.errors import InputError
from astra_jax.xc import lexical

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_runner.py")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS_VENV = ".venv-peers"
RANKED = 100  # labels a peer ranks per test row, as the evaluators ask of the model


@dataclasses.dataclass(frozen=True)
class Peer:
  """One peer method.

  Attributes:
    name: its key in `--methods` and in peer_runner.METHODS.
    title: how tables name it.
    library: the package and version that trains it.
  """

  name: str
  title: str
  library: str


PEERS = {
  p.name: p
  for p in (
    Peer("xrlinear", "PECOS XR-Linear", "libpecos 1.2.8"),
    Peer("parabel", "Parabel", "omikuji 0.5.2"),
    Peer("bonsai", "Bonsai", "omikuji 0.5.2"),
    Peer("plt", "napkinXC PLT", "napkinxc 0.7.2"),
  )
}


@dataclasses.dataclass(frozen=True)
class PeerRanking:
  """What a peer returned: its ranking of the test rows and what it cost.

  Attributes:
    top: (n_test, RANKED) int32 label ids, best first, -1 where it ranked fewer.
    train_seconds: wall seconds of training, the tree or index build included.
    predict_seconds: wall seconds of ranking every test row.
  """

  top: np.ndarray
  train_seconds: float
  predict_seconds: float


def features(train_texts: list[str], test_texts: list[str]):
  """The peers' shared features: [word 1-2-gram TF-IDF | char_wb 2-4-gram TF-IDF] of each
  text, each block L2-normalised, then the row (scipy CSR float32; vocabularies from the
  training texts): the lexical score terms' (xc/lexical.TfidfFeatures).

  Returns:
    (X_train, X_test).
  """
  fitted, train = lexical.TfidfFeatures.fit_transform(train_texts)
  return train, fitted(test_texts)


def peers_python(explicit: str = "") -> str:
  """The interpreter of the peers' environment.

  Args:
    explicit: a path given on the command line ("" for the default).
  Returns:
    `explicit`, else $ASTRA_PEERS_PYTHON, else .venv-peers/bin/python in the working
    directory or the repository.
  Raises:
    InputError: none of them exists (the message says how to build it).
  """
  candidates = [explicit] if explicit else []
  if not explicit and os.environ.get("ASTRA_PEERS_PYTHON"):
    candidates = [os.environ["ASTRA_PEERS_PYTHON"]]
  if not candidates:
    candidates = [
      os.path.join(root, PEERS_VENV, "bin", "python") for root in (os.getcwd(), REPO_ROOT)
    ]
  for path in candidates:
    if os.path.exists(path):
      return path
  raise InputError(
    f"the peer methods run in their own environment, and there is none at {candidates[0]}: "
    f"`make peers` builds {PEERS_VENV} (libpecos pins numpy<2 and scipy<1.14, which jax "
    "cannot use), or name one with --peers_python / $ASTRA_PEERS_PYTHON"
  )


def rank(
  names: list[str],
  train_texts: list[str],
  train_labels,
  test_texts: list[str],
  python: str,
  threads: int = 0,
) -> dict[str, PeerRanking]:
  """Trains each named peer and ranks the test rows with it, one peer at a time.

  Args:
    names: keys of PEERS.
    train_texts: the training rows' texts.
    train_labels: their labels (SparseRows).
    test_texts: the texts to rank labels for.
    python: the peers' interpreter (`peers_python`).
    threads: threads per peer (0: the task's CPUs).
  Returns:
    {name: PeerRanking}.
  Raises:
    RuntimeError: a peer's process failed (its stderr's last lines are in the message).
  """
  import scipy.sparse as sp

  unknown = sorted(set(names) - set(PEERS))
  if unknown:
    raise InputError(f"unknown peer method(s) {unknown}; the peers are {sorted(PEERS)}")
  threads = threads or cpu_budget.task_cpus()
  x_train, x_test = features(train_texts, test_texts)
  y = sp.csr_matrix(
    (np.ones(train_labels.nnz, np.float32), train_labels.indices, train_labels.indptr),
    shape=(train_labels.num_rows, train_labels.num_cols),
  )
  out = {}
  with tempfile.TemporaryDirectory(prefix="astra_peers_") as tmp:
    for name, matrix in (("X_train", x_train), ("X_test", x_test), ("Y_train", y)):
      sp.save_npz(os.path.join(tmp, f"{name}.npz"), matrix, compressed=False)
    for name in names:
      logging.info("peer %s (%s): training on %d rows", name, PEERS[name].library, len(train_texts))
      cmd = [python, RUNNER, f"--method={name}", f"--dir={tmp}", f"--k={RANKED}"]
      done = subprocess.run(
        [*cmd, f"--threads={threads}"],
        env=cpu_budget.thread_environment(threads),
        capture_output=True,
        text=True,
      )
      if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"peer {name} failed (exit {done.returncode}):\n{tail}")
      with open(os.path.join(tmp, f"{name}.json")) as f:
        seconds = json.load(f)
      out[name] = PeerRanking(
        np.load(os.path.join(tmp, f"{name}.top.npy")),
        seconds["train_seconds"],
        seconds["predict_seconds"],
      )
      logging.info(
        "peer %s: trained in %.1f s, ranked in %.1f s",
        name,
        out[name].train_seconds,
        out[name].predict_seconds,
      )
  return out
