"""The encoder registry and the hashed n-gram bag encoder."""

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from astra_jax import plan
from astra_jax.config import base as config_base
from astra_jax.model import architectures, factory
from astra_jax.model.interface import QueryEncoder, QueryHead
from astra_jax.model.ngram_bag import NgramBagEncoder, hashed_ngrams
from astra_jax.model.ngram_bag_config import NgramBagConfig
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export
from astra_jax.serving.predictor import Predictor
from astra_jax.training import train


def test_hashed_ngrams_by_hand():
  ids = jnp.array([[5, 6, 5, 6, 0, 0], [7, 0, 0, 0, 0, 0]])
  grams, mask = hashed_ngrams(ids, orders=3, buckets=1 << 20, pad_id=0)
  grams, mask = np.asarray(grams), np.asarray(mask)
  # 6 unigrams, 5 bigrams, 4 trigrams per row.
  assert grams.shape == mask.shape == (2, 15)
  uni, bi, tri = slice(0, 6), slice(6, 11), slice(11, 15)
  np.testing.assert_array_equal(mask[0, uni], [1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(mask[0, bi], [1, 1, 1, 0, 0])  # (5,6) (6,5) (5,6)
  np.testing.assert_array_equal(mask[0, tri], [1, 1, 0, 0])  # (5,6,5) (6,5,6)
  np.testing.assert_array_equal(mask[1], [1] + [0] * 14)
  g = grams[0]
  assert g[0] == g[2] and g[1] == g[3]  # the same token, the same bucket
  assert g[6] == g[8] and g[6] != g[7]  # (5,6) twice, (6,5) differs
  assert g[11] != g[12]
  assert len({g[0], g[1], g[6], g[7], g[11], g[12]}) == 6  # orders never share a bucket here
  assert grams[1, 0] not in g[:4]
  assert grams.min() >= 0 and grams.max() < 1 << 20


def test_hash_buckets_grow_with_the_vocabulary_when_asked():
  c = config_base.base_config()
  c.encoder.ngram.hash_buckets = 1 << 18
  assert architectures.ngram_hash_buckets(c.encoder.ngram, 10_000_000) == 1 << 18  # off
  c.encoder.ngram.buckets_per_token = 3
  # By hand: 3 x 65,637 = 196,911 -> the floor 2^18; 3 x 656,261 = 1,968,783 -> 2^21;
  # 4 x 2^19 = 2^21 exactly -> 2^21, not 2^22.
  assert architectures.ngram_hash_buckets(c.encoder.ngram, 65_637) == 1 << 18
  assert architectures.ngram_hash_buckets(c.encoder.ngram, 656_261) == 1 << 21
  c.encoder.ngram.buckets_per_token = 4
  assert architectures.ngram_hash_buckets(c.encoder.ngram, 1 << 19) == 1 << 21  # exact power
  c.encoder.arch = "ngram_bag"
  shape = architectures.shape_from_config(c, 1 << 19, 0)
  assert shape.hash_buckets == 1 << 21


def test_encoder_is_the_scaled_mean_of_its_ngram_vectors():
  cfg = NgramBagConfig(hidden_size=8, hash_buckets=97, ngram_orders=2, normalize_scale=3.0)
  enc = NgramBagEncoder(cfg, nnx.Rngs(params=0))
  ids = jnp.array([[3, 4, 9, 0], [2, 2, 0, 0]])
  table = np.asarray(enc.ngram_embeddings.embedding[...])
  grams, mask = map(np.asarray, hashed_ngrams(ids, 2, 97, 0))
  for row in range(2):
    mean = table[grams[row][mask[row]]].mean(0)
    want = 3.0 * mean / np.linalg.norm(mean)
    np.testing.assert_allclose(np.asarray(enc(ids))[row], want, rtol=1e-5, atol=1e-6)
  assert isinstance(enc, QueryEncoder)


def test_factory_builds_each_architecture_from_the_config():
  c = config_base.base_config()
  assert type(factory.build_encoder(c, 50, 0, 0)).__name__ == "Encoder"
  c.encoder.arch, c.encoder.hidden_size = "ngram_bag", 16
  c.encoder.ngram.hash_buckets, c.encoder.bottleneck_dim = 1000, 4
  enc = factory.build_encoder(c, 50, 0, 0)
  assert isinstance(enc, NgramBagEncoder) and enc.cfg.embed_dim == 4
  # The planner sizes it through the same registry, exactly.
  shape, _ = plan.encoder_shape(c)
  n = sum(v.size for _, v in nnx.to_flat_state(nnx.state(enc, nnx.Param)))
  assert shape == enc.cfg and plan.encoder_param_count(shape) == n == 1000 * 16 + 16 * 4
  c.encoder.arch = "lstm"
  with pytest.raises(InputError, match=re.escape("encoder.arch='lstm'")):
    factory.build_encoder(c, 50, 0, 0)


# ------------------------------------------------- a new architecture, registered here
@dataclasses.dataclass(frozen=True)
class _TokenMeanShape:
  vocab_size: int = 50
  hidden_size: int = 8
  pad_token_id: int = 0
  bottleneck_dim: int = 0
  embedding_dropout: float = 0.0
  dtype: str = "float32"
  model_type: str = "token_mean"

  @property
  def embed_dim(self) -> int:
    return self.hidden_size

  def train_step_gflop(self, batch_size: int, seq_len: int) -> float:
    return 0.0


class _TokenMean(QueryHead, nnx.Module):
  """The smallest encoder: the mean of the tokens' learned vectors."""

  def __init__(self, cfg: _TokenMeanShape, rngs: nnx.Rngs):
    self.cfg = cfg
    self.table = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)

  def token_states(self, input_ids, dropout_key=None):
    return self.table(input_ids), input_ids != self.cfg.pad_token_id


@pytest.fixture
def token_mean_arch():
  arch = architectures.register(
    architectures.Architecture(
      name="token_mean",
      shape_cls=_TokenMeanShape,
      module=f"{__name__}:_TokenMean",
      shape_from_config=lambda c, vocab, pad: _TokenMeanShape(vocab, c.encoder.hidden_size, pad),
      param_count=lambda s: s.vocab_size * s.hidden_size,
      activation_bytes=lambda s, b, t: (4 * b * t * s.hidden_size, "b T H 4"),
    )
  )
  yield arch
  del architectures._REGISTRY[arch.name]


@pytest.mark.e2e
def test_a_registered_architecture_trains_exports_and_predicts(
  tmp_path, token_mean_arch, load_config
):
  c = load_config("experiments/demo.py")
  c.data.dir = str(tmp_path / "data")
  c.data.synthetic.num_labels, c.data.synthetic.num_train = 60, 400
  c.data.synthetic.num_test = 50
  c.encoder.arch, c.encoder.hidden_size = "token_mean", 16
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 32, 0
  c.negatives.k_r, c.negatives.tau_s = 16, 10
  c.eval.max_test_rows = 50
  train.train_and_evaluate(c, str(tmp_path / "wd"))
  model = export.load_model(str(tmp_path / "wd"))
  assert isinstance(model.encoder_cfg, _TokenMeanShape) and model.encoder_cfg.hidden_size == 16
  # The exported encoder is the registered module: its mean of token vectors, ranked by W,
  # is what the Predictor returns.
  p = Predictor.from_workdir(str(tmp_path / "wd"), index="exact")
  texts = ["a b c", "some other query"]
  tokens = p.to_tokens(texts)[0]
  table = np.asarray(
    dict(nnx.to_flat_state(model.encoder_params))[("table", "embedding")].get_value()
  )
  mask = tokens != model.pad_id
  emb = (table[tokens] * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  want = np.argsort(-(emb @ np.asarray(model.classifier).T), axis=1, kind="stable")[:, :3]
  np.testing.assert_array_equal(p.predict(texts, k=3).ids, want)
