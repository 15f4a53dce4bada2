"""The siamese warm-start stage: its loss by hand, its pairs, that it learns, and resume."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from astra_jax.data.sparse_rows import SparseRows, WithLabelRows
from astra_jax.model.ngram_bag import NgramBagEncoder
from astra_jax.model.ngram_bag_config import NgramBagConfig
from astra_jax.training import warmstart


def test_loss_by_hand_with_a_shared_label_masked():
  q = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
  z = np.array([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
  labels = np.array([7, 9, 7])  # pairs 0 and 2 share label 7: neither is the other's negative
  got = float(
    warmstart.in_batch_softmax_loss(jnp.asarray(q), jnp.asarray(z), jnp.asarray(labels), 5.0)
  )
  qn = q / np.linalg.norm(q, axis=1, keepdims=True)
  zn = z / np.linalg.norm(z, axis=1, keepdims=True)
  logits = 5.0 * qn @ zn.T
  want = []
  for i, negatives in [(0, [1]), (1, [0, 2]), (2, [1])]:
    cols = [i] + negatives
    want.append(-(logits[i, i] - np.log(np.exp(logits[i, cols]).sum())))
  np.testing.assert_allclose(got, np.mean(want), rtol=1e-5)


def test_pairs_are_the_original_rows_positives():
  base = SparseRows(np.array([0, 2, 2, 3]), np.array([4, 1, 0]), None, 5)
  pairs = warmstart.TrainingPairs(WithLabelRows(base), 3)
  assert len(pairs) == 3
  rows, labels = pairs.take(np.arange(3))
  np.testing.assert_array_equal(rows, [0, 0, 2])
  np.testing.assert_array_equal(labels, [4, 1, 0])
  assert labels.dtype == np.int32


def test_pairs_taken_in_any_order_match_the_listed_pairs():
  """Pair p of every (row, positive) pair listed by hand in row order, for any p, through
  rows without labels and the label-text rows after the original ones (never paired)."""
  lists = [[3], [], [], [0, 2, 5], [1], [], [4, 0]]
  base = SparseRows.from_lists(lists, 6)
  base = SparseRows(base.indptr, base.indices, None, 6)
  listed = [(r, l) for r, row in enumerate(lists) for l in row]
  for labels in (base, WithLabelRows(base)):
    pairs = warmstart.TrainingPairs(labels, len(lists))
    assert len(pairs) == len(listed)
    ids = np.array([6, 0, 3, 3, 1, 5, 2, 4])
    rows, got = pairs.take(ids)
    assert list(zip(rows.tolist(), got.tolist())) == [listed[i] for i in ids]


def test_an_epoch_takes_every_pair_once_or_the_pairs_asked():
  rng = np.random.default_rng(0)
  np.testing.assert_array_equal(np.sort(warmstart.epoch_pairs(10, 0, rng)), np.arange(10))
  np.testing.assert_array_equal(np.sort(warmstart.epoch_pairs(10, 50, rng)), np.arange(10))
  drawn = warmstart.epoch_pairs(1000, 300, rng)
  assert len(drawn) == 300 and drawn.min() >= 0 and drawn.max() < 1000
  # Uniform: each tenth of 10^6 pairs gets about a tenth of 10^5 draws (sd ~95).
  counts = np.bincount(warmstart.epoch_pairs(10**6, 100_000, rng) // 10**5, minlength=10)
  assert np.all(np.abs(counts - 10_000) < 500), counts


def _problem(n_labels=40, per_label=6, seed=0):
  """Each label has a text of 6 tokens and 4 query words of its own, disjoint from every
  text: a query (3 of its label's query words) shares no token with its label's text, so at
  random init it is nearest its own text by chance only (1 in 40); a stage that learns
  places it nearest."""
  rng = np.random.default_rng(seed)
  texts = rng.integers(1, 500, size=(n_labels, 6)).astype(np.int32)
  words = 1000 + np.arange(n_labels * 4).reshape(n_labels, 4)
  labels = np.repeat(np.arange(n_labels), per_label)
  queries = np.stack([rng.choice(words[l], 3, replace=False) for l in labels]).astype(np.int32)
  rows = SparseRows(np.arange(len(labels) + 1), labels, None, n_labels)
  return queries, texts, rows


def _config(epochs, checkpoint_minutes=None):
  c = ml_collections.ConfigDict()
  if checkpoint_minutes is not None:
    c.checkpoint = ml_collections.ConfigDict({"every_minutes": checkpoint_minutes})
  c.data = ml_collections.ConfigDict({"dir": "synthetic"})
  c.train = ml_collections.ConfigDict({"seed": 0})
  c.warmstart = ml_collections.ConfigDict(
    dict(epochs=epochs, batch_size=32, lr=3e-2, warmup_steps=2, inverse_temperature=20.0)
  )
  return c


def _encoder():
  enc = NgramBagEncoder(
    NgramBagConfig(hidden_size=16, hash_buckets=4096, ngram_orders=1), nnx.Rngs(params=0)
  )
  return nnx.split(enc, nnx.Param)


def _positive_rank_accuracy(graphdef, params, queries, texts, rows):
  model = nnx.merge(graphdef, params)
  q, z = np.array(model.pooled(queries)), np.array(model.pooled(texts))
  q /= np.linalg.norm(q, axis=1, keepdims=True)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  return float(np.mean(np.argmax(q @ z.T, 1) == rows.indices))


def test_stage_learns_and_resumes_exactly(tmp_path, monkeypatch):
  queries, texts, rows = _problem()
  pairs = warmstart.TrainingPairs(rows, rows.num_rows)
  graphdef, start = _encoder()
  before = _positive_rank_accuracy(graphdef, start, queries, texts, rows)
  straight = warmstart.run(
    _config(4), graphdef, start, queries, texts, pairs, str(tmp_path / "straight")
  )
  after = _positive_rank_accuracy(graphdef, straight, queries, texts, rows)
  assert before < 0.2 and after > 0.9, (before, after)
  # Killed in its third epoch, rerun: resumes after epoch 2 and ends where the straight run did.
  make_step, calls = warmstart._make_step, []

  def dying_step(*args):
    step = make_step(*args)

    def run_step(*a):
      calls.append(1)
      if len(calls) > 2 * (len(pairs) // 32):
        raise KeyboardInterrupt("killed")
      return step(*a)

    return run_step

  monkeypatch.setattr(warmstart, "_make_step", dying_step)
  graphdef, start = _encoder()
  with pytest.raises(KeyboardInterrupt):
    warmstart.run(_config(4), graphdef, start, queries, texts, pairs, str(tmp_path / "resumed"))
  monkeypatch.setattr(warmstart, "_make_step", make_step)
  graphdef, start = _encoder()
  resumed = warmstart.run(
    _config(4), graphdef, start, queries, texts, pairs, str(tmp_path / "resumed")
  )
  for (path, a), (_, b) in zip(nnx.to_flat_state(straight), nnx.to_flat_state(resumed)):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), path)


def test_stage_saves_on_the_checkpoint_clock_and_always_at_its_end(tmp_path, monkeypatch):
  queries, texts, rows = _problem()
  pairs = warmstart.TrainingPairs(rows, rows.num_rows)
  saved, save = [], warmstart.ocp.CheckpointManager.save
  monkeypatch.setattr(
    warmstart.ocp.CheckpointManager,
    "save",
    lambda m, step, **kw: saved.append(step) or save(m, step, **kw),
  )
  graphdef, start = _encoder()
  straight = warmstart.run(_config(3), graphdef, start, queries, texts, pairs, str(tmp_path / "a"))
  assert saved == [1, 2, 3]  # no checkpoint clock: every epoch
  saved.clear()
  graphdef, start = _encoder()
  rare = warmstart.run(
    _config(3, checkpoint_minutes=60.0), graphdef, start, queries, texts, pairs, str(tmp_path / "b")
  )
  assert saved == [3]  # an hour between saves: only the end
  for (path, a), (_, b) in zip(nnx.to_flat_state(straight), nnx.to_flat_state(rare)):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), path)

  def no_step(*args):
    raise AssertionError("a finished stage trained again")

  monkeypatch.setattr(warmstart, "_make_step", lambda *a: no_step)
  graphdef, start = _encoder()
  again = warmstart.run(
    _config(3, 60.0), graphdef, start, queries, texts, pairs, str(tmp_path / "b")
  )
  for (path, a), (_, b) in zip(nnx.to_flat_state(rare), nnx.to_flat_state(again)):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), path)


def test_no_label_texts_is_a_config_error(tmp_path):
  from astra_jax.runtime.errors import InputError

  queries, texts, rows = _problem()
  graphdef, start = _encoder()
  with pytest.raises(InputError, match=r"warmstart\.epochs=2"):
    warmstart.run(
      _config(2),
      graphdef,
      start,
      queries,
      None,
      warmstart.TrainingPairs(rows, rows.num_rows),
      str(tmp_path),
    )


def test_pairs_per_epoch_sets_the_steps_and_still_learns(tmp_path, monkeypatch):
  """With warmstart.pairs_per_epoch, an epoch is that many drawn pairs (here 2/3 of them:
  5 steps of 32 instead of 7), and the stage still places queries nearest their texts."""
  queries, texts, rows = _problem()
  pairs = warmstart.TrainingPairs(rows, rows.num_rows)
  assert len(pairs) // 32 == 7
  make_step, calls = warmstart._make_step, []

  def counted(*args):
    step = make_step(*args)
    return lambda *a: calls.append(1) or step(*a)

  monkeypatch.setattr(warmstart, "_make_step", counted)
  config = _config(6)
  config.warmstart.pairs_per_epoch = 160
  graphdef, start = _encoder()
  trained = warmstart.run(config, graphdef, start, queries, texts, pairs, str(tmp_path))
  assert len(calls) == 6 * 5
  assert _positive_rank_accuracy(graphdef, trained, queries, texts, rows) > 0.9


def test_a_mesh_splits_the_pairs_and_trains_as_one_device(tmp_path):
  """On a 4 x 2 mesh each of the 8 devices encodes 4 of a step's 32 pairs: the stage ends
  where the one-device stage does (up to float reassociation), its parameters replicated
  over the mesh; a batch the devices do not divide runs on one device."""
  from astra_jax.parallel import sharding

  queries, texts, rows = _problem()
  pairs = warmstart.TrainingPairs(rows, rows.num_rows)
  graphdef, start = _encoder()
  alone = warmstart.run(_config(2), graphdef, start, queries, texts, pairs, str(tmp_path / "a"))
  mesh = sharding.make_mesh(4, 2)
  graphdef, start = _encoder()
  split = warmstart.run(
    _config(2), graphdef, start, queries, texts, pairs, str(tmp_path / "b"), mesh
  )
  for (path, a), (_, b) in zip(nnx.to_flat_state(alone), nnx.to_flat_state(split)):
    assert b.get_value().sharding.is_fully_replicated and len(b.get_value().devices()) == 8
    np.testing.assert_allclose(
      np.asarray(a.get_value()), np.asarray(b.get_value()), rtol=2e-4, atol=2e-5, err_msg=path
    )
  assert warmstart._batch_placement(mesh, 36) is None
