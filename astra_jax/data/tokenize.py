"""Texts -> int32 token memmaps (rows x max_len), cached beside the data.

Each tokenized file is `<name>.tokens.npy` (an .npy file, so it opens with
`np.load(mmap_mode="r")`) and `<name>.meta.json` holding the source file's size and mtime,
the tokenizer's fingerprint and max_len (when any of them changes the cache is rebuilt),
and the tokenizer's pad id and vocabulary size (so opening needs no tokenizer).
Padding uses the tokenizer's pad id; the attention mask is `tokens != pad_id`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from absl import logging

from astra_jax.data import cache_files, sparse_rows, xc_format
from astra_jax.runtime.errors import InputError

_BATCH = 8192  # texts per call into the Rust tokenizer (which parallelises internally)


class TokenizerError(InputError):
  pass


def load_tokenizer(tokenizer_dir: str):
  """A HuggingFace fast tokenizer from a local directory (never from a hub)."""
  if not tokenizer_dir or not os.path.isdir(tokenizer_dir):
    raise TokenizerError(f"tokenizer directory {tokenizer_dir!r} does not exist")
  names = set(os.listdir(tokenizer_dir))
  if not names & {"tokenizer.json", "vocab.txt"}:
    raise TokenizerError(
      f"tokenizer directory {tokenizer_dir!r} holds neither tokenizer.json "
      f"nor vocab.txt (found: {sorted(names) or 'nothing'})"
    )
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
  # The Rust tokenizer's batch encoding runs on a thread per core it is given (its pool
  # starts on first use, so this holds unless something tokenized earlier in the process).
  os.environ.setdefault("RAYON_NUM_THREADS", str(len(os.sched_getaffinity(0))))
  from transformers import AutoTokenizer

  try:
    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
  except Exception as e:  # transformers raises many types for a broken directory
    raise TokenizerError(f"cannot load tokenizer from {tokenizer_dir!r}: {e}") from e


def tokenizer_fingerprint(tokenizer_dir: str) -> str:
  h = hashlib.sha1()
  for name in sorted(os.listdir(tokenizer_dir)):
    path = os.path.join(tokenizer_dir, name)
    if os.path.isfile(path):
      h.update(name.encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()[:16]


def tokenize_texts(
  texts: Sequence[str], tokenizer, max_len: int, progress: Callable[[int, int], None] | None = None
) -> np.ndarray:
  """Tokenizes in batches into a (len(texts), max_len) int32 array."""
  out = np.full((len(texts), max_len), tokenizer.pad_token_id or 0, np.int32)
  for start in range(0, len(texts), _BATCH):
    batch = list(texts[start : start + _BATCH])
    enc = tokenizer(
      batch,
      max_length=max_len,
      truncation=True,
      padding="max_length",
      return_attention_mask=False,
      return_token_type_ids=False,
    )
    out[start : start + len(batch)] = np.asarray(enc["input_ids"], np.int32)
    if progress:
      progress(start + len(batch), len(texts))
  return out


def cached_tokens(
  text_path: str,
  cache_dir: str,
  tokenizer_dir: str,
  max_len: int,
  layout: str = "auto",
  use_content: bool = False,
) -> np.ndarray:
  """Token ids of a text file as a read-only memmap, (re)built when stale.

  Building runs once per cache (under `cache_files.build_lock`: the other processes of a
  node wait, then open it), streams the texts through the tokenizer in batches straight
  into the memmap (memory bounded by a batch, not by the file), and can resume: every
  `_CHECKPOINT_ROWS` rows the partial file is flushed and its row count recorded, so a
  killed build goes on from there.
  """
  os.makedirs(cache_dir, exist_ok=True)
  stem = _stem(text_path, cache_dir, max_len)
  tok_path = stem + ".tokens.npy"
  want = {
    "source": cache_files.source_stamp(text_path),
    "tokenizer": tokenizer_fingerprint(tokenizer_dir),
    "max_len": max_len,
    "layout": layout,
    "use_content": use_content,
  }
  if not _is_current(stem, want):
    with cache_files.build_lock(stem):
      if not _is_current(stem, want):  # another process may have built it meanwhile
        _build(text_path, stem, want, tokenizer_dir)
  return np.load(tok_path, mmap_mode="r")


def _stem(text_path: str, cache_dir: str, max_len: int) -> str:
  base = os.path.basename(text_path).split(".")[0]
  return os.path.join(cache_dir, f"{base}.L{max_len}")


def tokenizer_ids(
  text_path: str, cache_dir: str, tokenizer_dir: str, max_len: int
) -> tuple[int, int]:
  """(pad id, vocabulary size with added tokens) of the tokenizer a built token cache used:
  from its metadata, so that opening the caches does not import transformers (seconds);
  from the tokenizer itself for a cache built before the metadata held them."""
  try:
    with open(_stem(text_path, cache_dir, max_len) + ".meta.json") as f:
      meta = json.load(f)
    return int(meta["pad_id"]), int(meta["vocab_size"])
  except (OSError, KeyError, json.JSONDecodeError):
    tokenizer = load_tokenizer(tokenizer_dir)
    return int(tokenizer.pad_token_id or 0), len(tokenizer)


_CHECKPOINT_ROWS = 1 << 20
_PROGRESS_SECONDS = 10.0


def _is_current(stem: str, want: dict) -> bool:
  meta_path = stem + ".meta.json"
  if not (os.path.exists(meta_path) and os.path.exists(stem + ".tokens.npy")):
    return False
  with open(meta_path) as f:
    have = json.load(f)
  if {k: have.get(k) for k in want} == want:
    return True
  logging.info("tokens for %s are stale; rebuilding", want["source"]["path"])
  return False


def _build(text_path: str, stem: str, want: dict, tokenizer_dir: str) -> None:
  """Tokenizes `text_path` into `<stem>.tokens.npy` (see `cached_tokens`)."""
  tok_path, meta_path = stem + ".tokens.npy", stem + ".meta.json"
  partial_path, partial_meta = stem + ".tokens.partial.npy", stem + ".partial.json"
  tokenizer = load_tokenizer(tokenizer_dir)
  pad, max_len = int(tokenizer.pad_token_id or 0), want["max_len"]
  with contextlib.suppress(FileNotFoundError):
    os.remove(meta_path)  # no reader takes the old tokens for current ones meanwhile
  done = _resumable_rows(partial_path, partial_meta, want)
  if done is None:
    rows = xc_format.count_lines(text_path)
    tokens = np.lib.format.open_memmap(partial_path, "w+", np.int32, (rows, max_len))
    done = 0
  else:
    tokens = np.load(partial_path, mmap_mode="r+")
    rows = len(tokens)
    logging.info("tokenizing %s: resuming at row %d of %d", text_path, done, rows)
  progress = _Progress(os.path.basename(text_path), rows, done)
  texts = itertools.islice(
    xc_format.iter_texts(text_path, want["layout"], want["use_content"]), done, None
  )
  checkpoint = done
  for batch in _batches(texts, _BATCH):
    if done + len(batch) > rows:
      raise sparse_rows.XCFormatError(text_path, None, f"more texts than its {rows} lines")
    tokens[done : done + len(batch)] = tokenize_texts(batch, tokenizer, max_len)
    done += len(batch)
    progress(done)
    if done - checkpoint >= _CHECKPOINT_ROWS:
      _checkpoint(tokens, partial_meta, want, done)
      checkpoint = done
  if done != rows:
    raise sparse_rows.XCFormatError(text_path, None, f"{done} texts but {rows} lines")
  truncated = sum(
    int((tokens[s : s + _CHECKPOINT_ROWS, -1] != pad).sum())
    for s in range(0, rows, _CHECKPOINT_ROWS)
  )
  tokens.flush()
  del tokens
  with open(partial_path, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(partial_path, tok_path)
  with contextlib.suppress(FileNotFoundError):
    os.remove(partial_meta)
  meta = dict(
    want,
    rows=rows,
    pad_id=pad,
    vocab_size=len(tokenizer),
    seconds=round(progress.elapsed(), 2),
    truncated_rows=truncated,
  )
  with xc_format.atomic_text_writer(meta_path) as f:
    json.dump(meta, f, indent=1)
  logging.info(
    "tokenized %s: %d texts in %.1fs (%.0f rows/s) -> %s",
    text_path,
    rows,
    progress.elapsed(),
    rows / max(progress.elapsed(), 1e-9),
    tok_path,
  )


def _resumable_rows(partial_path: str, partial_meta: str, want: dict) -> int | None:
  """Rows a killed build of the same source and settings finished, or None."""
  try:
    with open(partial_meta) as f:
      have = json.load(f)
  except (OSError, json.JSONDecodeError):
    return None
  if {k: have.get(k) for k in want} != want or not os.path.exists(partial_path):
    return None
  return int(have["rows_done"])


def _checkpoint(tokens: np.memmap, partial_meta: str, want: dict, done: int) -> None:
  """Flushes the rows so far, then records their count (in that order: the record never
  counts rows that are not on disk)."""
  tokens.flush()
  with xc_format.atomic_text_writer(partial_meta) as f:
    json.dump(dict(want, rows_done=done), f)


def _batches(items: Iterator[str], size: int) -> Iterator[list[str]]:
  while batch := list(itertools.islice(items, size)):
    yield batch


class _Progress:
  """Logs rows, rows/s and the time left, every `_PROGRESS_SECONDS`."""

  def __init__(self, name: str, total: int, start: int):
    self.name, self.total, self.start = name, total, start
    self.t0 = self.last = time.time()

  def elapsed(self) -> float:
    return time.time() - self.t0

  def __call__(self, done: int) -> None:
    now = time.time()
    if now - self.last < _PROGRESS_SECONDS and done < self.total:
      return
    self.last = now
    rate = (done - self.start) / max(now - self.t0, 1e-9)
    logging.info(
      "tokenizing %s: %d/%d rows, %.0f rows/s, %.0fs left",
      self.name,
      done,
      self.total,
      rate,
      (self.total - done) / max(rate, 1e-9),
    )
