import json
import os
import time

import numpy as np
import pytest

from astra_jax.data import synthetic, tokenize


@pytest.fixture()
def word_tokenizer(tmp_path):
  d = tmp_path / "tok"
  synthetic.write_word_tokenizer(str(d), ["red", "apple", "green", "pear"])
  return str(d)


def test_tokens_are_cached_and_rebuilt_when_source_changes(tmp_path, word_tokenizer):
  src = tmp_path / "trn_X.txt"
  src.write_text("red apple\ngreen pear green pear green pear\n\n")
  cache = tmp_path / "cache"
  t = tokenize.cached_tokens(str(src), str(cache), word_tokenizer, max_len=5)
  assert t.shape == (3, 5) and t.dtype == np.int32 and isinstance(t, np.memmap)
  # [CLS]=2 red apple [SEP]=3, pad 0; truncated row keeps [CLS] ... [SEP]; empty row [CLS][SEP]
  vocab = {w: i for i, w in enumerate(synthetic.SPECIAL_TOKENS + ["red", "apple", "green", "pear"])}
  np.testing.assert_array_equal(t[0], [2, vocab["red"], vocab["apple"], 3, 0])
  assert t[1][0] == 2 and t[1][-1] == 3
  np.testing.assert_array_equal(t[2], [2, 3, 0, 0, 0])
  meta = json.loads((cache / "trn_X.L5.meta.json").read_text())
  assert meta["rows"] == 3 and meta["truncated_rows"] == 1
  mtime = os.stat(cache / "trn_X.L5.tokens.npy").st_mtime_ns
  tokenize.cached_tokens(str(src), str(cache), word_tokenizer, max_len=5)
  assert os.stat(cache / "trn_X.L5.tokens.npy").st_mtime_ns == mtime  # cache hit
  time.sleep(0.01)
  src.write_text("pear\n")
  t = tokenize.cached_tokens(str(src), str(cache), word_tokenizer, max_len=5)
  assert t.shape == (1, 5) and t[0][1] == vocab["pear"]  # rebuilt


def test_missing_or_empty_tokenizer_dir(tmp_path):
  with pytest.raises(tokenize.TokenizerError, match="does not exist"):
    tokenize.load_tokenizer(str(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(
    tokenize.TokenizerError, match=r"holds neither tokenizer\.json nor vocab\.txt"
  ):
    tokenize.load_tokenizer(str(tmp_path / "empty"))


def test_minilm_tokenizer_batches(minilm_dir):
  tok = tokenize.load_tokenizer(minilm_dir)
  texts = [f"query number {i}" for i in range(20000)]
  out = tokenize.tokenize_texts(texts, tok, 8)
  assert out.shape == (20000, 8)
  np.testing.assert_array_equal(out[123], tokenize.tokenize_texts(["query number 123"], tok, 8)[0])
