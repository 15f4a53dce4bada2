"""Texts -> int32 token memmaps (rows x max_len), cached beside the data.

Each tokenized file is `<name>.tokens.npy` (an .npy file, so it opens with
`np.load(mmap_mode="r")`) and `<name>.meta.json` holding the source file's size and mtime,
the tokenizer's fingerprint and max_len: when any of them changes the cache is rebuilt.
Padding uses the tokenizer's pad id; the attention mask is `tokens != pad_id`.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Callable, Sequence

import numpy as np
from absl import logging

from astra_jax import tmpnames
from astra_jax.data import xc_format
from astra_jax.errors import InputError

_BATCH = 8192  # texts per call into the Rust tokenizer (which parallelises internally)


class TokenizerError(InputError):
  pass


def load_tokenizer(tokenizer_dir: str):
  """A HuggingFace fast tokenizer from a local directory (never from a hub)."""
  if not tokenizer_dir or not os.path.isdir(tokenizer_dir):
    raise TokenizerError(f"tokenizer directory {tokenizer_dir!r} does not exist")
  names = set(os.listdir(tokenizer_dir))
  if not names & {"tokenizer.json", "vocab.txt"}:
    raise TokenizerError(f"tokenizer directory {tokenizer_dir!r} holds neither tokenizer.json "
                         f"nor vocab.txt (found: {sorted(names) or 'nothing'})")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
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


def _source_stamp(path: str) -> dict:
  st = os.stat(path)
  return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def tokenize_texts(texts: Sequence[str], tokenizer, max_len: int,
                   progress: Callable[[int, int], None] | None = None) -> np.ndarray:
  """Tokenizes in batches into a (len(texts), max_len) int32 array."""
  out = np.full((len(texts), max_len), tokenizer.pad_token_id or 0, np.int32)
  for start in range(0, len(texts), _BATCH):
    batch = list(texts[start:start + _BATCH])
    enc = tokenizer(batch, max_length=max_len, truncation=True, padding="max_length",
                    return_attention_mask=False, return_token_type_ids=False)
    out[start:start + len(batch)] = np.asarray(enc["input_ids"], np.int32)
    if progress:
      progress(start + len(batch), len(texts))
  return out


def cached_tokens(text_path: str, cache_dir: str, tokenizer_dir: str, max_len: int,
                  layout: str = "auto", use_content: bool = False) -> np.ndarray:
  """Token ids of a text file as a read-only memmap, (re)built when stale."""
  os.makedirs(cache_dir, exist_ok=True)
  base = os.path.basename(text_path).split(".")[0]
  stem = os.path.join(cache_dir, f"{base}.L{max_len}")
  meta_path, tok_path = stem + ".meta.json", stem + ".tokens.npy"
  want = {"source": _source_stamp(text_path), "tokenizer": tokenizer_fingerprint(tokenizer_dir),
          "max_len": max_len, "layout": layout, "use_content": use_content}
  if os.path.exists(meta_path) and os.path.exists(tok_path):
    with open(meta_path) as f:
      have = json.load(f)
    if {k: have.get(k) for k in want} == want:
      return np.load(tok_path, mmap_mode="r")
    logging.info("tokens for %s are stale; rebuilding", text_path)
  tokenizer = load_tokenizer(tokenizer_dir)
  texts = xc_format.read_texts(text_path, layout, use_content)
  t0 = time.time()

  def progress(done, total):
    logging.log_every_n_seconds(logging.INFO, "tokenizing %s: %d/%d (%.0f texts/s)", 5,
                                os.path.basename(text_path), done, total,
                                done / max(time.time() - t0, 1e-9))

  tokens = tokenize_texts(texts, tokenizer, max_len, progress)
  tmp = f"{tok_path}.tmp-{tmpnames.unique_suffix()}.npy"
  np.save(tmp, tokens)
  os.replace(tmp, tok_path)
  meta = dict(want, rows=len(texts), pad_id=int(tokenizer.pad_token_id or 0),
              seconds=round(time.time() - t0, 2),
              truncated_rows=int((tokens[:, -1] != (tokenizer.pad_token_id or 0)).sum()))
  with xc_format.atomic_text_writer(meta_path) as f:
    json.dump(meta, f, indent=1)
  logging.info("tokenized %s: %d texts in %.1fs -> %s", text_path, len(texts),
               time.time() - t0, tok_path)
  return np.load(tok_path, mmap_mode="r")
