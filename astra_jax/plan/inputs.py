"""What a plan starts from without loading anything heavy: the dataset's size (from its
files' headers or the config), the encoder's shape (its config.json or the config's fields),
its parameter count and activation bytes."""

from __future__ import annotations

import gzip
import json
import os

from astra_jax.config import paper_configs
from astra_jax.data import synthetic
from astra_jax.model import architectures, pretrained
from astra_jax.model.encoder_config import EncoderConfig
from astra_jax.plan.records import DataSize
from astra_jax.runtime.errors import InputError


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


def padded_rows(L: int, model: int) -> int:
  """W's rows padded to a multiple of the 'model' axis (sharding.padded_rows)."""
  return -(-L // model) * model


def encoder_note(config, source: str) -> str:
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
