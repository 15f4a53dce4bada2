"""Trains one established XC library on prepared features and writes its test rankings.

This file runs in the peers' own environment (`make peers`: .venv-peers), not in
astra_jax's: libpecos 1.2.8 pins numpy < 2 and scipy < 1.14, which jax 0.10 cannot run
with. It therefore imports nothing of astra_jax, only numpy, scipy and the peer's library,
and is started by path (`evaluation/peers.py` does it):

  .venv-peers/bin/python astra_jax/evaluation/peer_runner.py --method=bonsai --dir=DIR

DIR holds what `peers.py` wrote: X_train.npz, X_test.npz (scipy CSR, float32, rows
L2-normalised), Y_train.npz (CSR, the training labels). It writes DIR/METHOD.top.npy,
(n_test, k) int32 label ids best first (-1: fewer predicted), and DIR/METHOD.json with
the train and predict seconds.

Each method's settings are its authors' recommended ones (docs/baselines.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp


def _ranked(scores: sp.csr_matrix, k: int) -> np.ndarray:
  """(n, k) column ids of each CSR row's entries by descending value (-1 padded)."""
  out = np.full((scores.shape[0], k), -1, np.int32)
  for i in range(scores.shape[0]):
    lo, hi = scores.indptr[i], scores.indptr[i + 1]
    order = np.argsort(-scores.data[lo:hi], kind="stable")[:k]
    out[i, : len(order)] = scores.indices[lo:hi][order]
  return out


def xrlinear(x_train, y_train, x_test, k, threads):
  """PECOS XR-Linear: PIFA label features, hierarchical k-means with 16 splits (PECOS's
  README), its default one-vs-rest solver (L2-loss SVM, C = 1, weights below 0.1 pruned),
  beam 20 at prediction."""
  from pecos.xmc import Indexer, LabelEmbeddingFactory
  from pecos.xmc.xlinear.model import XLinearModel

  start = time.perf_counter()
  label_features = LabelEmbeddingFactory.create(y_train, x_train, method="pifa")
  chain = Indexer.gen(
    label_features, indexer_type="hierarchicalkmeans", nr_splits=16, threads=threads
  )
  model = XLinearModel.train(x_train, y_train, C=chain, threads=threads)
  trained = time.perf_counter()
  top = _ranked(model.predict(x_test, beam_size=20, only_topk=k, threads=threads).tocsr(), k)
  return top, trained - start, time.perf_counter() - trained


def _omikuji_file(x, y, path):
  """The XC repository's text format omikuji trains from: `N F L`, then `l,l f:v f:v`."""
  with open(path, "w") as out:
    out.write(f"{x.shape[0]} {x.shape[1]} {y.shape[1]}\n")
    for i in range(x.shape[0]):
      labels = ",".join(map(str, y.indices[y.indptr[i] : y.indptr[i + 1]]))
      lo, hi = x.indptr[i], x.indptr[i + 1]
      feats = " ".join(f"{j}:{v:.7g}" for j, v in zip(x.indices[lo:hi], x.data[lo:hi]))
      out.write(f"{labels} {feats}\n")


def _omikuji(x_train, y_train, x_test, k, threads, bonsai):
  import omikuji

  start = time.perf_counter()
  params = omikuji.Model.default_hyper_param()
  if bonsai:  # omikuji's README: Bonsai is a shallow, wide, unbalanced tree
    params.cluster_k, params.max_depth, params.cluster_balanced = 100, 3, False
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "train.txt")
    _omikuji_file(x_train, y_train, path)
    model = omikuji.Model.train_on_data(path, params, n_threads=threads)
  trained = time.perf_counter()
  top = np.full((x_test.shape[0], k), -1, np.int32)
  for i in range(x_test.shape[0]):
    lo, hi = x_test.indptr[i], x_test.indptr[i + 1]
    pairs = list(zip(x_test.indices[lo:hi].tolist(), x_test.data[lo:hi].tolist()))
    labels = [label for label, _ in model.predict(pairs, top_k=k)]
    top[i, : len(labels)] = labels
  return top, trained - start, time.perf_counter() - trained


def parabel(x_train, y_train, x_test, k, threads):
  """Parabel as omikuji's defaults train it: 3 balanced binary trees, depth up to 20,
  leaves of up to 100 labels, hinge-loss linear nodes (C = 1), weights below 0.1 pruned."""
  return _omikuji(x_train, y_train, x_test, k, threads, bonsai=False)


def bonsai(x_train, y_train, x_test, k, threads):
  """Bonsai as omikuji's README sets it: Parabel's trees, but unbalanced, 100 children
  per node, depth 3."""
  return _omikuji(x_train, y_train, x_test, k, threads, bonsai=True)


def plt(x_train, y_train, x_test, k, threads):
  """napkinXC's PLT with its defaults: a balanced hierarchical k-means tree of arity 2 with
  leaves of up to 100 labels, logistic-loss nodes trained by LIBLINEAR (C = 10), weights
  below 0.1 pruned, exact tree search."""
  from napkinxc.models import PLT

  start = time.perf_counter()
  rows = range(y_train.shape[0])
  labels = [y_train.indices[y_train.indptr[i] : y_train.indptr[i + 1]].tolist() for i in rows]
  with tempfile.TemporaryDirectory() as tmp:
    model = PLT(tmp, threads=threads)
    model.fit(x_train, labels)
    trained = time.perf_counter()
    predicted = model.predict(x_test, top_k=k)
  top = np.full((x_test.shape[0], k), -1, np.int32)
  for i, row in enumerate(predicted):
    top[i, : len(row)] = row[:k]
  return top, trained - start, time.perf_counter() - trained


METHODS = {"xrlinear": xrlinear, "parabel": parabel, "bonsai": bonsai, "plt": plt}


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--method", choices=sorted(METHODS), required=True)
  p.add_argument("--dir", required=True, help="the features peers.py wrote")
  p.add_argument("--k", type=int, default=100, help="labels ranked per test row")
  p.add_argument("--threads", type=int, default=1)
  a = p.parse_args(argv)
  load = lambda name: sp.load_npz(os.path.join(a.dir, name)).tocsr()
  x_train, y_train, x_test = load("X_train.npz"), load("Y_train.npz"), load("X_test.npz")
  top, train_s, predict_s = METHODS[a.method](x_train, y_train, x_test, a.k, a.threads)
  np.save(os.path.join(a.dir, f"{a.method}.top.npy"), top)
  with open(os.path.join(a.dir, f"{a.method}.json"), "w") as out:
    json.dump({"train_seconds": train_s, "predict_seconds": predict_s}, out)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
