"""The sizes every part of a plan reads, derived once from the config, the dataset's size
and the nodes' layout."""

from __future__ import annotations

import dataclasses
import math

from astra_jax.data import catalog, validation
from astra_jax.model.architectures import DTYPE_BYTES
from astra_jax.negatives.schedule import NegativeSchedule
from astra_jax.plan.inputs import encoder_param_count, encoder_shape
from astra_jax.plan.records import DataSize, NodeLayout


@dataclasses.dataclass(frozen=True)
class Quantities:
  """The sizes a plan's parts share, named as the formulas in the plan's items name them.

  Attributes:
    enc, enc_source: the encoder's shape and where it came from (inputs.encoder_shape).
    P, d: the encoder's parameters and E(x)'s width.
    L, rows: labels, and training rows the loop iterates over.
    D, M, G: the mesh's data and model axes and its devices.
    A, B, micro: accumulation steps, the global batch and one micro-batch.
    b_enc, b_clf: queries per device in the encoder and in the classifier kernel.
    schedule, k_p, k_h, k_r, mined: the negatives: positives, hard and random columns per
      W shard once hard negatives exist, and the columns a refresh mines.
    T, s: tokens per text and the compute dtype's bytes.
    dense: whether the classifier update is the dense one.
    R: W rows per shard (padded to a multiple of M).
    S, Pn: W shards per process and processes per node.
    index_kind: the refresh index ("exact" or "scann").
    ds: the paper's dataset record, when the config names one.
    lpp, num_test, nnz, test_nnz: labels per point, test rows, and the training and test
      rows' positives (None / 0 when unknown).
    token_rows: rows tokenized (training, label texts, test).
    own_rows: training rows a process mines for (its data groups' share).
    negatives_own: bytes of a process's hard negatives.
    collection: bytes of the collected query embeddings.
    nnz_file, label_cache_bytes: the label cache's positives and bytes.
    num_train: the training rows of the data's files (before any validation split).
  """

  enc: object
  enc_source: str
  P: int
  d: int
  L: int
  rows: int
  D: int
  M: int
  G: int
  A: int
  B: int
  micro: int
  b_enc: int
  b_clf: int
  schedule: NegativeSchedule
  k_p: int
  k_h: int
  k_r: int
  mined: int
  T: int
  s: int
  dense: bool
  R: int
  S: int
  Pn: int
  index_kind: str
  ds: catalog.PaperDataset | None
  lpp: float | None
  num_test: int
  nnz: int | None
  test_nnz: int
  token_rows: int
  own_rows: int
  negatives_own: int
  collection: int
  nnz_file: int
  label_cache_bytes: int
  num_train: int


def quantities(config, data: DataSize, layout: NodeLayout | None) -> tuple[Quantities, NodeLayout]:
  """The plan's shared sizes, and the layout (default: one node, one process per device)."""
  enc, enc_source = encoder_shape(config)
  P = encoder_param_count(enc)
  d = enc.embed_dim
  L, rows = data.num_labels, data.rows
  D, M = config.mesh.data, config.mesh.model
  G = D * M
  A = max(1, config.train.get("grad_accum_steps", 1))
  B = config.train.batch_size
  micro = B // A  # queries per micro-batch, all devices
  b_enc = math.ceil(micro / G)  # encoder: the micro-batch split over every device
  b_clf = math.ceil(micro / D)  # classifier kernel: the queries of one 'data' group
  nc = config.negatives
  schedule = NegativeSchedule.from_config(config)
  # Per W shard: the step's hard and random columns once hard negatives exist (the
  # curricula's widest split, w_hard / e_hard all hard) and the columns a refresh mines.
  k_p, (k_h, k_r) = nc.k_p, schedule.columns(nc.tau_s, have_hard=True)
  mined = schedule.mined_k() if schedule.uses_index else 0
  T = config.data.max_len
  s = DTYPE_BYTES[enc.dtype]
  dense = config.optim.classifier_update == "dense" or schedule.strategy.dense_update_only
  R = -(-L // M)  # W rows per shard (padded to a multiple of M)
  # Host, per process: one process per `layout.gpus_per_process` devices holds the W shards
  # of its devices (sharding.local_model_shards; 'model' is the mesh's minor axis, inside a
  # node) and mines for them in its own refresh worker, one shard's index at a time.
  layout = layout or NodeLayout(G, G, G)
  S = min(M, layout.gpus_per_process)  # W shards per process
  Pn = layout.processes_per_node
  index_kind = nc.index.kind if nc.index.kind != "auto" else ("exact" if R <= 50_000 else "scann")
  ds = catalog.DATASETS.get(config.data.get("name", ""))
  lpp = (
    config.data.synthetic.mean_labels
    if config.data.synthetic.enabled
    else ds.labels_per_point
    if ds
    else None
  )
  num_test = (
    config.data.synthetic.num_test if config.data.synthetic.enabled else ds.num_test if ds else 0
  )
  nnz = int(data.num_train * lpp) + (rows - data.num_train) if lpp else None
  # Its data groups' share of the training rows (pipeline.data_group_bounds): the rows it
  # mines for and holds negatives of.
  groups = max(1, layout.gpus_per_process // M)
  own_rows = -(-rows * min(groups, D) // D)
  negatives_own = own_rows * S * mined * 4
  collection = rows * d * 4
  # The label matrix is the label cache's memmaps (label_cache): the training processes
  # and workers of a node share one page-cache copy; the label-text rows are not stored.
  n_file, nnz_file = data.num_train + 1, (int(data.num_train * lpp) if lpp else 0)
  label_cache_bytes = n_file * 8 + nnz_file * 4 + L * 4
  q = Quantities(
    enc=enc,
    enc_source=enc_source,
    P=P,
    d=d,
    L=L,
    rows=rows,
    D=D,
    M=M,
    G=G,
    A=A,
    B=B,
    micro=micro,
    b_enc=b_enc,
    b_clf=b_clf,
    schedule=schedule,
    k_p=k_p,
    k_h=k_h,
    k_r=k_r,
    mined=mined,
    T=T,
    s=s,
    dense=dense,
    R=R,
    S=S,
    Pn=Pn,
    index_kind=index_kind,
    ds=ds,
    lpp=lpp,
    num_test=num_test,
    nnz=nnz,
    test_nnz=int(num_test * lpp) if lpp else 0,
    token_rows=rows + num_test,
    own_rows=own_rows,
    negatives_own=negatives_own,
    collection=collection,
    nnz_file=nnz_file,
    label_cache_bytes=label_cache_bytes,
    num_train=data.num_train,
  )
  return q, layout


def split_rows(q: Quantities, data_config) -> tuple[int, int]:
  """(kept, held-out) original training rows of the validation split `data_config` names
  (`data.validation_*`, data/validation.py); (num_train, 0) without one."""
  held_out = validation.SplitSpec.from_config(data_config).held_out(q.num_train)
  return q.num_train - held_out, held_out
