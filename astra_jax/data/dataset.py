"""Finds a dataset on disk (any of the repository's layouts), tokenizes it (cached) and
returns token matrices plus sparse label rows for training and evaluation."""

from __future__ import annotations

import dataclasses
import os

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


def _require(path: str, hint: str = "") -> str:
  if not os.path.exists(path):
    raise MissingDataError(_with_hint(f"missing dataset file {path}.", hint))
  return path


def load(data_cfg, cache_dir: str | None = None) -> XCData:
  """Loads (and tokenizes, cached) the dataset a `config.data` describes."""
  d = data_cfg.dir
  hint = data_cfg.get("missing_hint", "")
  need = lambda path: _require(path, hint)
  layout = data_cfg.layout if data_cfg.layout != "auto" else detect_layout(d, hint)
  if layout not in LAYOUTS:
    raise InputError(f"config.data.layout={layout!r}; use auto, {', '.join(LAYOUTS)}")
  trn_x, tst_x, lbl_x = (os.path.join(d, f) for f in LAYOUTS[layout])
  need(trn_x), need(tst_x)
  cache_dir = cache_dir or data_cfg.cache_dir or os.path.join(d, "astra_cache")
  try:
    os.makedirs(cache_dir, exist_ok=True)
    probe = os.path.join(cache_dir, f".write-test-{tmpnames.unique_suffix()}")
    open(probe, "w").close(), os.remove(probe)
  except OSError:
    raise InputError(
      f"cache directory {cache_dir} is not writable; set --config.data.cache_dir"
    ) from None

  # Labels: binary caches built once (label_cache), then memory-mapped.
  if layout == "json":
    lbl_texts_path = need(lbl_x)
    num_labels = sum(1 for _ in xc_lines.numbered_lines(lbl_texts_path))
    train_labels = label_cache.cached_labels(trn_x, cache_dir, json_num_labels=num_labels)
    test_labels = label_cache.cached_labels(tst_x, cache_dir, json_num_labels=num_labels)
  else:
    trn_y = need(os.path.join(d, "trn_X_Y.txt"))
    train_labels = label_cache.cached_labels(trn_y, cache_dir)
    num_labels = train_labels.num_cols
    test_labels = label_cache.cached_labels(
      need(os.path.join(d, "tst_X_Y.txt")), cache_dir, num_labels
    )

  tok = lambda p: tokenize.cached_tokens(
    p, cache_dir, data_cfg.tokenizer_dir, data_cfg.max_len, use_content=data_cfg.use_content
  )
  train_tokens, test_tokens = tok(trn_x), tok(tst_x)
  xc_format.check_same_rows(
    trn_x, len(train_tokens), "trn_X_Y.txt" if layout != "json" else trn_x, train_labels.num_rows
  )
  xc_format.check_same_rows(
    tst_x, len(test_tokens), "tst_X_Y.txt" if layout != "json" else tst_x, test_labels.num_rows
  )
  label_tokens = None
  if os.path.exists(lbl_x):
    label_tokens = tok(lbl_x)
    if len(label_tokens) != num_labels:
      raise XCFormatError(
        lbl_x,
        None,
        f"{len(label_tokens)} label texts but the label matrices have {num_labels} columns",
      )
  filter_path = filter_file_path(d, data_cfg.filter_file)
  if filter_path:
    test_filter = xc_format.read_filter(filter_path, test_labels.num_rows, num_labels)
  else:
    test_filter = np.zeros((0, 2), np.int64)
  train_self_pairs = np.zeros((0, 2), np.int64)
  mode = data_cfg.get("filter_self", "off")
  if mode != "off":
    if not os.path.exists(lbl_x):
      raise MissingDataError(f"config.data.filter_self={mode} needs label texts at {lbl_x}")
    texts = lambda p: xc_format.read_texts(p, use_content=data_cfg.use_content)
    train_self_pairs, own, share = self_filter.own_item_pairs(
      mode, texts(trn_x), train_labels, texts(tst_x), test_labels, texts(lbl_x)
    )
    logging.info(
      "data.filter_self=%s: %d training rows' own items are labels (%.1f%% of those pairs "
      "positives): %s",
      mode,
      len(train_self_pairs),
      100 * share,
      f"filtering {len(own)} test rows' own items" if len(own) else "no filter",
    )
    test_filter = np.unique(np.concatenate([test_filter, own]), axis=0)

  pad_id, vocab_size = tokenize.tokenizer_ids(
    trn_x, cache_dir, data_cfg.tokenizer_dir, data_cfg.max_len
  )
  n_orig = train_labels.num_rows
  if data_cfg.augment_label_text:
    if label_tokens is None:
      raise MissingDataError(f"config.data.augment_label_text needs label texts at {lbl_x}")
    train_tokens = RowConcat(train_tokens, label_tokens)
    train_labels = WithLabelRows(train_labels)  # label l's text: one row, positive l
  logging.info(
    "dataset %s (%s layout): L=%d, %d train rows (%d with label texts), %d test rows, "
    "%d filter pairs",
    d,
    layout,
    num_labels,
    n_orig,
    train_labels.num_rows,
    test_labels.num_rows,
    len(test_filter),
  )
  return XCData(
    d,
    num_labels,
    train_tokens,
    train_labels,
    test_tokens,
    test_labels,
    label_tokens,
    test_filter,
    pad_id,
    vocab_size,
    n_orig,
    train_self_pairs,
  )
