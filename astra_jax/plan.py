"""Memory plan of a training run, printed before anything is allocated.

  python -m astra_jax.plan --config=experiments/ss20m.py [--mesh=DATAxMODEL]
      [--gpu=v100-32gb|a100-80gb|h100-80gb] [--num_gpus=N] [--json] [--config.a.b=v ...]

Per device: W's shard, the classifier's optimizer state, the encoder's parameters, Adam
moments and gradients, the encoder's activations for one micro-batch, the classifier step's
temporaries; compared with what XLA can use (90% of the GPU's memory; set
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, JAX's default is 0.75), with fixes when it does not fit.
Host RAM of a refresh worker (ANN index ~2x its W rows, W snapshot, mined negatives,
positives) and of a training process (label matrix, hard-negative and query-embedding
memmaps); disk (token memmaps, refresh files).

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
import sys

from absl import app, flags
from ml_collections import config_flags

from astra_jax import cli, paper_configs
from astra_jax.data import catalog, synthetic
from astra_jax.errors import InputError
from astra_jax.model import pretrained
from astra_jax.model.encoder_config import EncoderConfig
from astra_jax.negatives.schedule import NegativeSchedule

GiB = 2 ** 30
# Memory per device (TPU chips too, for the TPU VM recipe in launch/README.md).
GPUS = {"v100-32gb": 32 * GiB, "v100-16gb": 16 * GiB, "a100-40gb": 40 * GiB,
        "a100-80gb": 80 * GiB, "h100-80gb": 80 * GiB, "h200-141gb": 141 * GiB,
        "tpu-v4-32gb": 32 * GiB, "tpu-v5e-16gb": 16 * GiB, "tpu-v5p-95gb": 95 * GiB}
USABLE_FRACTION = 0.9
DOES_NOT_FIT_EXIT = 3  # --check
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SPARSE_STRATEGIES_EXCLUDED = ("uptodate", "full")  # these use the dense optax update
XLA_OVERHEAD = 1.25  # see activation_bytes


@dataclasses.dataclass
class Item:
  name: str
  bytes: int
  formula: str = ""
  paged: bool = False   # a memmap: in the page cache when hot, not counted as resident


@dataclasses.dataclass
class DataSize:
  num_labels: int
  num_train: int          # training rows before label-text augmentation
  rows: int               # training rows the loop iterates over (+ label texts)
  source: str


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
  worker_items: list[Item]    # host RAM of a refresh worker process
  trainer_items: list[Item]   # host RAM of a training process
  disk_items: list[Item]
  notes: list[str]
  suggestions: list[str] = dataclasses.field(default_factory=list)

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
    out.update(device_total=self.device_total, usable=self.usable, fits=self.fits,
               headroom=self.usable - self.device_total,
               worker_resident=_resident(self.worker_items),
               trainer_resident=_resident(self.trainer_items))
    return out


def _resident(items: list[Item]) -> int:
  return sum(i.bytes for i in items if not i.paged)


# ------------------------------------------------------------------------------ inputs
def data_size(config) -> DataSize:
  """L and N: the synthetic spec, the label matrix's header on disk, or the config's
  dataset statistics."""
  dc = config.data
  aug = bool(dc.augment_label_text)
  if dc.synthetic.enabled:
    s = dc.synthetic
    return DataSize(s.num_labels, s.num_train, s.num_train + (s.num_labels if aug else 0),
                    "synthetic spec")
  header = os.path.join(dc.dir, "trn_X_Y.txt")
  if dc.dir and os.path.exists(header):
    with open(header) as f:
      parts = f.readline().split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
      n, L = int(parts[0]), int(parts[1])
      return DataSize(L, n, n + (L if aug else 0), f"{header} header")
  if dc.get("num_labels", 0) and dc.get("num_train", 0):
    return DataSize(dc.num_labels, dc.num_train, dc.num_train + (dc.num_labels if aug else 0),
                    "config.data.num_labels/num_train (data not on disk)")
  lbl, trn = (os.path.join(dc.dir, f) for f in ("lbl.json.gz", "trn.json.gz"))
  if dc.dir and os.path.exists(lbl) and os.path.exists(trn):
    L, n = _count_lines(lbl), _count_lines(trn)
    return DataSize(L, n, n + (L if aug else 0), "lines of lbl.json.gz / trn.json.gz")
  raise InputError(f"the size of the dataset in {dc.dir!r} is unknown (not on disk): set "
                   f"--config.data.num_labels=L --config.data.num_train=N")


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


def encoder_shape(config) -> tuple[EncoderConfig, str]:
  """The EncoderConfig train.build_encoder would build, and where it came from."""
  ec = config.encoder
  common = dict(bottleneck_dim=ec.bottleneck_dim, embedding_dropout=ec.embedding_dropout,
                dtype=ec.dtype)
  hf_dir = pretrained.resolve(ec.hf_dir) if ec.hf_dir else ""
  published = paper_configs.PAPER_ENCODER_SHAPES.get(ec.get("paper_encoder", ""))
  if hf_dir and published and not os.path.exists(os.path.join(hf_dir, "config.json")):
    # Training would stop (encoder_source.check); the plan uses the published shape.
    return EncoderConfig.from_hf(published, **common), f"{ec.paper_encoder} (published shape)"
  if hf_dir:
    return EncoderConfig.from_hf(hf_dir, **common), hf_dir
  if config.data.synthetic.enabled:
    vocab, source = config.data.synthetic.vocab_size + len(synthetic.SPECIAL_TOKENS), "synthetic"
  else:
    tok_dir = pretrained.resolve(config.data.tokenizer_dir) if config.data.tokenizer_dir else ""
    vocab = tokenizer_vocab(tok_dir) if tok_dir and os.path.isdir(tok_dir) else None
    source = tok_dir
    if vocab is None:
      vocab, source = 30522, "assumed (no tokenizer found)"
  cfg = EncoderConfig(vocab_size=vocab, hidden_size=ec.hidden_size, num_layers=ec.num_layers,
                      num_heads=ec.num_heads, intermediate_size=ec.intermediate_size,
                      max_position=max(512, config.data.max_len), **common)
  return cfg, f"tiny random BERT (config.encoder fields; vocabulary: {source})"


def encoder_param_count(e: EncoderConfig) -> int:
  """Parameters of astra_jax.model.encoder.Encoder(e), exactly."""
  H, I = e.hidden_size, e.intermediate_size
  embeddings = (e.vocab_size + e.max_position + e.type_vocab_size) * H + 2 * H  # + LayerNorm
  layer = (4 * (H * H + H)      # query, key, value, out (with biases)
           + 2 * H              # attention LayerNorm
           + H * I + I          # ffn_in
           + I * H + H          # ffn_out
           + 2 * H)             # output LayerNorm
  return embeddings + e.num_layers * layer + H * e.bottleneck_dim  # bias-free bottleneck


def activation_bytes(e: EncoderConfig, b: int, T: int) -> tuple[int, str]:
  """Bytes the encoder keeps for its backward pass on b queries of T tokens.

  s = bytes per element of the compute dtype; masks are 1 byte; LayerNorm statistics and
  the exact GELU's erf term are fp32. Per layer, what autodiff keeps:
    b T H (8 s + 10): layer input, q, k, v, attention context, two dropout masks, two
                      LayerNorm inputs and normalised values (fp32), the attention
                      LayerNorm's output (the FFN's input)
    b T I (2 s + 4):  FFN pre-GELU, erf term, post-GELU
    b nh T^2 (9 + s): attention logits and softmax output (fp32), dropout mask, dropped
                      probabilities in the compute dtype
  Plus the embeddings (b T H (s + 1)) and the pooling (b T H 4), one more layer's worth for
  the backward pass's own temporaries, all times XLA_OVERHEAD: XLA keeps more than this
  minimal set (on CPU its temporaries for this encoder's fp32 forward + backward came to
  0.95-1.2x the count, more with more layers; tests/test_plan.py checks the plan stays
  above them). Not measured on a GPU, where fusion usually keeps less."""
  s = DTYPE_BYTES[e.dtype]
  H, I, nh = e.hidden_size, e.intermediate_size, e.num_heads
  per_layer = b * T * H * (8 * s + 10) + b * T * I * (2 * s + 4) + b * nh * T * T * (9 + s)
  total = (e.num_layers + 1) * per_layer + b * T * H * (s + 1) + b * T * H * 4
  return int(XLA_OVERHEAD * total), (
      f"{XLA_OVERHEAD} x [(layers + 1) x (b T H (8s+10) + b T I (2s+4) + b nh T^2 (9+s)) "
      f"+ b T H (s+5)]; b={b}, T={T}, s={s}")


# -------------------------------------------------------------------------------- plan
def make_plan(config, gpu: str, data: DataSize | None = None, config_name: str = "") -> Plan:
  """The plan for `config` as it stands (mesh included)."""
  data = data or data_size(config)
  enc, enc_source = encoder_shape(config)
  P = encoder_param_count(enc)
  d = enc.embed_dim
  L, rows = data.num_labels, data.rows
  D, M = config.mesh.data, config.mesh.model
  G = D * M
  A = max(1, config.train.get("grad_accum_steps", 1))
  B = config.train.batch_size
  micro = B // A                    # queries per micro-batch, all devices
  b_enc = math.ceil(micro / G)      # encoder: the micro-batch split over every device
  b_clf = math.ceil(micro / D)      # classifier kernel: the queries of one 'data' group
  nc = config.negatives
  schedule = NegativeSchedule(nc.strategy, nc.k_h, nc.k_r, nc.tau_s, nc.tau_r,
                              config.train.epochs, nc.curriculum_final_hard_fraction)
  # Per W shard: the step's hard and random columns once hard negatives exist (the
  # curricula's widest split, w_hard / e_hard all hard) and the columns a refresh mines.
  k_p, (k_h, k_r) = nc.k_p, schedule.columns(nc.tau_s, have_hard=True)
  mined = schedule.mined_k() if schedule.uses_index else 0
  T = config.data.max_len
  s = DTYPE_BYTES[enc.dtype]
  dense = (config.optim.classifier_update == "dense"
           or nc.strategy in SPARSE_STRATEGIES_EXCLUDED)
  R = -(-L // M)                    # W rows per shard (padded to a multiple of M)
  notes = []

  dev = [Item(f"W shard ({R:,} rows x {d}, fp32)", R * d * 4, "ceil(L / model) x d x 4")]
  if dense:
    mom = L * d * 4 if config.optim.classifier_momentum else 0
    dev.append(Item("classifier optimizer state (dense SGD momentum)", mom, "L x d x 4"))
  elif config.optim.classifier_momentum:
    # sparse_momentum.py: a velocity per W row (sharded like W) and the step each row is
    # current at; its tree of per-step 2 x 2 matrices (16 bytes x 2 x steps per epoch) is
    # left out: under 100 MB up to 3M steps per epoch.
    dev.append(Item("classifier optimizer state (sparse momentum: velocity + step per row)",
                    R * d * 4 + R * 4, "ceil(L / model) x (d + 1) x 4"))
  else:
    dev.append(Item("classifier optimizer state (sparse: one scale, one step)", 8, "2 x 4"))
  dev += [
      Item(f"encoder parameters ({P / 1e6:.1f}M, fp32, replicated)", 4 * P, "P x 4"),
      Item("Adam m, v (fp32)", 8 * P, "2 x P x 4"),
      Item("encoder gradients" + (" + accumulation buffer" if A > 1 else ""),
           4 * P * (2 if A > 1 else 1), "P x 4" + (" x 2" if A > 1 else "")),
  ]
  if s != 4:
    dev.append(Item(f"parameters cast to {enc.dtype}", s * P, f"P x {s}"))
  act, act_formula = activation_bytes(enc, b_enc, T)
  dev.append(Item(f"encoder activations ({b_enc} queries x {T} tokens, {enc.num_layers} layers)",
                  act, act_formula))
  if dense:
    dev.append(Item("dense W gradient + update", 2 * L * d * 4, "2 x L x d x 4"))
    if nc.strategy == "uptodate":
      dev.append(Item("scores over all labels (uptodate)", micro * L * 4, "B x L x 4"))
    elif nc.strategy == "full":
      blk = config.train.full_label_block
      dev.append(Item("full-L blocks (scores, recomputed)", 3 * micro * blk * 4,
                      "3 x B x block x 4"))
  kk = k_p + k_h + k_r
  # Rows gathered per query: k_p + k_h, + k_r with per-query draws; a shared draw of k_r
  # serves the batch.
  per_query = nc.random_draws == "per_query"
  k_row, k_once, k_txt = ((k_p + k_h + k_r, 0, "k_p + k_h + k_r") if per_query else
                          (k_p + k_h, k_r, "k_p + k_h"))
  gathered = (b_clf * k_row + k_once) * d * 4
  scores = b_clf * kk * (4 + 4 + 1)
  # Row gradients are all-gathered over 'data' (every replica of a shard applies the same
  # update) and kept for all A micro-batches in factored form: per (query, row) an id and
  # dloss/dscore, per query its embedding (sharding.classifier_grads). The update forms one
  # micro-batch's (rows, d) gradients at a time, scaled for the scatter: x 2.
  kept = B * k_row * 8 + B * d * 4 + A * k_once * (d * 4 + 4)
  formed = 2 * (micro * k_row + k_once) * d * 4
  once = " + k_r" if k_once else ""
  if not dense:
    dev.append(Item("classifier step: gathered rows + scores, their grads, masks",
                    gathered + scores + 2 * b_clf * d * 4,
                    f"(B_g ({k_txt}){once}) d 4 + B_g (k_p + k_h + k_r) 9 + 2 B_g d 4"))
    dev.append(Item("classifier step: row gradients, factored (all micro-batches)", kept,
                    f"B ({k_txt}) (4 + 4) + B d 4{' + A k_r (d 4 + 4)' if k_once else ''}"))
    dev.append(Item("classifier update: one micro-batch's row gradients", formed,
                    f"2 x (B/A ({k_txt}){once}) x d x 4"))

  # Host. A refresh mines every training row against an index over one shard's rows; the
  # worker holds the index, the W snapshot, the mined (N, k) array and the positives.
  index_kind = nc.index if nc.index != "auto" else ("exact" if R <= 50_000 else "scann")
  ds = catalog.DATASETS.get(config.data.get("name", ""))
  lpp = (config.data.synthetic.mean_labels if config.data.synthetic.enabled
         else ds.labels_per_point if ds else None)
  nnz = int(data.num_train * lpp) + (rows - data.num_train) if lpp else None
  if index_kind == "scann":
    worker = [Item(f"ANN index (ScaNN: its own fp32 copy + codes, ~2x {R:,} rows)",
                   2 * R * d * 4, "2 x W shard")]
  else:
    worker = [Item(f"exact index ({R:,} rows + one 4096-query score block)",
                   R * d * 4 + 4096 * R * 4 * 2, "W shard + 2 x 4096 x rows x 4")]
  worker += [
      Item("W snapshot (loaded)", R * d * 4, "W shard"),
      Item(f"mined hard negatives ({rows:,} x {mined} int32)", rows * mined * 4,
           "N x k_mined x 4", paged=True),
  ]
  trainer = [Item(f"hard negatives in use ({rows:,} x {M * mined} int32)",
                  rows * M * mined * 4, "N x (model x k_mined) x 4", paged=True),
             Item(f"query embeddings being collected ({rows:,} x {d} fp32)",
                  rows * d * 4, "N x d x 4", paged=True)]
  # The label matrix is the label cache's memmaps (label_cache): the training processes
  # and workers of a node share one page-cache copy; the label-text rows are not stored.
  n_file, nnz_file = data.num_train + 1, (int(data.num_train * lpp) if lpp else 0)
  label_cache_bytes = n_file * 8 + nnz_file * 4 + L * 4
  if nnz:
    worker.append(Item(f"training positives (label cache, ~{nnz_file:,} pairs)",
                       label_cache_bytes, "(N + 1) x 8 + nnz x 4 + L x 4", paged=True))
    trainer.insert(0, Item(f"training label matrix (label cache, ~{nnz_file:,} pairs)",
                           label_cache_bytes, "(N + 1) x 8 + nnz x 4 + L x 4", paged=True))
  else:
    notes.append("the label matrix is not counted (labels per point unknown): its cache, "
                 "(N + 1) x 8 + nnz x 4 + L x 4 bytes, is mapped once per node")
  disk = [Item(f"token memmaps ({rows:,} training rows x {T} int32)", rows * T * 4,
               "N x T x 4 (+ test rows)"),

          Item("hard negatives, in use + next", 2 * rows * M * mined * 4,
               "2 x N x (model x k_mined) x 4"),
          Item("query embeddings + W snapshot of a refresh", rows * d * 4 + L * d * 4,
               "N x d x 4 + L x d x 4")]
  if nnz:
    disk.insert(1, Item("label cache (training labels)", label_cache_bytes,
                        "(N + 1) x 8 + nnz x 4 + L x 4"))
  if M > 1:
    notes.append(f"a refresh worker is for one W shard ({R:,} rows); a host that mines for "
                 f"several shards needs that much for each")
  if ds and not ds.public and not config.data.synthetic.enabled:
    notes.append(f"{ds.name} is proprietary: this plans the real dataset's size; its "
                 f"synthetic stand-in is {ds.config}:synthetic")
  if ec_note := _encoder_note(config, enc_source):
    notes.append(ec_note)

  return Plan(
      config_name=config_name or config.data.get("name", ""), data=data,
      encoder={"source": enc_source, "model_type": enc.model_type, "params": P,
               "hidden": enc.hidden_size, "layers": enc.num_layers, "heads": enc.num_heads,
               "ffn": enc.intermediate_size, "vocab": enc.vocab_size, "d": d,
               "dtype": enc.dtype},
      mesh={"data": D, "model": M, "devices": G},
      batch={"global": B, "grad_accum_steps": A, "micro_batch": micro,
             "encoder_queries_per_device": b_enc, "classifier_queries_per_device": b_clf,
             "max_len": T},
      negatives={"k_p": k_p, "k_h_per_shard": k_h, "k_r_per_shard": k_r, "shards": M,
                 "random_draws": nc.random_draws,
                 "index": index_kind, "dense_update": dense},
      gpu=gpu, device_items=dev, worker_items=worker, trainer_items=trainer,
      disk_items=disk, notes=notes)


def _encoder_note(config, source: str) -> str:
  want = config.encoder.get("paper_encoder", "")
  if want and source.endswith("(published shape)"):
    return (f"the paper's encoder {want} is not in {config.encoder.hf_dir}: planned with its "
            f"published shape; training needs its files there (or "
            f"--config.encoder.hf_dir=all-MiniLM-L6-v2, see astra_jax/paper_configs.py)")
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
      out.append(f"gradient accumulation: --config.train.grad_accum_steps={a} "
                 f"({p.device_total / GiB:.1f} GiB per device)")
      break
  m = M * 2
  while m <= 1024:
    if G % m == 0 and (p := fits(mesh__data=G // m, mesh__model=m)):
      out.append(f"more W shards on the same {G} devices: --mesh={G // m}x{m} "
                 f"({p.device_total / GiB:.1f} GiB per device)")
      break
    if G % m and (p := fits(mesh__data=1, mesh__model=m)):
      out.append(f"more devices for W's shards: --num_gpus={m} --mesh=1x{m} "
                 f"({p.device_total / GiB:.1f} GiB per device)")
      break
    m *= 2
  if not config.encoder.bottleneck_dim and (p := fits(encoder__bottleneck_dim=64)):
    out.append(f"a bottleneck to d=64 (as the paper does for very large L): "
               f"--config.encoder.bottleneck_dim=64 ({p.device_total / GiB:.1f} GiB per device)")
  if config.encoder.dtype == "float32":
    low = "float16" if gpu.startswith("v100") else "bfloat16"
    if p := fits(encoder__dtype=low):
      out.append(f"{low} compute: --config.encoder.dtype={low} "
                 f"({p.device_total / GiB:.1f} GiB per device)")
  return out or ["nothing single fits: combine the above, or add GPUs"]


# ---------------------------------------------------------------------------- printing
def _gib(n: int) -> str:
  return f"{n / GiB:8.2f}"


def format_plan(p: Plan) -> str:
  e, m, b, n = p.encoder, p.mesh, p.batch, p.negatives
  lines = [
      f"memory plan: {p.config_name}",
      f"  data: L = {p.data.num_labels:,} labels, N = {p.data.rows:,} training rows "
      f"({p.data.num_train:,} + label texts)" if p.data.rows != p.data.num_train else
      f"  data: L = {p.data.num_labels:,} labels, N = {p.data.rows:,} training rows",
      f"        from {p.data.source}",
      f"  encoder: {e['model_type']}, {e['params'] / 1e6:.1f}M parameters (hidden {e['hidden']}, "
      f"{e['layers']} layers x {e['heads']} heads, ffn {e['ffn']}), d = {e['d']}, "
      f"compute {e['dtype']}",
      f"        from {e['source']}",
      f"  mesh: {m['data']} data x {m['model']} model = {m['devices']} "
      f"device{'s' if m['devices'] > 1 else ''}, {p.gpu} "
      f"({GPUS[p.gpu] / GiB:.0f} GiB, {p.usable / GiB:.1f} GiB usable at "
      f"{USABLE_FRACTION:.0%})",
      f"  batch: {b['global']}" + (f" = {b['grad_accum_steps']} micro-batches of {b['micro_batch']}"
                                  if b['grad_accum_steps'] > 1 else " (no accumulation)") + "; "
      f"encoder {b['encoder_queries_per_device']} queries per device, classifier "
      f"{b['classifier_queries_per_device']}; {b['max_len']} tokens",
      f"  negatives per query: {n['k_p']} positives (padded), {n['shards']} x {n['k_h_per_shard']} "
      f"hard, {n['shards']} x {n['k_r_per_shard']} random columns (per W shard x shards; "
      f"{n['random_draws'].replace('_', ' ')} draws); index {n['index']}",
      "",
      f"  {'GPU memory per device':<74}{'GiB':>8}",
  ]
  lines += [f"    {i.name:<72}{_gib(i.bytes)}" for i in p.device_items]
  verdict = (f"FITS, {(p.usable - p.device_total) / GiB:.2f} GiB headroom" if p.fits else
             f"DOES NOT FIT: {(p.device_total - p.usable) / GiB:.2f} GiB over")
  lines.append(f"    {'total':<72}{_gib(p.device_total)}   {verdict}")
  for title, items in (("host RAM, a refresh worker", p.worker_items),
                       ("host RAM, each training process", p.trainer_items),
                       ("disk", p.disk_items)):
    lines += ["", f"  {title:<74}{'GiB':>8}"]
    lines += [f"    {i.name + (' (memmap)' if i.paged else ''):<72}{_gib(i.bytes)}" for i in items]
    if title != "disk":
      paged = sum(i.bytes for i in items if i.paged)
      label = "resident" + (", + the memmaps in the page cache when hot" if paged else "")
      lines.append(f"    {label:<72}{_gib(_resident(items))}")
  if p.notes:
    lines += [""] + [f"  note: {x}" for x in p.notes]
  if p.suggestions:
    lines += ["", "  to make it fit:"] + [f"    - {x}" for x in p.suggestions]
  return "\n".join(lines)


# -------------------------------------------------------------------------------- main
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


def plan_config(config, gpu: str, mesh: str = "", num_gpus: int = 0, name: str = "") -> Plan:
  """Applies the mesh to (a copy of) the config, plans, and adds suggestions if needed."""
  if gpu not in GPUS:
    raise InputError(f"--gpu={gpu!r}: choose from {', '.join(GPUS)}")
  config = copy.deepcopy(config)
  data, model = resolve_mesh(config, mesh, num_gpus)
  with config.unlocked():
    config.mesh.data, config.mesh.model = data, model  # per-shard k_h/k_r follow (refs)
  size = data_size(config)
  p = make_plan(config, gpu, size, name)
  if not p.fits:
    p.suggestions = suggest(config, gpu, size)
  return p


def define_flags() -> None:
  """The command line (defined on demand: importing this module defines no flags, so it
  can share a process with other CLIs, e.g. in tests)."""
  config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
  flags.DEFINE_string("mesh", "", "DATAxMODEL devices (default: the config's mesh)")
  flags.DEFINE_enum("gpu", "v100-32gb", list(GPUS), "GPU memory to plan against")
  flags.DEFINE_integer("num_gpus", 0, "devices in all (default: the mesh's); sets mesh.data "
                       "= num_gpus / mesh.model unless --mesh says otherwise")
  flags.DEFINE_bool("json", False, "print the plan as JSON")
  flags.DEFINE_bool("check", False, f"exit with status {DOES_NOT_FIT_EXIT} when the run does "
                    "not fit (the launchers stop there)")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"unexpected arguments: {argv[1:]}")
  F = flags.FLAGS
  path = config_flags.get_config_filename(F["config"])
  config = cli.config_flag()
  label = f"{config.data.get('name', '') or '?'} ({path})"
  try:
    p = plan_config(config, F.gpu, F.mesh, F.num_gpus, label)
  except InputError as e:
    sys.exit(f"error: {e}")
  print(json.dumps(p.to_json(), indent=1) if F.json else format_plan(p))
  if F.check and not p.fits:
    sys.exit(DOES_NOT_FIT_EXIT)


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=cli.parse_flags)
