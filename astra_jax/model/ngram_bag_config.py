"""The shape of the hashed n-gram bag encoder (`model/ngram_bag.py`); jax-free, like
`encoder_config.py`, so the planner can size it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class NgramBagConfig:
  """A fastText-style encoder: every 1..`ngram_orders`-gram of token ids hashed into
  `hash_buckets` learned vectors of `hidden_size`, pooled by the query head."""

  hidden_size: int = 256
  hash_buckets: int = 1 << 18
  ngram_orders: int = 3  # unigrams, bigrams and trigrams of token ids
  pad_token_id: int = 0
  bottleneck_dim: int = 0  # 0: no bottleneck, d = hidden_size
  embedding_dropout: float = 0.0  # dropout on the pooled embedding (the paper's "dropout")
  # > 0: E(x) is scaled to this L2 norm (a cosine encoder; see docs/real_data.md); 0: the
  # mean of the n-gram vectors as it is.
  normalize_scale: float = 0.0
  dtype: str = "float32"
  model_type: str = "ngram_bag"

  @property
  def embed_dim(self) -> int:
    return self.bottleneck_dim or self.hidden_size

  def train_step_gflop(self, batch_size: int, seq_len: int) -> float:
    """Model GFLOP of one forward + backward (3 x forward): the pooled sum over the n-grams
    and the bottleneck (the lookups are memory traffic, not FLOP)."""
    fwd = 2 * batch_size * seq_len * self.ngram_orders * self.hidden_size
    fwd += 2 * batch_size * self.hidden_size * self.bottleneck_dim
    return 3 * fwd / 1e9
