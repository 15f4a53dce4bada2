"""Memory plan of a training run: what each device, process, node and disk must hold.

Per device: W's shard, the classifier's optimizer state, the encoder's parameters, Adam
moments and gradients, the encoder's activations for one micro-batch, the classifier step's
temporaries; compared with what XLA can use (90% of the GPU's memory; set
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, JAX's default is 0.75), with fixes when it does not fit.
Per node (one process per GPU as launch/slurm.sbatch runs, or 1 as launch/single_node.sh):
the peak of preparation (label parse, tokenization: one builder per node, from the per-row
costs benchmarks/data_scale.py measured); every training process's and every refresh
worker's resident memory, with the files a node maps (label cache, token memmaps) counted
once and each process's own memmaps (negatives in use, negatives being mined) once per
process, the collected query embeddings once (one file every process reads); and disk for
every file the run writes (caches, refresh inputs, negatives generations, checkpoints x
keep, export).

Nothing here imports jax or the model code: sizes come from the config, the encoder's
config.json (or the tiny-BERT fields), the tokenizer's vocabulary, the header of
trn_X_Y.txt when the data is on disk, else `config.data.num_labels` / `num_train` (the
paper's table for the dataset configs). The numbers are estimates of what the arrays need
(XLA's buffer assignment can differ by tens of percent on activations); byte counts of
parameters, optimizer state and W are exact (tests/test_plan.py checks them against jax).
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import math
import os

from astra_jax.ann import grouped_index
from astra_jax.config import paper_configs
from astra_jax.data import catalog, synthetic
from astra_jax.model import architectures, pretrained
from astra_jax.model.encoder_config import EncoderConfig
from astra_jax.negatives.schedule import NegativeSchedule
from astra_jax.runtime.errors import InputError

GiB = 2**30
# Memory per device (TPU chips too, for the TPU VM recipe in launch/README.md).
GPUS = {
  "v100-32gb": 32 * GiB,
  "v100-16gb": 16 * GiB,
  "a100-40gb": 40 * GiB,
  "a100-80gb": 80 * GiB,
  "h100-80gb": 80 * GiB,
  "h200-141gb": 141 * GiB,
  "tpu-v4-32gb": 32 * GiB,
  "tpu-v5e-16gb": 16 * GiB,
  "tpu-v5p-95gb": 95 * GiB,
}
USABLE_FRACTION = 0.9
DTYPE_BYTES = architectures.DTYPE_BYTES
XLA_OVERHEAD = architectures.XLA_OVERHEAD  # see architectures.bert_activation_bytes

# Preparation, measured by benchmarks/data_scale.py (SS-20M's label statistics, README
# "Data at SS-20M / SS-120M size"): the label parse's anonymous memory is bounded by its
# 16 MB blocks (0.63 GB at 10^6 rows, 0.72 GB at 10^7) and tokenization's by its batches of
# 8192 texts (0.14-0.15 GB); per CPU second the parse reads 64 MB of label text and the
# tokenizer turns 20,000 32-token texts into ids (a word-level tokenizer: WordPiece is
# slower).
PARSE_PEAK_BYTES = 720 * 10**6
TOKENIZE_PEAK_BYTES = 150 * 10**6
PARSE_BYTES_PER_CPU_S = 64 * 10**6
TOKENIZE_ROWS_PER_CPU_S = 20_000
# "id:1 " per positive: the id's digits + 4 bytes of separators and value on average
# (12.4 bytes with SS-20M's 8-digit ids, measured).
LABEL_TEXT_SEPARATOR_BYTES = 4
# Negatives files a process has on disk at most: the one in use and the one being mined
# (negatives/manager.py runs one worker at a time and deletes the file replaced at the swap).
NEGATIVES_GENERATIONS = 2


@dataclasses.dataclass
class Item:
  name: str
  bytes: int
  formula: str = ""
  paged: bool = False  # a memmap: in the page cache when hot, not counted as resident


@dataclasses.dataclass
class DataSize:
  num_labels: int
  num_train: int  # training rows before label-text augmentation
  rows: int  # training rows the loop iterates over (+ label texts)
  source: str


@dataclasses.dataclass(frozen=True)
class NodeLayout:
  """How the devices are spread over nodes and processes."""

  num_gpus: int
  gpus_per_node: int
  processes_per_node: int

  @property
  def nodes(self) -> int:
    return self.num_gpus // self.gpus_per_node

  @property
  def gpus_per_process(self) -> int:
    return self.gpus_per_node // self.processes_per_node


@dataclasses.dataclass
class Plan:
  config_name: str
  data: DataSize
  encoder: dict
  mesh: dict
  batch: dict
  negatives: dict
  gpu: str
  device_items: list[Item]
  worker_items: list[Item]  # host RAM of a refresh worker process
  trainer_items: list[Item]  # host RAM of a training process
  disk_items: list[Item]  # every file the run writes (one node's share of its processes')
  notes: list[str]
  node: dict = dataclasses.field(default_factory=dict)  # NodeLayout + shards per process
  prep_items: list[Item] = dataclasses.field(default_factory=list)  # a node's preparation
  node_items: list[Item] = dataclasses.field(default_factory=list)  # a node's RAM in training
  prep_seconds: dict = dataclasses.field(default_factory=dict)
  suggestions: list[str] = dataclasses.field(default_factory=list)

  @property
  def node_total(self) -> int:
    return sum(i.bytes for i in self.node_items)

  @property
  def prep_peak(self) -> int:
    """A node's preparation: one builder, its phases one after the other."""
    return max((i.bytes for i in self.prep_items), default=0)

  @property
  def disk_total(self) -> int:
    return sum(i.bytes for i in self.disk_items)

  @property
  def device_total(self) -> int:
    return sum(i.bytes for i in self.device_items)

  @property
  def usable(self) -> int:
    return int(GPUS[self.gpu] * USABLE_FRACTION)

  @property
  def fits(self) -> bool:
    return self.device_total <= self.usable

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    out.update(
      device_total=self.device_total,
      usable=self.usable,
      fits=self.fits,
      headroom=self.usable - self.device_total,
      worker_resident=resident(self.worker_items),
      trainer_resident=resident(self.trainer_items),
      node_total=self.node_total,
      node_resident=resident(self.node_items),
      prep_peak=self.prep_peak,
      disk_total=self.disk_total,
    )
    return out


def resident(items: list[Item]) -> int:
  return sum(i.bytes for i in items if not i.paged)


# ------------------------------------------------------------------------------ inputs
def data_size(config) -> DataSize:
  """L and N: the synthetic spec, the label matrix's header on disk, or the config's
  dataset statistics."""
  dc = config.data
  aug = bool(dc.augment_label_text)
  if dc.synthetic.enabled:
    s = dc.synthetic
    return DataSize(
      s.num_labels, s.num_train, s.num_train + (s.num_labels if aug else 0), "synthetic spec"
    )
  header = os.path.join(dc.dir, "trn_X_Y.txt")
  if dc.dir and os.path.exists(header):
    with open(header) as f:
      parts = f.readline().split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
      n, L = int(parts[0]), int(parts[1])
      return DataSize(L, n, n + (L if aug else 0), f"{header} header")
  if dc.get("num_labels", 0) and dc.get("num_train", 0):
    return DataSize(
      dc.num_labels,
      dc.num_train,
      dc.num_train + (dc.num_labels if aug else 0),
      "config.data.num_labels/num_train (data not on disk)",
    )
  lbl, trn = (os.path.join(dc.dir, f) for f in ("lbl.json.gz", "trn.json.gz"))
  if dc.dir and os.path.exists(lbl) and os.path.exists(trn):
    L, n = _count_lines(lbl), _count_lines(trn)
    return DataSize(L, n, n + (L if aug else 0), "lines of lbl.json.gz / trn.json.gz")
  raise InputError(
    f"the size of the dataset in {dc.dir!r} is unknown (not on disk): set "
    f"--config.data.num_labels=L --config.data.num_train=N"
  )


def _count_lines(path: str) -> int:
  with gzip.open(path, "rb") as f:
    return sum(1 for _ in f)


def tokenizer_vocab(tokenizer_dir: str) -> int | None:
  """len(tokenizer) without loading transformers: vocab.txt lines, or tokenizer.json's
  vocabulary plus added tokens."""
  vocab_txt, tok_json = (os.path.join(tokenizer_dir, f) for f in ("vocab.txt", "tokenizer.json"))
  if os.path.exists(tok_json):
    with open(tok_json) as f:
      tok = json.load(f)
    ids = set(tok.get("model", {}).get("vocab", {}).values())
    ids |= {t["id"] for t in tok.get("added_tokens", [])}
    return len(ids)
  if os.path.exists(vocab_txt):
    with open(vocab_txt) as f:
      return sum(1 for _ in f)
  return None


def encoder_shape(config):
  """The encoder shape factory.build_encoder would build, and where it came from."""
  ec = config.encoder
  arch = architectures.get(ec.get("arch", "bert"))
  hf_dir = pretrained.resolve(ec.hf_dir) if ec.hf_dir else ""
  published = paper_configs.PAPER_ENCODER_SHAPES.get(ec.get("paper_encoder", ""))
  if (
    arch is architectures.BERT
    and hf_dir
    and published
    and not os.path.exists(os.path.join(hf_dir, "config.json"))
  ):
    # Training would stop (encoder_source.check); the plan uses the published shape.
    common = dict(
      bottleneck_dim=ec.bottleneck_dim, embedding_dropout=ec.embedding_dropout, dtype=ec.dtype
    )
    return EncoderConfig.from_hf(published, **common), f"{ec.paper_encoder} (published shape)"
  if arch is architectures.BERT and hf_dir:
    return arch.shape_from_config(config, 0, 0), hf_dir
  if config.data.synthetic.enabled:
    spec = synthetic.spec_from_config(config.data.synthetic)
    vocab, source = synthetic.num_words(spec) + len(synthetic.SPECIAL_TOKENS), "synthetic"
  else:
    tok_dir = pretrained.resolve(config.data.tokenizer_dir) if config.data.tokenizer_dir else ""
    vocab = tokenizer_vocab(tok_dir) if tok_dir and os.path.isdir(tok_dir) else None
    source = tok_dir
    if vocab is None:
      vocab, source = 30522, "assumed (no tokenizer found)"
  shape = arch.shape_from_config(config, vocab, 0)
  what = "tiny random BERT" if arch is architectures.BERT else f"{arch.name} encoder"
  return shape, f"{what} (config.encoder fields; vocabulary: {source})"


def encoder_param_count(e) -> int:
  """Parameters of the encoder of shape `e`, exactly (its architecture's count)."""
  return architectures.of_shape(e).param_count(e)


def activation_bytes(e, b: int, T: int) -> tuple[int, str]:
  """Bytes the encoder of shape `e` keeps for its backward pass on b queries of T tokens
  (its architecture's estimate; BERT's is `architectures.bert_activation_bytes`)."""
  return architectures.of_shape(e).activation_bytes(e, b, T)


# -------------------------------------------------------------------------------- plan
def make_plan(
  config,
  gpu: str,
  data: DataSize | None = None,
  config_name: str = "",
  layout: NodeLayout | None = None,
) -> Plan:
  """The plan for `config` as it stands (mesh included).

  Args:
    config: the experiment config, its mesh set.
    gpu: a key of GPUS.
    data: the dataset's size (default: data_size(config)).
    config_name: the name printed.
    layout: nodes and processes (default: one node, one process per device).
  Returns:
    The Plan."""
  data = data or data_size(config)
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
  notes = []

  dev = [Item(f"W shard ({R:,} rows x {d}, fp32)", R * d * 4, "ceil(L / model) x d x 4")]
  if dense:
    mom = L * d * 4 if config.optim.classifier_momentum else 0
    dev.append(Item("classifier optimizer state (dense SGD momentum)", mom, "L x d x 4"))
  elif config.optim.classifier_momentum:
    # sparse_momentum.py: a velocity per W row (sharded like W) and the step each row is
    # current at; its tree of per-step 2 x 2 matrices (16 bytes x 2 x steps per epoch) is
    # left out: under 100 MB up to 3M steps per epoch.
    dev.append(
      Item(
        "classifier optimizer state (sparse momentum: velocity + step per row)",
        R * d * 4 + R * 4,
        "ceil(L / model) x (d + 1) x 4",
      )
    )
  else:
    dev.append(Item("classifier optimizer state (sparse: one scale, one step)", 8, "2 x 4"))
  dev += [
    Item(f"encoder parameters ({P / 1e6:.1f}M, fp32, replicated)", 4 * P, "P x 4"),
    Item("Adam m, v (fp32)", 8 * P, "2 x P x 4"),
    Item(
      "encoder gradients" + (" + accumulation buffer" if A > 1 else ""),
      4 * P * (2 if A > 1 else 1),
      "P x 4" + (" x 2" if A > 1 else ""),
    ),
  ]
  if s != 4:
    dev.append(Item(f"parameters cast to {enc.dtype}", s * P, f"P x {s}"))
  act, act_formula = activation_bytes(enc, b_enc, T)
  layers = getattr(enc, "num_layers", None)  # architecture-specific (a transformer's)
  dev.append(
    Item(
      f"encoder activations ({b_enc} queries x {T} tokens"
      + (f", {layers} layers)" if layers else f", {enc.model_type})"),
      act,
      act_formula,
    )
  )
  if dense:
    dev.append(Item("dense W gradient + update", 2 * L * d * 4, "2 x L x d x 4"))
    if schedule.strategy.mined_in_step:
      dev.append(Item("scores over all labels (uptodate)", micro * L * 4, "B x L x 4"))
    elif schedule.strategy.full_loss:
      blk = config.train.full_label_block
      dev.append(
        Item("full-L blocks (scores, recomputed)", 3 * micro * blk * 4, "3 x B x block x 4")
      )
  kk = k_p + k_h + k_r
  # Rows gathered per query: k_p + k_h, + k_r with per-query draws; a shared draw of k_r
  # serves the batch.
  per_query = nc.random_draws == "per_query"
  k_row, k_once, k_txt = (
    (k_p + k_h + k_r, 0, "k_p + k_h + k_r") if per_query else (k_p + k_h, k_r, "k_p + k_h")
  )
  gathered = (b_clf * k_row + k_once) * d * 4
  scores = b_clf * kk * (4 + 4 + 1)
  # Row gradients are all-gathered over 'data' (every replica of a shard applies the same
  # update) and kept for all A micro-batches in factored form: per (query, row) an id and
  # dloss/dscore, per query its embedding (classifier.classifier_grads). The update forms one
  # micro-batch's (rows, d) gradients at a time, scaled for the scatter: x 2.
  kept = B * k_row * 8 + B * d * 4 + A * k_once * (d * 4 + 4)
  formed = 2 * (micro * k_row + k_once) * d * 4
  once = " + k_r" if k_once else ""
  if not dense:
    dev.append(
      Item(
        "classifier step: gathered rows + scores, their grads, masks",
        gathered + scores + 2 * b_clf * d * 4,
        f"(B_g ({k_txt}){once}) d 4 + B_g (k_p + k_h + k_r) 9 + 2 B_g d 4",
      )
    )
    dev.append(
      Item(
        "classifier step: row gradients, factored (all micro-batches)",
        kept,
        f"B ({k_txt}) (4 + 4) + B d 4{' + A k_r (d 4 + 4)' if k_once else ''}",
      )
    )
    dev.append(
      Item(
        "classifier update: one micro-batch's row gradients",
        formed,
        f"2 x (B/A ({k_txt}){once}) x d x 4",
      )
    )

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
  if index_kind == "scann":
    # A grouped build (negatives.index.group_rows) holds each row in GROUP_SPILL groups.
    copies = grouped_index.GROUP_SPILL if nc.index.group_rows else 1
    worker = [
      Item(
        f"ANN index, one shard (ScaNN: fp32 copy + codes, 2x {copies * R:,} rows"
        + (f", each row in {copies} groups)" if copies > 1 else ")"),
        2 * copies * R * d * 4,
        f"2 x {copies} x W shard" if copies > 1 else "2 x W shard",
      )
    ]
  else:
    worker = [
      Item(
        f"exact index ({R:,} rows + one 4096-query score block)",
        R * d * 4 + 4096 * R * 4 * 2,
        "W shard + 2 x 4096 x rows x 4",
      )
    ]
  # Its data groups' share of the training rows (pipeline.data_group_bounds): the rows it
  # mines for and holds negatives of.
  groups = max(1, layout.gpus_per_process // M)
  own_rows = -(-rows * min(groups, D) // D)
  negatives_own = own_rows * S * mined * 4
  collection = rows * d * 4
  worker += [
    Item("W snapshot of one shard (loaded)", R * d * 4, "W shard"),
    Item(
      f"mined hard negatives being written ({own_rows:,} x {S} x {mined} int32)",
      negatives_own,
      "N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      f"query embeddings (the run's one file, {rows:,} x {d} fp32)",
      collection,
      "N x d x 4",
      paged=True,
    ),
  ]
  trainer = [
    Item(
      f"W rows of its {S} shard(s) copied for a refresh's snapshot",
      S * R * d * 4,
      "shards per process x W shard",
    ),
    Item(
      f"hard negatives in use ({own_rows:,} x {S} x {mined} int32)",
      negatives_own,
      "N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      f"query embeddings being collected ({rows:,} x {d} fp32, process 0 writes them)",
      collection,
      "N x d x 4",
      paged=True,
    ),
  ]
  tokens = Item(
    f"token memmaps ({rows:,} training rows x {T} int32)", rows * T * 4, "N x T x 4", paged=True
  )
  trainer.insert(0, tokens)
  # The label matrix is the label cache's memmaps (label_cache): the training processes
  # and workers of a node share one page-cache copy; the label-text rows are not stored.
  n_file, nnz_file = data.num_train + 1, (int(data.num_train * lpp) if lpp else 0)
  label_cache_bytes = n_file * 8 + nnz_file * 4 + L * 4
  label_cache = Item(
    f"training label matrix (label cache, ~{nnz_file:,} pairs)",
    label_cache_bytes,
    "(N + 1) x 8 + nnz x 4 + L x 4",
    paged=True,
  )
  if nnz:
    worker.append(
      dataclasses.replace(
        label_cache, name=f"training positives (label cache, ~{nnz_file:,} pairs)"
      )
    )
    trainer.insert(0, label_cache)
  else:
    notes.append(
      "the label matrix is not counted (labels per point unknown): its cache, "
      "(N + 1) x 8 + nnz x 4 + L x 4 bytes, is mapped once per node"
    )

  # A node in training: each process's and worker's own memory, each process's own files,
  # and the files every process maps (label cache, token memmaps) once.
  per = f"x {Pn} process{'es' if Pn > 1 else ''}"
  node_items = [
    Item(
      f"training processes' resident memory ({per})",
      Pn * resident(trainer),
      "processes per node x the process's resident",
    ),
    Item(
      f"refresh workers' resident memory ({per})",
      Pn * resident(worker),
      "processes per node x the worker's resident",
    ),
    Item("token memmaps (once per node)", tokens.bytes, tokens.formula, paged=True),
  ]
  if nnz:
    node_items.append(
      Item("label cache (once per node)", label_cache_bytes, label_cache.formula, paged=True)
    )
  node_items += [
    Item(
      f"hard negatives in use ({per})",
      Pn * negatives_own,
      "processes x N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      f"hard negatives being mined ({per})",
      Pn * negatives_own,
      "processes x N x its data groups / data x shards per process x k_mined x 4",
      paged=True,
    ),
    Item(
      "query-embedding collection (one file for every process)", collection, "N x d x 4", paged=True
    ),
  ]

  # Preparation (prepare, or the first process of a node under the caches' lock): one
  # builder per node, the label files parsed, then the texts tokenized.
  test_nnz = int(num_test * lpp) if lpp else 0
  text_bytes = (nnz_file + test_nnz) * (len(str(max(L - 1, 1))) + LABEL_TEXT_SEPARATOR_BYTES)
  token_rows = rows + num_test
  # The phases run one after the other: the peak is the larger (Plan.prep_peak).
  prep_items = [
    Item("label parse (16 MB blocks), measured", PARSE_PEAK_BYTES, "bounded by the block"),
    Item(
      "tokenization (batches of 8192 texts), measured", TOKENIZE_PEAK_BYTES, "bounded by the batch"
    ),
  ]
  prep_seconds = {
    "label_text_bytes": text_bytes,
    "parse_cpu_s": round(text_bytes / PARSE_BYTES_PER_CPU_S),
    "tokenize_rows": token_rows,
    "tokenize_cpu_s": round(token_rows / TOKENIZE_ROWS_PER_CPU_S),
  }

  # Disk: the caches (beside the data, once), the refresh files of each process (the
  # inputs of the refresh last consumed stay beside those being collected: a resume reruns
  # it), the negatives generations, the checkpoints and the export.
  test_cache = (num_test + 1) * 8 + test_nnz * 4
  state = (
    4 * P
    + 8 * P
    + padded_rows(L, M) * d * 4
    + (padded_rows(L, M) * (d + 1) * 4 if config.optim.classifier_momentum else 0)
  )
  keep = config.checkpoint.keep
  disk = [
    Item(
      f"token memmaps ({token_rows:,} rows x {T} int32: train, label texts, test)",
      token_rows * T * 4,
      "(N + test) x T x 4",
    )
  ]
  if nnz:
    disk.append(
      Item(
        "label caches (training + test labels)",
        label_cache_bytes + test_cache,
        "(N + 1) x 8 + nnz x 4 + L x 4, and the test rows'",
      )
    )
  disk += [
    Item(
      f"refresh inputs, 2 refreshes' (the embeddings once, W snapshots {per})",
      2 * (collection + Pn * S * R * d * 4),
      "2 x (N x d x 4 + processes x shards per process x W shard)",
    ),
    Item(
      f"hard negatives, {NEGATIVES_GENERATIONS} generations: in use + being mined ({per})",
      Pn * NEGATIVES_GENERATIONS * negatives_own,
      f"processes x {NEGATIVES_GENERATIONS} x N x its data groups / data"
      " x shards per process x k_mined x 4",
    ),
    Item(
      f"checkpoints: the last {keep}, the best by P@5, one being written",
      (keep + 2) * state,
      "(keep + 2) x (P x 12 + L x d x 4 [+ momentum L x (d + 1) x 4])",
    ),
    Item(
      "export (encoder + W; + tokenizer and label texts)", 4 * P + L * d * 4, "P x 4 + L x d x 4"
    ),
  ]
  if layout.nodes > 1:
    notes.append(
      f"{layout.nodes} nodes: the caches, checkpoints and export are written once "
      f"(shared storage); each node's processes write the per-process files above"
    )
  if layout.nodes * Pn > M // S:
    notes.append(
      f"{layout.nodes * Pn} processes for {M // S} distinct group(s) of W shards: "
      f"the processes holding the same shards (data replicas) divide their queries, "
      f"each mining {own_rows:,} of the {rows:,} rows"
    )
  if S > 1:
    notes.append(
      f"a refresh worker mines for its process's {S} W shards ({R:,} rows each), "
      f"one index at a time"
    )
  if ds and not ds.public and not config.data.synthetic.enabled:
    notes.append(
      f"{ds.name} is proprietary: this plans the real dataset's size; its "
      f"synthetic stand-in is {ds.config}:synthetic"
    )
  if ec_note := _encoder_note(config, enc_source):
    notes.append(ec_note)

  return Plan(
    config_name=config_name or config.data.get("name", ""),
    data=data,
    encoder={
      "source": enc_source,
      "model_type": enc.model_type,
      "params": P,
      "hidden": enc.hidden_size,
      "layers": getattr(enc, "num_layers", None),
      "heads": getattr(enc, "num_heads", None),
      "ffn": getattr(enc, "intermediate_size", None),
      "vocab": getattr(enc, "vocab_size", None),
      "d": d,
      "dtype": enc.dtype,
    },
    mesh={"data": D, "model": M, "devices": G},
    batch={
      "global": B,
      "grad_accum_steps": A,
      "micro_batch": micro,
      "encoder_queries_per_device": b_enc,
      "classifier_queries_per_device": b_clf,
      "max_len": T,
    },
    negatives={
      "k_p": k_p,
      "k_h_per_shard": k_h,
      "k_r_per_shard": k_r,
      "shards": M,
      "random_draws": nc.random_draws,
      "index": index_kind,
      "dense_update": dense,
    },
    gpu=gpu,
    device_items=dev,
    worker_items=worker,
    trainer_items=trainer,
    disk_items=disk,
    notes=notes,
    node={**dataclasses.asdict(layout), "nodes": layout.nodes, "shards_per_process": S},
    prep_items=prep_items,
    node_items=node_items,
    prep_seconds=prep_seconds,
  )


def padded_rows(L: int, model: int) -> int:
  """W's rows padded to a multiple of the 'model' axis (sharding.padded_rows)."""
  return -(-L // model) * model


def _encoder_note(config, source: str) -> str:
  want = config.encoder.get("paper_encoder", "")
  if want and source.endswith("(published shape)"):
    return (
      f"the paper's encoder {want} is not in {config.encoder.hf_dir}: planned with its "
      f"published shape; training needs its files there (or "
      f"--config.encoder.hf_dir=all-MiniLM-L6-v2, see astra_jax/config/paper_configs.py)"
    )
  if want and config.encoder.hf_dir == "all-MiniLM-L6-v2":
    return f"planned with all-MiniLM-L6-v2 as asked, not the paper's encoder {want}"
  return ""


# ------------------------------------------------------------------------- suggestions
def suggest(config, gpu: str, data: DataSize) -> list[str]:
  """Changes that make a plan fit, tried one kind at a time on copies of the config."""
  out = []
  D, M = config.mesh.data, config.mesh.model
  G, B = D * M, config.train.batch_size
  A = max(1, config.train.get("grad_accum_steps", 1))

  def fits(**changes) -> Plan | None:
    c = copy.deepcopy(config)
    with c.unlocked():
      for key, value in changes.items():
        section, field = key.split("__")
        c[section][field] = value
    p = make_plan(c, gpu, data)
    return p if p.fits else None

  for a in range(A + 1, B // G + 1):
    if B % (a * G) == 0 and (p := fits(train__grad_accum_steps=a)):
      out.append(
        f"gradient accumulation: --config.train.grad_accum_steps={a} "
        f"({p.device_total / GiB:.1f} GiB per device)"
      )
      break
  m = M * 2
  while m <= 1024:
    if G % m == 0 and (p := fits(mesh__data=G // m, mesh__model=m)):
      out.append(
        f"more W shards on the same {G} devices: --mesh={G // m}x{m} "
        f"({p.device_total / GiB:.1f} GiB per device)"
      )
      break
    if G % m and (p := fits(mesh__data=1, mesh__model=m)):
      out.append(
        f"more devices for W's shards: --num_gpus={m} --mesh=1x{m} "
        f"({p.device_total / GiB:.1f} GiB per device)"
      )
      break
    m *= 2
  if not config.encoder.bottleneck_dim and (p := fits(encoder__bottleneck_dim=64)):
    out.append(
      f"a bottleneck to d=64 (as the paper does for very large L): "
      f"--config.encoder.bottleneck_dim=64 ({p.device_total / GiB:.1f} GiB per device)"
    )
  if config.encoder.dtype == "float32":
    low = "float16" if gpu.startswith("v100") else "bfloat16"
    if p := fits(encoder__dtype=low):
      out.append(
        f"{low} compute: --config.encoder.dtype={low} ({p.device_total / GiB:.1f} GiB per device)"
      )
  return out or ["nothing single fits: combine the above, or add GPUs"]


# ------------------------------------------------------------------------- the mesh
def resolve_mesh(config, mesh: str, num_gpus: int) -> tuple[int, int]:
  """--mesh DATAxMODEL and --num_gpus against config.mesh (data=-1: every device)."""
  data, model = config.mesh.data, config.mesh.model
  if mesh:
    try:
      data, model = (int(x) for x in mesh.lower().split("x"))
    except ValueError:
      raise InputError(f"--mesh={mesh!r}: expected DATAxMODEL, e.g. 1x8") from None
  if num_gpus:
    if data == -1 or not mesh:
      if num_gpus % model:
        raise InputError(f"--num_gpus={num_gpus} is not a multiple of mesh.model={model}")
      data = num_gpus // model
    elif data * model != num_gpus:
      raise InputError(f"--mesh={mesh} is {data * model} devices, --num_gpus={num_gpus}")
  elif data == -1:
    raise InputError("config.mesh.data=-1 takes every device: say how many with --num_gpus=N")
  if data < 1 or model < 1:
    raise InputError(f"mesh {data}x{model}: both axes must be >= 1")
  return data, model


def resolve_layout(devices: int, gpus_per_node: int, processes_per_node: int) -> NodeLayout:
  """--gpus_per_node (default: every device on one node) and --processes_per_node (default:
  one per GPU, as launch/slurm.sbatch starts them)."""
  g = gpus_per_node or devices
  if devices % g:
    raise InputError(f"--gpus_per_node={g} does not divide the {devices} devices")
  p = processes_per_node or g
  if g % p:
    raise InputError(f"--processes_per_node={p} does not divide --gpus_per_node={g}")
  return NodeLayout(devices, g, p)


def plan_config(
  config,
  gpu: str,
  mesh: str = "",
  num_gpus: int = 0,
  name: str = "",
  gpus_per_node: int = 0,
  processes_per_node: int = 0,
) -> Plan:
  """Applies the mesh to (a copy of) the config, plans, and adds suggestions if needed.

  Args:
    config: the experiment config.
    gpu: a key of GPUS.
    mesh, num_gpus: see resolve_mesh.
    name: the name printed.
    gpus_per_node, processes_per_node: see resolve_layout (0: the defaults).
  Returns:
    The Plan."""
  if gpu not in GPUS:
    raise InputError(f"--gpu={gpu!r}: choose from {', '.join(GPUS)}")
  config = copy.deepcopy(config)
  data, model = resolve_mesh(config, mesh, num_gpus)
  with config.unlocked():
    config.mesh.data, config.mesh.model = data, model  # per-shard k_h/k_r follow (refs)
  layout = resolve_layout(data * model, gpus_per_node, processes_per_node)
  size = data_size(config)
  p = make_plan(config, gpu, size, name, layout)
  if not p.fits:
    p.suggestions = suggest(config, gpu, size)
  return p
