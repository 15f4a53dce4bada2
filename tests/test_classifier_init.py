"""classifier.init: the Gaussian rows as before, or each label's normalised text embedding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from astra_jax.config import base as config_base
from astra_jax.runtime.errors import InputError
from astra_jax.xc import classifier_init


def _config(init, scale=1.0):
  c = config_base.base_config()
  c.data.dir, c.data.tokenizer_dir = "d", "t"
  c.classifier.init, c.classifier.init_scale = init, scale
  return c


def test_normal_is_the_seeded_gaussian():
  c = _config("normal")
  w = classifier_init.initial_classifier(c, 10, 4, 7, None, None)
  ref = 0.02 * jax.random.normal(jax.random.key(8), (10, 4), jnp.float32)
  np.testing.assert_array_equal(np.asarray(w), np.asarray(ref))


def test_label_text_rows_are_scaled_unit_embeddings_and_padding_is_zero():
  label_tokens = np.array([[1, 2], [3, 0], [5, 5]])
  # A stand-in encoder: E(z) = (sum of ids, count of nonzero ids, 0).
  embed_rows = lambda t: np.stack([t.sum(1), (t > 0).sum(1), 0 * t[:, 0]], 1).astype(float)
  w = np.asarray(
    classifier_init.initial_classifier(
      _config("label_text", 2.0), 4, 3, 0, label_tokens, embed_rows
    )
  )
  expect = 2.0 * np.array(
    [[3, 2, 0] / np.sqrt(13), [3, 1, 0] / np.sqrt(10), [10, 2, 0] / np.sqrt(104)]
  )
  np.testing.assert_allclose(w[:3], expect, rtol=1e-6)
  np.testing.assert_array_equal(w[3], 0)


def test_label_text_needs_label_texts_and_known_inits():
  with pytest.raises(InputError, match="needs label texts"):
    classifier_init.initial_classifier(_config("label_text"), 4, 3, 0, None, None)
  with pytest.raises(InputError, match=r"classifier\.init"):
    config_base.validate(_config("zeros"))
  with pytest.raises(InputError, match="init_scale"):
    config_base.validate(_config("label_text", 0.0))


@pytest.mark.parametrize("init", ["normal", "label_text"])
def test_w_is_born_split_over_model_with_the_unsplit_rows(init, monkeypatch):
  from jax.sharding import NamedSharding, PartitionSpec as P

  from astra_jax.parallel import sharding

  mesh = sharding.make_mesh(2, 4, jax.devices()[:8])
  label_tokens = np.arange(22).reshape(11, 2)
  calls = []

  def embed_rows(t):
    calls.append(len(t))
    return np.stack([t.sum(1), t[:, 0], np.ones(len(t))], 1).astype(float)

  target = NamedSharding(mesh, P("model"))
  monkeypatch.setattr(classifier_init, "_EMBED_CHUNK", 2)
  w = classifier_init.initial_classifier(_config(init), 12, 3, 5, label_tokens, embed_rows, target)
  assert w.sharding.is_equivalent_to(target, 2)
  # Each shard computed where it lives (4 shards of 3 rows, the last one 2 labels + padding),
  # its label texts embedded 2 at a time.
  assert init == "normal" or (max(calls) <= 2 and sum(calls) == 11)
  calls.clear()
  whole = classifier_init.initial_classifier(_config(init), 12, 3, 5, label_tokens, embed_rows)
  np.testing.assert_array_equal(np.asarray(w), np.asarray(whole))


def test_skipped_labels_are_not_embedded_and_start_at_zero():
  """A run continued from an export embeds only the labels the export lacks."""
  label_tokens = np.arange(10).reshape(5, 2)
  seen = []

  def embed_rows(t):
    seen.extend(t[:, 0].tolist())
    return np.stack([t.sum(1), np.ones(len(t))], 1).astype(float)

  skip = np.array([True, False, True, True, False])
  w = np.asarray(
    classifier_init.initial_classifier(
      _config("label_text"), 6, 2, 0, label_tokens, embed_rows, skip=skip
    )
  )
  assert sorted(seen) == [2, 8]  # the first tokens of labels 1 and 4 only
  np.testing.assert_array_equal(w[[0, 2, 3, 5]], 0)
  # Labels 1 and 4: (sum, 1) normalised, as without skip: (5, 1) and (17, 1).
  np.testing.assert_allclose(w[1], np.array([5, 1]) / np.sqrt(26), rtol=1e-6)
  np.testing.assert_allclose(w[4], np.array([17, 1]) / np.sqrt(290), rtol=1e-6)
