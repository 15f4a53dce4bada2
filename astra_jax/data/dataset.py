"""Finds a dataset on disk (any of the repository's layouts), tokenizes it (cached) and
returns token matrices plus sparse label rows for training and evaluation."""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import numpy as np
from absl import logging

from astra_jax.data import label_cache, self_filter, tokenize, xc_format, xc_lines
from astra_jax.data.sparse_rows import SparseRows, WithLabelRows, XCFormatError
from astra_jax.runtime import tmpnames
from astra_jax.runtime.errors import InputError

# Text files per layout: (train, test, labels). Label matrices are trn_X_Y.txt / tst_X_Y.txt
# except for "json", where they come from target_ind.
LAYOUTS = {
  "renee": ("trn_X.txt", "tst_X.txt", "Y.txt"),
  "ngame": ("raw_data/train.raw.txt", "raw_data/test.raw.txt", "raw_data/label.raw.txt"),
  "json": ("trn.json.gz", "tst.json.gz", "lbl.json.gz"),
}


class RowConcat:
  """Rows of several (n_i, T) arrays as one (sum n_i, T) array, for fancy row indexing
  without copying memmaps (used for label-text augmentation)."""

  def __init__(self, *parts: np.ndarray):
    self.parts = parts
    self.offsets = np.cumsum([0] + [len(p) for p in parts])
    self.shape = (int(self.offsets[-1]), parts[0].shape[1])

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, rows) -> np.ndarray:
    rows = np.asarray(rows)
    out = np.empty((len(rows), self.shape[1]), self.parts[0].dtype)
    which = np.searchsorted(self.offsets, rows, side="right") - 1
    for i, part in enumerate(self.parts):
      sel = which == i
      if sel.any():
        out[sel] = part[rows[sel] - self.offsets[i]]
    return out


@dataclasses.dataclass
class XCData:
  data_dir: str
  num_labels: int
  train_tokens: np.ndarray | RowConcat  # (N, T) int32
  train_labels: SparseRows | WithLabelRows  # memmaps; with label-text rows appended
  test_tokens: np.ndarray
  test_labels: SparseRows
  label_tokens: np.ndarray | None  # (L, T) int32, when label texts exist
  test_filter: np.ndarray  # (n, 2) (test row, label) pairs to ignore
  pad_id: int
  vocab_size: int  # the tokenizer's, including added tokens
  num_train_original: int  # before label-text augmentation
  # (m, 2) (original training row, label) pairs of a row and its own item (data.filter_self):
  # the validation split's filter pairs
  train_self_pairs: np.ndarray = dataclasses.field(
    default_factory=lambda: np.zeros((0, 2), np.int64)
  )


class MissingDataError(InputError):
  """The dataset (or one of its files) is not where the config says. One line: the files
  expected and where, plus the config's `data.missing_hint` (download or synthetic command)."""


def _with_hint(message: str, hint: str) -> str:
  return f"{message} {hint}".strip() if hint else message


def detect_layout(data_dir: str, hint: str = "") -> str:
  for name, (trn, _, _) in LAYOUTS.items():
    if os.path.exists(os.path.join(data_dir, trn)):
      return name
  expected = "; ".join(f"{k}: {', '.join(v)}" for k, v in LAYOUTS.items())
  raise MissingDataError(
    _with_hint(
      f"no dataset found in {data_dir!r}. Expected one of these layouts ({expected}) plus "
      f"trn_X_Y.txt and tst_X_Y.txt (except for json).",
      hint,
    )
  )


# The test set's reciprocal-pair file: the default name (NGAME's) and Renée's.
FILTER_FILE, RENEE_FILTER_FILE = "filter_labels_test.txt", "tst_filter_labels.txt"


def filter_file_path(data_dir: str, filter_file: str) -> str:
  """The filter file to read ("" for none): `filter_file` in data_dir, or, for the default
  name, Renée's name for it, so a Renée download's pairs are not silently left unfiltered."""
  if not filter_file:
    return ""
  names = [filter_file] + ([RENEE_FILTER_FILE] if filter_file == FILTER_FILE else [])
  return next((p for p in (os.path.join(data_dir, n) for n in names) if os.path.exists(p)), "")


class DatasetFiles(NamedTuple):
  """The files of a dataset directory in one of the LAYOUTS."""

  layout: str
  train_texts: str
  test_texts: str
  label_texts: str  # may not exist (label texts are optional)
  train_labels: str  # trn_X_Y.txt; the json layout: the train texts themselves
  test_labels: str


def dataset_files(data_cfg) -> DatasetFiles:
  """The dataset's files, each required one checked.

  Raises:
    MissingDataError: the layout is not found, or required files are missing (all of them
      named, with the config's `data.missing_hint`).
    InputError: an unknown `data.layout`.
  """
  d, hint = data_cfg.dir, data_cfg.get("missing_hint", "")
  layout = data_cfg.layout if data_cfg.layout != "auto" else detect_layout(d, hint)
  if layout not in LAYOUTS:
    raise InputError(f"config.data.layout={layout!r}; use auto, {', '.join(LAYOUTS)}")
  trn_x, tst_x, lbl_x = (os.path.join(d, f) for f in LAYOUTS[layout])
  if layout == "json":
    files = DatasetFiles(layout, trn_x, tst_x, lbl_x, trn_x, tst_x)
    required = (trn_x, tst_x, lbl_x)
  else:
    trn_y, tst_y = os.path.join(d, "trn_X_Y.txt"), os.path.join(d, "tst_X_Y.txt")
    files = DatasetFiles(layout, trn_x, tst_x, lbl_x, trn_y, tst_y)
    required = (trn_x, tst_x, trn_y, tst_y)
  missing = [path for path in required if not os.path.exists(path)]
  if missing:
    files_named = "file" if len(missing) == 1 else "files"
    raise MissingDataError(_with_hint(f"missing dataset {files_named} {', '.join(missing)}.", hint))
  return files


def missing_files(data_cfg) -> list[str]:
  """What `load` would find missing, as messages naming every missing file and what to do
  (empty: nothing)."""
  try:
    dataset_files(data_cfg)
  except MissingDataError as e:
    return [str(e)]
  return []


def _writable_cache_dir(cache_dir: str) -> str:
  try:
    os.makedirs(cache_dir, exist_ok=True)
    probe = os.path.join(cache_dir, f".write-test-{tmpnames.unique_suffix()}")
    open(probe, "w").close(), os.remove(probe)
  except OSError:
    raise InputError(
      f"cache directory {cache_dir} is not writable; set --config.data.cache_dir"
    ) from None
  return cache_dir


def _label_rows(files: DatasetFiles, cache_dir: str) -> tuple[SparseRows, SparseRows, int]:
  """(training label rows, test label rows, L), from binary caches built once."""
  if files.layout == "json":
    num_labels = sum(1 for _ in xc_lines.numbered_lines(files.label_texts))
    train = label_cache.cached_labels(files.train_labels, cache_dir, json_num_labels=num_labels)
    test = label_cache.cached_labels(files.test_labels, cache_dir, json_num_labels=num_labels)
    return train, test, num_labels
  train = label_cache.cached_labels(files.train_labels, cache_dir)
  test = label_cache.cached_labels(files.test_labels, cache_dir, train.num_cols)
  return train, test, train.num_cols


def _own_item_pairs(
  data_cfg, files: DatasetFiles, train_labels: SparseRows, test_labels: SparseRows
) -> tuple[np.ndarray, np.ndarray]:
  """(training rows' own-item pairs, test rows' own-item pairs to filter) under
  `data.filter_self` (empty when off)."""
  mode = data_cfg.get("filter_self", "off")
  none = np.zeros((0, 2), np.int64)
  if mode == "off":
    return none, none
  if not os.path.exists(files.label_texts):
    raise MissingDataError(
      f"config.data.filter_self={mode} needs label texts at {files.label_texts}"
    )
  texts = lambda p: xc_format.read_texts(p, use_content=data_cfg.use_content)
  train_pairs, own, share = self_filter.own_item_pairs(
    mode,
    texts(files.train_texts),
    train_labels,
    texts(files.test_texts),
    test_labels,
    texts(files.label_texts),
  )
  logging.info(
    "data.filter_self=%s: %d training rows' own items are labels (%.1f%% of those pairs "
    "positives): %s",
    mode,
    len(train_pairs),
    100 * share,
    f"filtering {len(own)} test rows' own items" if len(own) else "no filter",
  )
  return train_pairs, own


def load(data_cfg, cache_dir: str | None = None) -> XCData:
  """Loads (and tokenizes, cached) the dataset a `config.data` describes.

  Args:
    data_cfg: `config.data`.
    cache_dir: where the tokenized and label caches go (default: `data.cache_dir`, else
      `<data.dir>/astra_cache`).
  Returns:
    The dataset, training rows with label texts appended under `data.augment_label_text`.
  Raises:
    MissingDataError: a file the layout needs is missing.
    XCFormatError: a file's line does not parse, or the files disagree in rows.
  """
  d = data_cfg.dir
  files = dataset_files(data_cfg)
  cache_dir = _writable_cache_dir(cache_dir or data_cfg.cache_dir or os.path.join(d, "astra_cache"))
  train_labels, test_labels, num_labels = _label_rows(files, cache_dir)
  tok = lambda p: tokenize.cached_tokens(
    p, cache_dir, data_cfg.tokenizer_dir, data_cfg.max_len, use_content=data_cfg.use_content
  )
  train_tokens, test_tokens = tok(files.train_texts), tok(files.test_texts)
  json_layout = files.layout == "json"
  xc_format.check_same_rows(
    files.train_texts,
    len(train_tokens),
    files.train_texts if json_layout else "trn_X_Y.txt",
    train_labels.num_rows,
  )
  xc_format.check_same_rows(
    files.test_texts,
    len(test_tokens),
    files.test_texts if json_layout else "tst_X_Y.txt",
    test_labels.num_rows,
  )
  label_tokens = None
  if os.path.exists(files.label_texts):
    label_tokens = tok(files.label_texts)
    if len(label_tokens) != num_labels:
      raise XCFormatError(
        files.label_texts,
        None,
        f"{len(label_tokens)} label texts but the label matrices have {num_labels} columns",
      )
  filter_path = filter_file_path(d, data_cfg.filter_file)
  test_filter = (
    xc_format.read_filter(filter_path, test_labels.num_rows, num_labels)
    if filter_path
    else np.zeros((0, 2), np.int64)
  )
  train_self_pairs, own = _own_item_pairs(data_cfg, files, train_labels, test_labels)
  if data_cfg.get("filter_self", "off") != "off":  # the pairs sorted and each once
    test_filter = np.unique(np.concatenate([test_filter, own]), axis=0)
  pad_id, vocab_size = tokenize.tokenizer_ids(
    files.train_texts, cache_dir, data_cfg.tokenizer_dir, data_cfg.max_len
  )
  n_orig = train_labels.num_rows
  if data_cfg.augment_label_text:
    if label_tokens is None:
      raise MissingDataError(
        f"config.data.augment_label_text needs label texts at {files.label_texts}"
      )
    train_tokens = RowConcat(train_tokens, label_tokens)
    train_labels = WithLabelRows(train_labels)  # label l's text: one row, positive l
  logging.info(
    "dataset %s (%s layout): L=%d, %d train rows (%d with label texts), %d test rows, "
    "%d filter pairs",
    d,
    files.layout,
    num_labels,
    n_orig,
    train_labels.num_rows,
    test_labels.num_rows,
    len(test_filter),
  )
  return XCData(
    data_dir=d,
    num_labels=num_labels,
    train_tokens=train_tokens,
    train_labels=train_labels,
    test_tokens=test_tokens,
    test_labels=test_labels,
    label_tokens=label_tokens,
    test_filter=test_filter,
    pad_id=pad_id,
    vocab_size=vocab_size,
    num_train_original=n_orig,
    train_self_pairs=train_self_pairs,
  )
