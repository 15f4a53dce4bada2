"""The paper's Figure 1 setting: a label subset, hard-only negatives (k_r = 0), the encoder
started from an exported model, and the motivation table's runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from astra_jax import reproduce
from astra_jax.config import base as config_base
from astra_jax.data import label_subset
from astra_jax.data.dataset import RowConcat, XCData
from astra_jax.data.sparse_rows import SparseRows, WithLabelRows
from astra_jax.model import factory
from astra_jax.negatives.sampler import NegativeSampler
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export
from astra_jax.training import encoder_init, steps
from astra_jax.xc import loss

L = 8
TRAIN_ROWS = [[0, 3], [1], [2, 5, 7], [4], [6, 1], [3, 4], [7], [5, 0]]
TEST_ROWS = [[1, 2], [6], [0, 7], [3]]


def _data(augmented: bool) -> XCData:
  n = len(TRAIN_ROWS)
  tokens = np.arange(n * 3, dtype=np.int32).reshape(n, 3)
  label_tokens = 1000 + np.arange(L * 3, dtype=np.int32).reshape(L, 3)
  labels = SparseRows.from_lists(TRAIN_ROWS, L)
  train_tokens = RowConcat(tokens, label_tokens) if augmented else tokens
  train_labels = WithLabelRows(labels) if augmented else labels
  test_tokens = 500 + np.arange(len(TEST_ROWS) * 3, dtype=np.int32).reshape(-1, 3)
  return XCData(
    "d",
    L,
    train_tokens,
    train_labels,
    test_tokens,
    SparseRows.from_lists(TEST_ROWS, L),
    label_tokens,
    np.array([[0, 2], [1, 6], [2, 3]]),
    0,
    2000,
    n,
  )


def _restricted(rows, kept):
  """Independent truth: each row's labels among `kept`, renumbered by rank; rows left empty
  are dropped. Returns (kept row ids, their label lists)."""
  rank = {l: i for i, l in enumerate(sorted(kept))}
  out = [(i, [rank[l] for l in r if l in rank]) for i, r in enumerate(rows)]
  return [i for i, r in out if r], [r for _, r in out if r]


@pytest.mark.parametrize("augmented", [False, True])
def test_label_subset_keeps_every_query_with_a_kept_positive(augmented):
  data = _data(augmented)
  kept = label_subset.sample_labels(L, 3, seed=5)
  assert len(set(kept.tolist())) == 3 and list(kept) == sorted(kept)
  sub = label_subset.restrict(data, 3, seed=5)
  train_ids, train_lists = _restricted(TRAIN_ROWS, kept)
  test_ids, test_lists = _restricted(TEST_ROWS, kept)
  n = len(train_ids)
  assert sub.num_labels == 3 and sub.num_train_original == n
  assert [sub.train_labels.row(i).tolist() for i in range(n)] == train_lists
  assert [sub.test_labels.row(i).tolist() for i in range(len(test_ids))] == test_lists
  np.testing.assert_array_equal(sub.train_tokens[np.arange(n)], data.train_tokens[train_ids])
  np.testing.assert_array_equal(
    sub.test_tokens[np.arange(len(test_ids))], data.test_tokens[test_ids]
  )
  np.testing.assert_array_equal(sub.label_tokens, data.label_tokens[kept])
  if augmented:  # one label-text row per kept label, after the queries
    assert sub.train_labels.num_rows == n + 3
    assert [sub.train_labels.row(n + j).tolist() for j in range(3)] == [[0], [1], [2]]
    np.testing.assert_array_equal(sub.train_tokens[np.arange(n, n + 3)], data.label_tokens[kept])
  # Filter pairs: those of kept test rows and kept labels, renumbered.
  rank = {l: i for i, l in enumerate(kept)}
  want = [
    [test_ids.index(r), rank[l]]
    for r, l in data.test_filter.tolist()
    if r in test_ids and l in rank
  ]
  assert sub.test_filter.tolist() == want


def test_label_subset_errors():
  with pytest.raises(InputError, match="label_subset=9"):
    label_subset.restrict(_data(False), 9, seed=0)


def _config(strategy, k_h, k_r):
  c = config_base.base_config()
  c.data.dir, c.data.tokenizer_dir = "d", "t"
  c.negatives.strategy, c.negatives.k_h, c.negatives.k_r = strategy, k_h, k_r
  return c


def test_k_r_zero_only_where_hard_negatives_stand_alone():
  for strategy in ("uptodate", "w_hard", "e_hard"):
    config_base.validate(_config(strategy, 200, 0))
  for strategy in ("random+w_hard", "random", "curriculum", "full"):
    with pytest.raises(InputError, match=r"negatives\.k_r"):
      config_base.validate(_config(strategy, 200, 0))
  with pytest.raises(InputError, match="k_h \\+ k_r"):
    config_base.validate(_config("uptodate", 0, 0))


def _softplus(x):
  return np.logaddexp(0.0, x)


def test_uptodate_with_no_random_negatives_is_the_hard_only_loss():
  """k_r = 0: the estimator is the positives' terms plus the k hardest non-positives' at
  weight 1 (no random term), computed by hand from the dense scores."""
  rng = np.random.default_rng(0)
  labels = SparseRows.from_lists([[0, 3], [5], [1, 2, 6]], L)
  sampler = NegativeSampler(labels, k_p=3, k_h=2, k_r=0, per_query_random=True, all_positives=3)
  batch = sampler(np.arange(3), rng, num_random=0)
  assert batch.rand_ids.shape == (3, 0)
  emb = rng.normal(size=(3, 4)).astype(np.float32)
  w = rng.normal(size=(L, 4)).astype(np.float32)
  device_batch = jax.tree.map(jnp.asarray, batch)
  mined = steps.mine_in_step(jnp.asarray(emb), jnp.asarray(w), device_batch, 2)
  got = float(loss.sampled_bce(jnp.asarray(emb), jnp.asarray(w), mined))
  scores = emb @ w.T
  want = []
  for i, pos in enumerate([[0, 3], [5], [1, 2, 6]]):
    neg = sorted((l for l in range(L) if l not in pos), key=lambda l: -scores[i, l])[:2]
    want.append(_softplus(-scores[i, pos]).sum() + _softplus(scores[i, neg]).sum())
  assert got == pytest.approx(np.mean(want), rel=1e-5)


def test_encoder_starts_from_an_exported_model(tmp_path):
  c = config_base.base_config()
  c.encoder.hidden_size, c.encoder.intermediate_size = 16, 32
  trained = factory.build_encoder(c, vocab_size=50, pad_id=0, seed=1)
  params = nnx.state(trained, nnx.Param)
  tok = tmp_path / "tok"
  tok.mkdir()
  (tok / "vocab.txt").write_text("a\n")
  export.save_model(
    str(tmp_path / "run"),
    encoder_cfg=trained.cfg,
    encoder_params=params,
    classifier=np.zeros((3, 16), np.float32),
    tokenizer_dir=str(tok),
    max_len=8,
    pad_id=0,
  )
  c.encoder.init_from_workdir = str(tmp_path / "run")
  started = encoder_init.start_encoder(c, vocab_size=50, pad_id=0, seed=2)
  want = dict(nnx.to_flat_state(params))
  got = dict(nnx.to_flat_state(nnx.state(started, nnx.Param)))
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k].get_value()), np.asarray(want[k].get_value()))
  # ... which a fresh encoder of that seed is not
  c.encoder.init_from_workdir = ""
  fresh = factory.build_encoder(c, vocab_size=50, pad_id=0, seed=2)
  assert any(
    not np.array_equal(np.asarray(v.get_value()), np.asarray(want[k].get_value()))
    for k, v in nnx.to_flat_state(nnx.state(fresh, nnx.Param))
  )
  c.encoder.init_from_workdir = str(tmp_path / "run")
  c.encoder.hidden_size, c.encoder.intermediate_size = 32, 64
  with pytest.raises(InputError, match="init_from_workdir"):
    encoder_init.start_encoder(c, vocab_size=50, pad_id=0, seed=2)


def test_motivation_table_runs(tmp_path):
  runs = [r.at(str(tmp_path)) for r in reproduce.TABLES["motivation"].runs(0.01, 3, 1)]
  pretrain, rest = runs[0], runs[1:]
  assert [r.name for r in rest] == ["uptodate", "stale", "astra", "full"]
  pre = pretrain.config()
  assert pre.data.label_subset == 0 and pre.encoder.init_from_workdir == ""
  want = {
    "uptodate": ("uptodate", 200, 0),
    "stale": ("w_hard", 200, 0),
    "astra": ("random+w_hard", 200, 200),
  }
  for r in rest:
    c = r.config()
    c.data.tokenizer_dir = "t"  # filled in when a run starts
    config_base.validate(c)  # k_r = 0 accepted
    n = c.negatives
    if r.name in want:
      assert (n.strategy, n.k_h, n.k_r) == want[r.name]
    else:
      assert n.strategy == "full"
    assert c.encoder.init_from_workdir == reproduce.run_dir(str(tmp_path), pretrain)
    assert (c.data.label_subset, c.data.dir) == (1000, pre.data.dir)
    assert c.data.synthetic.to_dict() == pre.data.synthetic.to_dict()
    assert c.data.synthetic.num_labels > 4 * 1000  # a sample, not nearly all the labels
    assert (n.tau_s, c.train.epochs) == (0, 3)


def test_motivation_table_and_plot_from_hand_made_results(tmp_path):
  pytest.importorskip("matplotlib")
  curves = {
    "uptodate": [50.0, 70.0],
    "stale": [40.0, 45.0],
    "astra": [48.0, 68.0],
    "full": [55.0, 72.0],
  }
  results = {
    n: {
      "P@1": c[-1],
      "train_time_s": 10.0 * (i + 1),
      "evaluations": [{"epoch": e + 1, "P@1": p} for e, p in enumerate(c)],
    }
    for i, (n, c) in enumerate(curves.items())
  }
  rows = reproduce.plot_motivation(results, str(tmp_path / "m.png"))
  assert rows[0] == ["epoch", "uptodate P@1", "stale P@1", "astra P@1", "full P@1"]
  assert rows[1] == ["1", "50.00", "40.00", "48.00", "55.00"]
  assert rows[2] == ["2", "70.00", "45.00", "68.00", "72.00"]
  assert rows[3] == ["final (test)", "70.00", "45.00", "68.00", "72.00"]
  assert rows[4] == ["train s", "10", "20", "30", "40"]
  assert (tmp_path / "m.png").stat().st_size > 0
