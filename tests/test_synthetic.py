import filecmp
import json

import numpy as np
import pytest

from astra_jax.data import synthetic, xc_format
from astra_jax.data.synthetic import SyntheticSpec

SPEC = SyntheticSpec(num_labels=400, num_train=3000, num_test=500, vocab_size=3000, seed=3)


def test_written_files_parse_and_are_deterministic(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  stats = synthetic.generate(str(a), SPEC)
  synthetic.generate(str(b), SPEC)
  for name in ("trn_X.txt", "tst_X.txt", "Y.txt", "trn_X_Y.txt", "tst_X_Y.txt"):
    assert filecmp.cmp(a / name, b / name, shallow=False), name
  trn = xc_format.read_sparse(a / "trn_X_Y.txt", 400)
  assert trn.num_rows == 3000 == len(xc_format.read_texts(a / "trn_X.txt"))
  assert len(xc_format.read_texts(a / "Y.txt")) == 400
  assert 1 <= trn.row_lengths().min() and trn.row_lengths().max() <= SPEC.max_labels
  assert stats["train_labels_seen"] > 300
  other = tmp_path / "c"
  synthetic.generate(str(other), SyntheticSpec(**{**SPEC.__dict__, "seed": 4}))
  assert not filecmp.cmp(a / "trn_X.txt", other / "trn_X.txt", shallow=False)


def test_worker_processes_write_the_same_files(tmp_path, monkeypatch):
  # Small chunks, so that the 3,000 training queries come from six of them, spread over two
  # spawned processes and written back in order.
  monkeypatch.setattr(synthetic, "_CHUNK", 500)
  contexts = []
  get_context = synthetic.multiprocessing.get_context
  monkeypatch.setattr(
    synthetic.multiprocessing, "get_context", lambda m: contexts.append(m) or get_context(m)
  )
  synthetic.generate(str(tmp_path / "one"), SPEC, workers=1)
  assert contexts == []  # one process: no pool
  synthetic.generate(str(tmp_path / "two"), SPEC, workers=2)
  assert contexts == ["spawn"]  # the second run's chunks came from worker processes
  for name in ("trn_X.txt", "tst_X.txt", "Y.txt", "trn_X_Y.txt", "tst_X_Y.txt"):
    assert filecmp.cmp(tmp_path / "one" / name, tmp_path / "two" / name, shallow=False), name


def test_rows_hold_the_specified_mean_label_count(tmp_path):
  # Many labels per row from a few head labels and small groups: duplicate draws are
  # frequent, and each must be drawn again for the rows to keep the spec's mean.
  spec = SyntheticSpec(
    num_labels=300,
    num_train=4000,
    num_test=100,
    vocab_size=3000,
    mean_labels=8.0,
    max_labels=30,
    zipf_exponent=1.0,
    seed=5,
  )
  synthetic.generate(str(tmp_path), spec)
  lengths = xc_format.read_sparse(tmp_path / "trn_X_Y.txt", 300).row_lengths()
  # E[min(1 + Poisson(7), 30)] = 8 up to a 1e-9 tail; its s.e. over 4000 rows is 0.042.
  assert abs(lengths.mean() - 8.0) < 0.15, lengths.mean()
  tiny = SyntheticSpec(
    num_labels=3, num_train=200, num_test=10, vocab_size=300, mean_labels=5.0, max_labels=10, seed=5
  )
  synthetic.generate(str(tmp_path / "tiny"), tiny)  # rows cannot exceed the 3 labels
  tiny_lengths = xc_format.read_sparse(tmp_path / "tiny" / "trn_X_Y.txt", 3).row_lengths()
  # E[min(1 + Poisson(4), 3)] = e^-4 (1 + 2 * 4) + 3 (1 - 5 e^-4) = 2.890; s.e. 0.025
  assert tiny_lengths.max() <= 3 and abs(tiny_lengths.mean() - 2.890) < 0.1, tiny_lengths.mean()


def test_is_current_names_spec_and_generator(tmp_path):
  assert not synthetic.is_current(str(tmp_path), SPEC)
  synthetic.generate(str(tmp_path), SPEC)
  assert synthetic.is_current(str(tmp_path), SPEC)
  assert not synthetic.is_current(str(tmp_path), SyntheticSpec(**{**SPEC.__dict__, "seed": 4}))
  stats = json.loads((tmp_path / "synthetic.json").read_text())
  del stats["generator"]  # written by the first generator, which dropped duplicate draws
  (tmp_path / "synthetic.json").write_text(json.dumps(stats))
  assert not synthetic.is_current(str(tmp_path), SPEC)


def test_power_law_head_and_tail(tmp_path):
  stats = synthetic.generate(str(tmp_path), SPEC)
  deciles = stats["label_deciles_pct"]
  # Like the paper's decile table: the head decile holds few labels, the tail decile many.
  assert deciles[0] < 3 and deciles[-1] > 25 and deciles == sorted(deciles)


def test_decile_shares_hand_case():
  # counts 6,2,1,1 (10 pairs): cumulative starts 0, .6, .8, .9 -> deciles 0, 6, 8, 9
  shares = synthetic.decile_label_shares(np.array([1, 6, 0, 2, 1]))
  np.testing.assert_allclose(shares, [0.25, 0, 0, 0, 0, 0, 0.25, 0, 0.25, 0.25])


def test_confusable_groups_and_queries_use_label_words(tmp_path):
  synthetic.generate(str(tmp_path), SPEC)
  labels = [t.split() for t in xc_format.read_texts(tmp_path / "Y.txt")]
  g = SPEC.group_size
  # Labels of one group share their group words, labels of different groups rarely do.
  assert labels[0][: SPEC.group_words] == labels[g - 1][: SPEC.group_words]
  assert labels[0][: SPEC.group_words] != labels[g][: SPEC.group_words]
  assert labels[0] != labels[1]
  texts = [t.split() for t in xc_format.read_texts(tmp_path / "trn_X.txt")]
  trn = xc_format.read_sparse(tmp_path / "trn_X_Y.txt")
  overlap = np.mean([len(set(texts[i]) & set(labels[trn.row(i)[0]])) > 0 for i in range(500)])
  assert overlap > 0.95


def test_tokenizer_round_trip(tmp_path):
  synthetic.generate(str(tmp_path), SPEC)
  from astra_jax.data.tokenize import load_tokenizer

  tok = load_tokenizer(str(tmp_path / "tokenizer"))
  text = xc_format.read_texts(tmp_path / "Y.txt")[0]
  ids = tok(text)["input_ids"]
  assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
  assert tok.unk_token_id not in ids and len(ids) == len(text.split()) + 2
  assert tok.pad_token_id == 0


def test_bounded_memory_streaming(tmp_path):
  # Memory is O(L) (a permutation and a CDF), not O(L x text): generating 4x the labels
  # must not grow the Python heap's peak by more than the O(L) arrays.
  import tracemalloc

  peaks = []
  for L in (150_000, 450_000):  # both above the 65536-label chunk
    spec = SyntheticSpec(num_labels=L, num_train=100, num_test=10, vocab_size=5000)
    tracemalloc.start()
    synthetic.generate(str(tmp_path / str(L)), spec)
    peaks.append(tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
  per_label = (peaks[1] - peaks[0]) / 300_000
  # A few 8-byte arrays per label; keeping one Python str per label would cost > 50 bytes.
  assert per_label < 48, per_label


def test_hidden_own_words_leave_the_label_texts_and_nothing_else(tmp_path):
  hidden = SyntheticSpec(**{**SPEC.__dict__, "hidden_own_words": 1})
  synthetic.generate(str(tmp_path / "all"), SPEC)
  synthetic.generate(str(tmp_path / "hidden"), hidden)
  for name in ("trn_X.txt", "tst_X.txt", "trn_X_Y.txt", "tst_X_Y.txt"):  # the same queries
    assert filecmp.cmp(tmp_path / "all" / name, tmp_path / "hidden" / name, shallow=False)
  full = [t.split() for t in xc_format.read_texts(tmp_path / "all" / "Y.txt")]
  short = [t.split() for t in xc_format.read_texts(tmp_path / "hidden" / "Y.txt")]
  assert all(s == f[:-1] for s, f in zip(short, full)) and len(short) == len(full)
  # The left-out word still names its label in the queries.
  texts = [set(t.split()) for t in xc_format.read_texts(tmp_path / "all" / "trn_X.txt")]
  trn = xc_format.read_sparse(tmp_path / "all" / "trn_X_Y.txt")
  named = np.mean([full[trn.row(i)[0]][-1] in texts[i] for i in range(1000)])
  assert named > 0.5, named  # each own word of a positive: with probability 0.85
  with pytest.raises(ValueError, match="hidden_own_words 3"):
    synthetic.generate(
      str(tmp_path / "bad"), SyntheticSpec(**{**SPEC.__dict__, "hidden_own_words": 3})
    )


def test_data_written_before_a_spec_field_existed_stays_current(tmp_path):
  synthetic.generate(str(tmp_path), SPEC)
  stats = json.loads((tmp_path / "synthetic.json").read_text())
  del stats["spec"]["hidden_own_words"]  # synthetic.json of a generator without the field
  (tmp_path / "synthetic.json").write_text(json.dumps(stats))
  assert synthetic.is_current(str(tmp_path), SPEC)
  assert not synthetic.is_current(
    str(tmp_path), SyntheticSpec(**{**SPEC.__dict__, "hidden_own_words": 1})
  )
  stats["spec"]["field_of_a_later_version"] = 1
  (tmp_path / "synthetic.json").write_text(json.dumps(stats))
  assert not synthetic.is_current(str(tmp_path), SPEC)
  del stats["spec"]  # not written by the generator: no spec says what the data are
  (tmp_path / "synthetic.json").write_text(json.dumps(stats))
  assert not synthetic.is_current(str(tmp_path), SyntheticSpec())


TOPICS = SyntheticSpec(
  num_labels=2048,
  num_train=600,
  num_test=10,
  group_size=32,
  same_group_prob=0.95,
  mean_labels=6.0,
  max_labels=12,
  vocab_size=3000,
  topic_size=256,
  topic_words=16,
  seed=1,
)


def test_topics_own_the_words_their_groups_share(tmp_path):
  synthetic.generate(str(tmp_path), TOPICS)
  words = synthetic.vocabulary(TOPICS)
  index = {w: i for i, w in enumerate(words)}
  labels = [[index[w] for w in t.split()] for t in xc_format.read_texts(tmp_path / "Y.txt")]
  g, k = TOPICS.group_size, TOPICS.group_words
  assert len(words) == 3000 + (2048 // 256) * 16
  for label, ids in enumerate(labels):
    topic = label // TOPICS.topic_size
    first = 3000 + topic * 16  # topic t owns words 3000 + 16 t ... 3000 + 16 t + 15
    assert all(first <= w < first + 16 for w in ids[:k]), (label, ids)
    assert len(set(ids[:k])) == k  # distinct words
    assert ids[:k] == labels[label - label % g][:k]  # the group's words
    assert all(200 <= w < 3000 for w in ids[k:])  # own words: content words
  with pytest.raises(ValueError, match="whole groups"):
    synthetic.generate(
      str(tmp_path / "bad"), SyntheticSpec(**{**TOPICS.__dict__, "topic_size": 100})
    )


def _nearest_non_positive_labels(data_dir, spec, num_queries, k):
  """Each query's k labels sharing most words with it (bag-of-words counts) outside its
  positives' groups: the exact top-k a refresh looks for past a query's group-mates, with
  word counts as the embedding."""
  vocab = {w: i for i, w in enumerate(synthetic.vocabulary(spec))}

  def bag(texts):
    rows = np.zeros((len(texts), len(vocab)), np.float32)
    for i, t in enumerate(texts):
      for w in t.split():
        rows[i, vocab[w]] += 1
    return rows

  labels = bag(xc_format.read_texts(data_dir / "Y.txt"))
  queries = bag(xc_format.read_texts(data_dir / "trn_X.txt")[:num_queries])
  trn = xc_format.read_sparse(data_dir / "trn_X_Y.txt", spec.num_labels)
  scores = queries @ labels.T
  # Ties broken by a fixed random order, so a tie is not resolved toward low label ids.
  scores += np.random.default_rng(0).random(scores.shape, np.float32) * 1e-3
  g = spec.group_size
  for i in range(num_queries):
    for group in np.unique(trn.row(i) // g):
      scores[i, group * g : (group + 1) * g] = -np.inf
  return np.argsort(-scores, axis=1)[:, :k], [trn.row(i) for i in range(num_queries)]


def test_with_topics_a_querys_nearest_labels_are_in_its_topic(tmp_path):
  # The property topics exist for: a query's hard negatives lie in a neighbourhood of fixed
  # size (its topic), not spread over all labels as without topics.
  for spec, lo, hi in (
    (TOPICS, 0.9, 1.0),
    (SyntheticSpec(**{**TOPICS.__dict__, "topic_size": 0}), 0.0, 0.5),
  ):
    out = tmp_path / str(spec.topic_size)
    synthetic.generate(str(out), spec)
    nearest, positives = _nearest_non_positive_labels(out, spec, 200, 16)
    topic_of = lambda ids: np.asarray(ids) // 256  # noqa: E731
    share = np.mean(
      [
        np.mean(topic_of(nearest[i]) == np.bincount(topic_of(p)).argmax())
        for i, p in enumerate(positives)
      ]
    )
    # Without topics, 256-label blocks are arbitrary: 1/8 of the labels by chance.
    assert lo <= share <= hi, (spec.topic_size, share)


def test_vocab_per_label_grows_the_content_words_with_the_labels(tmp_path):
  grown = lambda L: SyntheticSpec(  # noqa: E731
    **{**TOPICS.__dict__, "num_labels": L, "vocab_size": 3000, "vocab_per_label": 0.05}
  )
  # By hand: 0.05 x 40,960 = 2,048 < 3,000 keeps the floor; 0.05 x 409,600 = 20,480.
  assert synthetic.content_vocab_size(grown(40_960)) == 3000
  assert synthetic.content_vocab_size(grown(409_600)) == 20_480
  assert synthetic.num_words(grown(409_600)) == 20_480 + (409_600 // 256) * 16
  # The labels sharing an own word stay ~own_words / vocab_per_label = 40 as L grows 4x;
  # with the vocabulary fixed they grow 4x.
  for per_label, ratio in ((0.05, 1.0), (0.0, 4.0)):
    shared = []
    for L in (102_400, 409_600):
      spec = SyntheticSpec(
        **{**TOPICS.__dict__, "num_labels": L, "vocab_size": 1200, "vocab_per_label": per_label}
      )
      own = synthetic.label_word_ids(spec, np.arange(L))[:, spec.group_words :]
      counts = np.bincount(own.ravel(), minlength=synthetic.content_vocab_size(spec))[200:]
      assert own.min() >= 200 and own.max() < synthetic.content_vocab_size(spec)
      shared.append(counts.mean())
    assert shared[1] / shared[0] == pytest.approx(ratio, rel=0.05), shared
  # Below the floor the data are those of a spec without the field, byte for byte.
  synthetic.generate(str(tmp_path / "fixed"), TOPICS)
  synthetic.generate(
    str(tmp_path / "floor"), SyntheticSpec(**{**TOPICS.__dict__, "vocab_per_label": 1.0})
  )
  for name in ("trn_X.txt", "trn_X_Y.txt", "Y.txt", "tst_X.txt"):
    assert filecmp.cmp(tmp_path / "fixed" / name, tmp_path / "floor" / name, shallow=False)
