"""The trained model as a self-contained directory, `WORKDIR/model/`, for prediction.

  model.json            format version, model id, encoder architecture and shape, max_len,
                        pad id, L, d
                        (written last: a directory without it is not a model)
  encoder.safetensors   encoder parameters, one tensor per NNX parameter path ("layers/0/...")
  classifier.npy        W[:L] float32 (opens with np.load(mmap_mode="r"))
  tokenizer/            the training tokenizer's files, copied
  labels.txt            one label text per line, when the dataset has label texts
  vote_memory_keys.npy  when the score has a neighbour vote (xc/neighbour_vote.py): the
                        voting rows' unit embeddings (N, d) float32 (memory-mappable)
  vote_memory.npz       their labels as CSR `indptr`, `indices` (format 1 held the keys
                        here too, as `keys`; both are read)
  lexical/              when the score holds lexical terms (xc/lexical.py): the TF-IDF
                        vocabularies and IDF, the label texts' and voting rows' vectors,
                        the rows' labels
  config.json           the training config

Encoder parameters go to safetensors rather than an orbax checkpoint: it is one flat file
read with the same library as HF weights, memory-mappable, and has no async/multi-host
machinery or orbax-version coupling, none of which an inference export needs.

The directory is written under a temporary name and renamed into place, so a crash never
leaves a half-written `model/` that a later run would trust. Re-exporting replaces the whole
directory, including any ScaNN index the Predictor cached inside it (`scann/` over the old W,
`vote_scann/` over the old memory: serving/serve_index.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from astra_jax.ann.vote_memory import Memory, VoteMemory
from astra_jax.data import csr_files, dataset, xc_format
from astra_jax.data.label_subset import sample_labels
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.model import architectures
from astra_jax.model.factory import encoder_for_shape
from astra_jax.model.interface import EncoderShape
from astra_jax.runtime import distributed, tmpnames
from astra_jax.runtime.errors import InputError
from astra_jax.xc.lexical import LexicalIndex

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: the vote memory's keys inside vote_memory.npz
MODEL_DIR = "model"
CLASSIFIER_ROWS_FILE = ".classifier-rows.npy"  # W written by every process, then moved in
VOTE_MEMORY_FILE = "vote_memory.npz"
LEXICAL_DIR = "lexical"
VOTE_MEMORY_KEYS_FILE = "vote_memory_keys.npy"
MEMORY_KEYS_ROWS_FILE = ".vote-memory-keys.npy"  # written by every process, then moved in


class ModelNotFoundError(InputError, FileNotFoundError):
  """No finished model where one was expected; the message names the path."""


@dataclasses.dataclass
class Model:
  """A trained model as `load_model` reads it from WORKDIR/model: the encoder (config,
  graph and parameters), W, the tokenizer's directory, the label texts and the neighbour
  vote's memory (None when the score does not vote)."""

  path: str  # WORKDIR/model
  model_id: str  # changes on every export (keys cached indexes)
  encoder_cfg: EncoderShape
  graphdef: nnx.GraphDef
  encoder_params: nnx.State
  classifier: np.ndarray  # (L, d) float32, memory-mapped
  tokenizer_dir: str
  max_len: int
  pad_id: int
  label_texts: list[str] | None
  meta: dict
  memory: Memory | None = None
  lexical: LexicalIndex | None = None  # the lexical terms' index (xc/lexical.py)

  @property
  def trained_labels(self) -> int:
    """The labels before which every row was trained: a grown model's rows from its first
    growth since training on were made from their texts (serving/grow.py) and never trained."""
    grown = self.meta.get("grown_from")
    if grown is None:
      return len(self.classifier)
    return int(grown.get("trained_labels", grown["num_labels"]))


def model_dir(workdir: str) -> str:
  return os.path.join(workdir, MODEL_DIR)


def _fsync(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def replace_dir(tmp: str, dest: str) -> None:
  """Moves the finished directory `tmp` onto `dest` (replacing it). rename(2) cannot swap
  directories, so an old `dest` is first renamed aside; a crash in between leaves no
  `dest` (and the old one under `.old-*`), never a partial one."""
  for root, _, files in os.walk(tmp):
    for name in files:
      _fsync(os.path.join(root, name))
  old = None
  if os.path.exists(dest):
    old = f"{dest}.old-{tmpnames.unique_suffix()}"
    os.rename(dest, old)
  os.rename(tmp, dest)
  _fsync(os.path.dirname(os.path.abspath(dest)))
  if old:
    shutil.rmtree(old, ignore_errors=True)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx", ".pt", ".ckpt")


def copy_tokenizer(src: str, dst: str) -> None:
  """The top-level files of a tokenizer directory, without model weights: a HF model
  directory (e.g. all-MiniLM-L6-v2) doubles as the tokenizer directory."""
  os.makedirs(dst)
  for name in os.listdir(src):
    path = os.path.join(src, name)
    if os.path.isfile(path) and not name.startswith(".") and not name.endswith(_WEIGHT_SUFFIXES):
      shutil.copy2(path, os.path.join(dst, name))


def _flat_params(params: nnx.State) -> dict[str, np.ndarray]:
  return {
    "/".join(map(str, path)): np.asarray(var.get_value(), np.float32)
    for path, var in nnx.to_flat_state(params)
  }


def save_model(
  workdir: str,
  *,
  encoder_cfg: EncoderShape,
  encoder_params: nnx.State,
  classifier: np.ndarray | str,
  tokenizer_dir: str,
  max_len: int,
  pad_id: int,
  label_texts: list[str] | None = None,
  train_config: dict | None = None,
  extra: dict | None = None,
  memory: Memory | None = None,
  memory_keys_file: str | None = None,
  lexical_index: LexicalIndex | None = None,
) -> str:
  """Writes WORKDIR/model atomically; returns its path. `classifier`: W[:L] as an array, or
  the path of a finished float32 .npy of it (write_classifier_rows), moved into the model;
  `memory`: the neighbour vote's rows, when the score votes; `memory_keys_file`: a finished
  .npy of its keys (write_memory_keys), moved into the model instead of writing them;
  `lexical_index`: the lexical terms' (xc/lexical.py), when the score holds them."""
  from safetensors.numpy import save as safetensors_save

  rows_file = classifier if isinstance(classifier, str) else None
  classifier = (
    np.load(rows_file, mmap_mode="r") if rows_file else np.asarray(classifier, np.float32)
  )
  if classifier.ndim != 2 or classifier.shape[1] != encoder_cfg.embed_dim:
    raise ValueError(
      f"classifier shape {classifier.shape} does not match the encoder's d={encoder_cfg.embed_dim}"
    )
  if label_texts is not None and len(label_texts) != len(classifier):
    raise ValueError(f"{len(label_texts)} label texts for {len(classifier)} classifier rows")
  dest = model_dir(workdir)
  tmp = os.path.join(workdir, f".{MODEL_DIR}.tmp-{tmpnames.unique_suffix()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    # Not save_file: it creates the file 0600, unreadable to a model dir's other users.
    with open(os.path.join(tmp, "encoder.safetensors"), "wb") as f:
      f.write(safetensors_save(_flat_params(encoder_params)))
    if rows_file:
      os.replace(rows_file, os.path.join(tmp, "classifier.npy"))
    else:
      np.save(os.path.join(tmp, "classifier.npy"), classifier)
    copy_tokenizer(tokenizer_dir, os.path.join(tmp, "tokenizer"))
    if label_texts is not None:
      xc_format.write_texts(os.path.join(tmp, "labels.txt"), label_texts)
    if memory is not None:
      keys_path = os.path.join(tmp, VOTE_MEMORY_KEYS_FILE)
      if memory_keys_file:
        os.replace(memory_keys_file, keys_path)
      else:
        np.save(keys_path, np.asarray(memory.keys, np.float32))
      # Streamed: the memory's labels are views of the data's, never copied whole.
      csr_files.save_npz(memory.labels, os.path.join(tmp, VOTE_MEMORY_FILE))
    if lexical_index is not None:
      lexical_index.save(os.path.join(tmp, LEXICAL_DIR))
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(train_config or {}, f, indent=1)
    meta = {
      "format_version": FORMAT_VERSION,
      "model_id": uuid.uuid4().hex,
      "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
      "encoder_arch": architectures.of_shape(encoder_cfg).name,
      "encoder": dataclasses.asdict(encoder_cfg),
      "max_len": int(max_len),
      "pad_id": int(pad_id),
      "num_labels": int(classifier.shape[0]),
      "embed_dim": int(classifier.shape[1]),
      "label_texts": label_texts is not None,
      **(extra or {}),
    }
    with open(os.path.join(tmp, "model.json"), "w") as f:  # last: marks the model complete
      json.dump(meta, f, indent=1)
    replace_dir(tmp, dest)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return dest


def label_texts_of(data_cfg, data_dir: str) -> list[str] | None:
  """The dataset's label texts (any layout), or None when it has none."""
  layout = data_cfg.layout if data_cfg.layout != "auto" else dataset.detect_layout(data_dir)
  path = os.path.join(data_dir, dataset.LAYOUTS[layout][2])
  if not os.path.exists(path):
    return None
  return xc_format.read_texts(path, "auto", data_cfg.use_content)


def write_classifier_rows(classifier, num_labels: int, path: str) -> None:
  """W[:L] as a float32 .npy at `path`, each process writing the rows its devices hold, one
  shard at a time: W is never gathered onto one device or host. Every process calls it
  (the workdir is on a file system they share, as checkpoints already need).

  Args:
    classifier: W (L' >= L rows), a jax.Array split over 'model' or a host array.
    num_labels: L; padded rows past it are not written.
    path: the .npy to write (replaced).
  """
  if distributed.is_leader():
    np.lib.format.open_memmap(
      path, mode="w+", dtype=np.float32, shape=(num_labels, classifier.shape[1])
    ).flush()
  distributed.barrier("export: classifier file created")
  out = np.load(path, mmap_mode="r+")
  # One writer per row: the first replica of each shard (data replicas hold copies).
  shards = (
    [s for s in classifier.addressable_shards if s.replica_id == 0]
    if isinstance(classifier, jax.Array)
    else [None]
  )
  for shard in shards:
    start = 0 if shard is None else (shard.index[0].start or 0)
    if start >= num_labels:
      continue  # padding rows only
    rows = np.asarray(classifier if shard is None else shard.data, np.float32)
    stop = min(start + len(rows), num_labels)
    out[start:stop] = rows[: stop - start]
  out.flush()
  del out
  distributed.barrier("export: classifier rows written")


def write_memory_keys(memory: VoteMemory, path: str) -> None:
  """The vote memory's keys as a float32 (N, d) .npy at `path`, in row order, each process
  writing the rows its devices hold: the keys are never gathered onto one host (a memory
  already whole on every host: process 0 writes it). Every process calls it (on a file
  system they share, as write_classifier_rows).

  Args:
    memory: the memory (its first `num_rows` rows are written).
    path: the .npy to write (replaced).
  """
  if distributed.is_leader():
    shape = (memory.num_rows, memory.dim)
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape).flush()
  distributed.barrier("export: vote memory keys file created")
  out = np.load(path, mmap_mode="r+")
  for rows, keys in memory.own_rows():
    out[rows] = keys
  out.flush()
  del out
  distributed.barrier("export: vote memory keys written")


def save_trained_model(
  workdir: str,
  config,
  encoder_cfg: EncoderShape,
  params: dict,
  data: dataset.XCData,
  metrics: dict | None = None,
  memory: VoteMemory | None = None,
  lexical_index: LexicalIndex | None = None,
) -> str | None:
  """What train_and_evaluate exports: its encoder, W[:L] (padded mesh rows dropped), the
  tokenizer and label texts of its dataset, and the neighbour vote's `memory` when the
  score votes. Every process writes its own rows of W (write_classifier_rows) and of the
  memory's keys (write_memory_keys); process 0 writes the rest."""
  rows_file = os.path.join(workdir, CLASSIFIER_ROWS_FILE)
  write_classifier_rows(params["classifier"], data.num_labels, rows_file)
  keys_file = os.path.join(workdir, MEMORY_KEYS_ROWS_FILE)
  if memory is not None:
    write_memory_keys(memory, keys_file)
  if jax.process_index() != 0:
    return None
  host_memory = None
  if memory is not None:
    labels = memory.labels.head(memory.num_rows)
    host_memory = Memory(np.load(keys_file, mmap_mode="r"), labels)
  texts = label_texts_of(config.data, data.data_dir) if data.label_tokens is not None else None
  if texts is not None and config.data.get("label_subset", 0):  # the subset's, in its order
    kept = sample_labels(len(texts), config.data.label_subset, config.data.label_subset_seed)
    texts = [texts[i] for i in kept]
  return save_model(
    workdir,
    encoder_cfg=encoder_cfg,
    encoder_params=params["encoder"],
    classifier=rows_file,
    tokenizer_dir=config.data.tokenizer_dir,
    max_len=config.data.max_len,
    pad_id=data.pad_id,
    label_texts=texts,
    train_config=json.loads(config.to_json()),
    extra={
      "data_dir": os.path.abspath(data.data_dir),
      "test_metrics": metrics or {},
      "scoring": dict(config.get("scoring", {})),
      # Whether the run filtered each query's own item (data.filter_self): the Predictor
      # does the same.
      "filter_self": config.data.get("filter_self", "off") == "on"
      or len(data.train_self_pairs) > 0,
    },
    memory=host_memory,
    memory_keys_file=keys_file if memory is not None else None,
    lexical_index=lexical_index,
  )


def load_model(workdir: str) -> Model:
  """Reads the model a finished training run exported to WORKDIR/model.

  Args:
    workdir: the training run's workdir (the model is its `model/` directory).
  Returns:
    The Model: encoder parameters on the host, W memory-mapped from classifier.npy.
  Raises:
    ModelNotFoundError: no finished model (its message names the path and says how one is
      made); an interrupted export never leaves one, as model.json is written last.
    InputError: a file of the model is unreadable or does not match model.json.
  """
  from safetensors.numpy import load_file

  path = model_dir(workdir)
  meta_path = os.path.join(path, "model.json")
  if not os.path.exists(meta_path):
    why = (
      "the directory does not exist"
      if not os.path.isdir(workdir)
      else f"{path} does not exist"
      if not os.path.isdir(path)
      else f"{meta_path} is missing"
    )
    raise ModelNotFoundError(
      f"no finished model in workdir {workdir!r}: {why}. A model is written at the end of "
      f"training (python -m astra_jax.main --config=... --workdir={workdir}); a run that "
      f"stopped early leaves none."
    )
  try:
    with open(meta_path) as f:
      meta = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise InputError(f"{meta_path}: unreadable: {e}") from None
  if meta.get("format_version") not in READABLE_VERSIONS:
    raise InputError(
      f"{meta_path}: format_version {meta.get('format_version')!r}, this code "
      f"reads {' and '.join(map(str, READABLE_VERSIONS))}"
    )
  try:
    cfg = architectures.shape_from_json(meta)
  except (TypeError, InputError) as e:
    raise InputError(f"{meta_path}: its encoder record is not one this code builds: {e}") from None
  graphdef, params = nnx.split(nnx.eval_shape(lambda: encoder_for_shape(cfg)), nnx.Param)
  weights_path = os.path.join(path, "encoder.safetensors")
  try:
    tensors = load_file(weights_path)
  except Exception as e:  # safetensors raises its own error types for bad headers
    raise InputError(f"{weights_path}: cannot read: {e}") from None
  for p, var in nnx.to_flat_state(params):
    name = "/".join(map(str, p))
    if name not in tensors or tensors[name].shape != tuple(var.shape):
      got = tensors[name].shape if name in tensors else "missing"
      raise InputError(
        f"{weights_path}: tensor {name!r} is {got}, model.json's encoder wants {tuple(var.shape)}"
      )
    var.set_value(jnp.asarray(tensors[name], var.dtype))
  w_path = os.path.join(path, "classifier.npy")
  try:
    w = np.load(w_path, mmap_mode="r")
  except (OSError, ValueError) as e:
    raise InputError(f"{w_path}: cannot read: {e}") from None
  if w.shape != (meta["num_labels"], cfg.embed_dim) or w.dtype != np.float32:
    raise InputError(
      f"{w_path}: {w.dtype} {w.shape}, model.json says float32 "
      f"({meta['num_labels']}, {cfg.embed_dim})"
    )
  labels = None
  if meta.get("label_texts"):
    labels = xc_format.read_texts(os.path.join(path, "labels.txt"), "lines")
    if len(labels) != len(w):
      raise InputError(f"{path}/labels.txt: {len(labels)} lines for {len(w)} labels")
  return Model(
    path,
    meta["model_id"],
    cfg,
    graphdef,
    params,
    w,
    os.path.join(path, "tokenizer"),
    meta["max_len"],
    meta["pad_id"],
    labels,
    meta,
    _load_memory(path, len(w), cfg.embed_dim),
    _load_lexical(path, len(w)),
  )


def _load_lexical(path: str, num_labels: int) -> LexicalIndex | None:
  """The lexical terms' index of a model directory, or None when it has none."""
  directory = os.path.join(path, LEXICAL_DIR)
  if not os.path.isdir(directory):
    return None
  try:
    return LexicalIndex.load(directory, num_labels)
  except (OSError, ValueError, KeyError) as e:
    raise InputError(f"{directory}: cannot read: {e}") from None


def _load_memory(path: str, num_labels: int, dim: int) -> Memory | None:
  """The neighbour vote's memory of a model directory (its keys memory-mapped), or None when
  it has none."""
  labels_file = os.path.join(path, VOTE_MEMORY_FILE)
  if not os.path.exists(labels_file):
    return None
  keys_file = labels_file
  try:
    with np.load(labels_file) as z:
      indptr, indices = z["indptr"], z["indices"]
      keys = z["keys"] if "keys" in z.files else None  # format 1 kept them here
  except (OSError, ValueError, KeyError) as e:
    raise InputError(f"{labels_file}: cannot read: {e}") from None
  if keys is None:
    keys_file = os.path.join(path, VOTE_MEMORY_KEYS_FILE)
    try:
      keys = np.load(keys_file, mmap_mode="r")
    except (OSError, ValueError) as e:
      raise InputError(f"{keys_file}: cannot read: {e}") from None
  if keys.ndim != 2 or keys.shape[1] != dim or len(indptr) != len(keys) + 1:
    raise InputError(
      f"{keys_file}: keys {keys.shape} for {len(indptr) - 1} label rows ({labels_file}), "
      f"the model's d is {dim}"
    )
  if len(indices) != indptr[-1] or (len(indices) and indices.max() >= num_labels):
    raise InputError(f"{labels_file}: its label rows do not fit the model's {num_labels} labels")
  return Memory(keys, SparseRows(indptr, indices, None, num_labels))
