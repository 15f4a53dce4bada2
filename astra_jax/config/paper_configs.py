"""The paper's appendix hyper-parameter table turned into configs (`experiments/<dataset>.py`).

Every value of the table is recorded unchanged under `config.paper`; the training fields
(global batch, per-shard k_h and k_r, k_p from POSITIVES_COVERED, the classifier's lr and
weight decay rescaled to our batch-mean loss, Renée's momentum and encoder Adam) are derived
from it with ml_collections FieldReferences, so they follow command-line overrides. A config
names the paper's encoder (`encoder.paper_encoder`, read from `$ASTRA_MODELS_DIR`); the
`:synthetic[,SCALE]` variant trains a tiny random BERT on a stand-in (`synthetic_variant`).
How each number translates, and where the paper is ambiguous: see docs/DESIGN.md, section 2.
"""

from __future__ import annotations

import math

import ml_collections
from ml_collections import FieldReference

from astra_jax.data import catalog
from astra_jax.model import encoder_source

PAPER_GPUS = 16
# Renée's encoder optimizer (main.py: FusedAdam eps 1e-6; --wd2, default 0.01, 0.001 in its
# Amazon-670K and Amazon-3M commands).
RENEE_ENCODER_ADAM_EPS = 1e-6
RENEE_ENCODER_DECAY = {"Amazon-670K": 1e-3, "Amazon-3M": 1e-3}
RENEE_ENCODER_DECAY_DEFAULT = 1e-2
# The published config.json of each encoder a paper config names: the planner sizes a
# missing one from it (training needs the files).
PAPER_ENCODER_SHAPES = {
  "sentence-transformers/msmarco-distilbert-base-v4": {
    "model_type": "distilbert",
    "dim": 768,
    "n_layers": 6,
    "n_heads": 12,
    "hidden_dim": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
  },
}
RENEE_CLASSIFIER_MOMENTUM = 0.9  # torch SGD's momentum in Renée's classifier optimizer
# Training queries (all epochs together) a default synthetic stand-in processes, so that it
# trains in minutes with the tiny BERT on a CPU (docs/results/paper_configs.md).
SYNTHETIC_QUERY_BUDGET = 400_000
TINY_ENCODER_LR = 2e-3  # the paper's lrs fine-tune a pretrained encoder; a random tiny
# BERT needs a larger one to learn at all (demo.py, xc_text.py:tiny)
# The paper's embedding dropout (0.7-0.85) regularises a pretrained 768-d encoder; on the
# tiny random BERT's 64-d E(x) it leaves ~10 live coordinates and training collapses to
# predicting the head label, so the stand-ins take the demo's value (measured:
# docs/results/paper_configs.md).
TINY_EMBEDDING_DROPOUT = 0.2
# Renée's classifier momentum (0.9) lowers a stand-in's P@1, even with a tenth of the lr, so
# the stand-ins' tables keep plain SGD; --config.optim.classifier_momentum=0.9 trains one
# as the real-data config does. Measured: docs/results/paper_configs.md. On real data
# (debian-recommends-20k) momentum with a tenth of the lr equals plain SGD, so the paper
# configs keep Renée's momentum with Renée's lr (docs/results/real_data_gpu.md).
STAND_IN_CLASSIFIER_MOMENTUM = 0.0
# The real-data stages (`set_real_data_stages`), as experiments/xc_text.py's MiniLM recipe
# chose them on debian-recommends-20k's validation split (docs/real_data.md).
STAGED_WARMSTART_EPOCHS = 10
STAGED_WARMSTART_BATCH = 512
STAGED_WARMSTART_LR = 1e-4
STAGED_LABEL_TEXT_WEIGHT = 0.5
STAGED_LABEL_TEXT_SCALE = 5.0
# Fewest negatives per query a stand-in keeps (k_h + k_r) when the paper's share of the
# labels would leave fewer (SS-20M at 1e-4: 0.2).
SYNTHETIC_MIN_NEGATIVES = 64
# The share of training rows whose positives all fit in k_p (negatives.k_p above).
POSITIVES_COVERED = 0.999
# Own words (of 2) a stand-in label's text leaves out: with all of them in it, the text
# alone ranks labels better than the trained classifiers do, where on the real data
# text-only dual encoders rank worse than ASTRA (the paper's tab:dualencoder). Calibrated
# with benchmarks/label_text_share.py: docs/results/paper_configs.md.
STAND_IN_HIDDEN_OWN_WORDS = 1
# The full-label stand-in (`full_label_variant`): queries by default (the example
# for SS-20M), test rows (enough for a P@1 to +-0.5 points), and the negatives per query a
# CPU step affords (a batch of 2,048 gathers B x (k_p + k_h + k_r) rows of W).
FULL_LABEL_NUM_TRAIN = 1_000_000
FULL_LABEL_NUM_TEST = 10_000
# Content words: with the stand-in's 8,000, each of SS-20M's 19M labels would share each of
# its own words with ~5,000 others.
FULL_LABEL_VOCAB_SIZE = 50_000
# ... and more with more labels: a fixed vocabulary gives each own word 40 labels at 10^6
# labels and 400 at 10^7, and the labels sharing a query's words outside its topic grow
# with L (docs/results/paper_configs.md). 0.05 words per label is 50,000 at 10^6 labels.
FULL_LABEL_VOCAB_PER_LABEL = 0.05
# The n-gram bag's table grows with that vocabulary (encoder.ngram.buckets_per_token), so
# the share of words that collide stays that of 10^6 labels' 2^18 buckets
# (docs/results/paper_configs.md).
FULL_LABEL_BUCKETS_PER_TOKEN = 3
# A query's positives: SS-20M's 26 per query are bid phrases of one intent, near-duplicates
# of each other, not 26 unrelated labels. The stand-in draws them from one group of this
# many confusable labels (the first by popularity, each further one from its group with
# FULL_LABEL_SAME_GROUP_PROB): with :synthetic's small, loose groups a query's exact top-k
# are near-ties spread over all of W, which no fixed-cost search finds
# (docs/results/paper_configs.md).
FULL_LABEL_GROUP_SIZE = 32
FULL_LABEL_SAME_GROUP_PROB = 0.95
# Topics (synthetic.py): groups of a topic draw their shared words from the topic's own
# FULL_LABEL_TOPIC_WORDS words, so a query's near-ties lie in its topic, where a fixed-cost
# search finds them; too few words make a topic's groups near-copies of each other. Why
# 1,024 labels and 16 words: docs/results/paper_configs.md.
FULL_LABEL_TOPIC_SIZE = 1024
FULL_LABEL_TOPIC_WORDS = 16
# The n-gram bag's orders: the stand-in's queries are shuffled bags of words, so their
# bigrams and trigrams are random word pairs, 2/3 of the bag's inputs and pure noise; why
# unigrams: docs/results/paper_configs.md.
FULL_LABEL_NGRAM_ORDERS = 1
# The classifier's lr. With 0.1 training queries per label (10^5 queries, 10^6 labels) the
# random negatives' pushes (weight L / k_r = 4,464) dominate every row, and a larger lr
# (the paper's 0.01 per query x 2,048 = 20, or 1.0) blows W's rows up and P@1 down
# (docs/results/paper_configs.md).
FULL_LABEL_CLASSIFIER_LR = 0.01
FULL_LABEL_K_H = 32
FULL_LABEL_K_R = 224
# The refresh at a fixed cost per query: FULL_LABEL_ROWS_PER_QUERY rows scored
# (negatives.index.rows_per_query) in leaves of FULL_LABEL_LEAF_ROWS rows at 10^6 rows per
# W shard, shrinking as 1 / sqrt(rows) above (FULL_LABEL_LEAF_SHRINK; 632 at 10^7), built in
# groups of FULL_LABEL_GROUP_ROWS rows (negatives.index.group_rows) into one index, SOAR
# spilling as the serving index (soar_lambda; AVQ leaf centres too where a shard is one
# group), FULL_LABEL_SCANN_REORDER candidates re-scored exactly (negatives.index.reorder).
# At one leaf size the rows a query must score for a given recall grow with L; leaves that
# shrink as L grows keep that growth small, and a build in groups grows as L x group_rows /
# leaf_rows, not as a flat index's L^2 / leaf_rows. A re-ranking of 100 instead of 1,000
# loses little recall@32 and a third of the search. Why these values:
# docs/results/paper_configs.md, docs/results/refresh_index.md.
FULL_LABEL_ROWS_PER_QUERY = 256_000
FULL_LABEL_LEAF_ROWS = 2_000
FULL_LABEL_LEAF_SHRINK = 0.5
FULL_LABEL_GROUP_ROWS = 80_000
FULL_LABEL_SCANN_AVQ = 1.0
FULL_LABEL_SCANN_SOAR_LAMBDA = 1.5
FULL_LABEL_SCANN_REORDER = 100


def set_dataset(c: ml_collections.ConfigDict, name: str) -> catalog.PaperDataset:
  """Data fields of one of the paper's datasets (catalog.DATASETS)."""
  ds = catalog.DATASETS[name]
  c.data.name = name
  c.data.dir = f"data/{name}"
  c.data.num_labels, c.data.num_train = ds.num_labels, ds.num_train
  c.data.max_len = ds.max_len
  c.data.use_content = ds.text != "titles"  # json layout: title + content for full text
  c.data.augment_label_text = ds.label_features
  c.data.propensity_A, c.data.propensity_B = ds.propensity
  c.data.missing_hint = catalog.missing_hint(ds)
  # Renée evaluates every 5 epochs; ours on the first 20k test rows, all rows at the end.
  c.train.eval_every_epochs = 5
  c.eval.max_test_rows = 20_000
  return ds


def positives_to_cover(mean_labels: float, share: float = POSITIVES_COVERED) -> int:
  """The smallest k with P(|P| <= k) >= share for |P| geometric on {1, 2, ...} with mean
  `mean_labels` (docs/DESIGN.md, section 2, says why geometric).

  Args:
    mean_labels: mean positives per training row (>= 1).
    share: the share of rows whose positives must all fit.
  Returns:
    k_p.
  """
  if mean_labels <= 1:
    return 1
  return math.ceil(math.log1p(-share) / math.log1p(-1.0 / mean_labels) - 1e-9)


def positives_covered(mean_labels: float, k_p: int) -> float:
  """P(|P| <= k_p) under the same geometric law."""
  return 1.0 - (1.0 - 1.0 / max(mean_labels, 1.0)) ** k_p


def set_table_row(
  c: ml_collections.ConfigDict,
  *,
  batch_size: int,
  epochs: int,
  encoder_lr: float,
  classifier_lr: float,
  dropout: float,
  warmup: int,
  weight_decay: float,
  k_r: int,
  k_h: int,
  k_p: int,
  source: str = "appendix tab:hyperparam",
) -> None:
  """One row of the appendix table (per-GPU values of a 16-GPU run), translated as
  docs/DESIGN.md, section 2, says; the dataset (`set_dataset`) must be set first, for k_p."""
  c.paper = ml_collections.ConfigDict()
  c.paper.source = source
  c.paper.gpus = PAPER_GPUS
  c.paper.batch_size_per_gpu = batch_size
  c.paper.k_r_per_gpu = k_r
  c.paper.k_h_per_gpu = k_h
  c.paper.classifier_lr = classifier_lr
  c.paper.classifier_weight_decay = weight_decay
  c.paper.k_p = k_p
  c.paper.classifier_momentum = RENEE_CLASSIFIER_MOMENTUM
  gpus = c.paper.get_ref("gpus")
  shards = c.mesh.get_ref("model")
  c.train.batch_size = c.paper.get_ref("batch_size_per_gpu") * gpus
  c.negatives.k_r = c.paper.get_ref("k_r_per_gpu") * gpus // shards
  c.negatives.k_h = c.paper.get_ref("k_h_per_gpu") * gpus // shards
  c.negatives.k_p = positives_to_cover(catalog.DATASETS[c.data.name].labels_per_point)
  c.negatives.tau_s = c.negatives.tau_r = 5
  c.optim.classifier_lr = c.paper.get_ref("classifier_lr") * c.train.get_ref("batch_size")
  c.optim.encoder_lr = encoder_lr
  c.optim.warmup_steps = warmup
  c.optim.classifier_weight_decay = c.paper.get_ref("classifier_weight_decay") / c.train.get_ref(
    "batch_size"
  )
  c.optim.classifier_momentum = c.paper.get_ref("classifier_momentum")
  c.encoder.embedding_dropout = dropout
  c.train.epochs = epochs


def set_encoder(c: ml_collections.ConfigDict, paper_encoder: str) -> None:
  """The paper's encoder from `$ASTRA_MODELS_DIR` (docs/DESIGN.md, section 2; missing, it is
  an error at training time), with Renée's Adam settings; the tokenizer is the encoder's."""
  c.encoder.paper_encoder = paper_encoder
  shared = FieldReference(encoder_source.local_encoder_dir(paper_encoder))
  c.encoder.hf_dir = shared
  c.data.tokenizer_dir = shared
  c.optim.encoder_adam_eps = RENEE_ENCODER_ADAM_EPS
  c.optim.encoder_weight_decay = RENEE_ENCODER_DECAY.get(c.data.name, RENEE_ENCODER_DECAY_DEFAULT)


def set_real_data_stages(c: ml_collections.ConfigDict) -> None:
  """The stages a pretrained encoder was measured to need on real data (docs/real_data.md,
  "The pretrained encoder"): NGAME's first stage on (query, label text) pairs, W started
  from the warm-started label texts, and the label-text similarity in the score.
  `experiments/xc_text.py` trains with them; each paper config takes them as `:staged`."""
  c.warmstart.epochs = STAGED_WARMSTART_EPOCHS
  c.warmstart.batch_size = STAGED_WARMSTART_BATCH
  c.warmstart.lr = STAGED_WARMSTART_LR
  c.classifier.init = "label_text"
  c.scoring.label_text_weight = STAGED_LABEL_TEXT_WEIGHT
  c.scoring.label_text_scale = STAGED_LABEL_TEXT_SCALE


def apply_variant(
  c: ml_collections.ConfigDict, variant: str, config_file: str
) -> ml_collections.ConfigDict:
  """ "" -> c; "staged" -> c with the real-data stages (`set_real_data_stages`);
  "synthetic" or "synthetic,SCALE" -> the synthetic stand-in; "full_labels" or
  "full_labels,NUM_TRAIN" -> the stand-in at the full label count."""
  kind, _, arg = variant.partition(",")
  if kind == "":
    return c
  if kind == "staged" and not arg:
    set_real_data_stages(c)
    return c
  if kind == "full_labels":
    try:
      num_train = int(float(arg)) if arg else FULL_LABEL_NUM_TRAIN
    except ValueError:
      raise ValueError(
        f"{config_file}:{variant}: NUM_TRAIN must be a number, e.g. "
        f"{config_file}:full_labels,200000"
      ) from None
    return full_label_variant(c, num_train, config_file)
  if kind != "synthetic":
    raise ValueError(
      f"{config_file}:{variant}: the variants are '' (the dataset), 'staged' (the dataset "
      f"with the real-data stages), 'synthetic[,SCALE]' (its synthetic stand-in) and "
      f"'full_labels[,NUM_TRAIN]' (a stand-in at its full label count)"
    )
  try:
    scale = float(arg) if arg else default_synthetic_scale(c)
  except ValueError:
    raise ValueError(
      f"{config_file}:{variant}: the scale must be a number, e.g. {config_file}:synthetic,0.01"
    ) from None
  return synthetic_variant(c, scale, config_file)


def default_synthetic_scale(c: ml_collections.ConfigDict) -> float:
  """A one-significant-digit scale that keeps all epochs within SYNTHETIC_QUERY_BUDGET."""
  ds = catalog.DATASETS[c.data.name]
  rows = ds.num_train + (ds.num_labels if c.data.augment_label_text else 0)
  x = SYNTHETIC_QUERY_BUDGET / (c.train.epochs * rows)
  exponent = math.floor(math.log10(x))
  return min(1.0, float(f"{math.floor(x / 10.0**exponent)}e{exponent}"))


def _unlink(cfg: ml_collections.ConfigDict, key: str, value) -> None:
  """Replaces a field that holds a shared FieldReference by a plain value of its own."""
  del cfg[key]
  cfg[key] = value


def synthetic_variant(
  c: ml_collections.ConfigDict, scale: float, config_file: str
) -> ml_collections.ConfigDict:
  """The dataset's synthetic stand-in at `scale`.

  Kept: batch size, gradient accumulation, epochs, classifier lr, dropout, weight decay,
  the encoder's Adam eps and decay, tau_s, tau_r, bottleneck. Changed, and why:
    * sizes: L, N and test points x scale; the dataset's mean labels per point;
    * a label's text leaves out one of its own words (STAND_IN_HIDDEN_OWN_WORDS): the
      classifiers must learn what the label texts do not say, as on the real data;
    * encoder: the base config's tiny random BERT over the generated tokenizer, encoder
      lr TINY_ENCODER_LR (the paper's lr fine-tunes a pretrained model);
    * warmup x scale: the same fraction of training (steps per epoch shrink by scale);
    * embedding dropout TINY_EMBEDDING_DROPOUT (see there);
    * classifier momentum STAND_IN_CLASSIFIER_MOMENTUM (see there);
    * k_h and k_r x scale, in the table's ratio: each query sees the same share of the
      labels as in the paper and random negatives keep the paper's weight L / k_r (at
      least SYNTHETIC_MIN_NEGATIVES in all, at most L/2);
    * k_p = the generator's most positives per row (max_labels): every positive of every
      stand-in row, as the paper uses all positives;
    * max_len 32 (a generated query names ~4 words per positive: with many positives,
      as SS-20M's 26, the text is cut), float32, a 1 x 1 mesh: one CPU device.
      (--config.mesh.model=M with XLA_FLAGS=--xla_force_host_platform_device_count=M
      exercises the paper's layout on fake CPU devices.)
  """
  ds = catalog.DATASETS[c.data.name]
  if not 0 < scale <= 1:
    raise ValueError(f"{config_file}:synthetic,{scale}: the scale must be in (0, 1]")
  L = round(ds.num_labels * scale)
  n = round(ds.num_train * scale)
  rows = n + (L if c.data.augment_label_text else 0)
  if rows < c.train.batch_size:
    need = c.train.batch_size / (ds.num_train + (ds.num_labels if c.data.augment_label_text else 0))
    raise ValueError(
      f"{config_file}:synthetic,{scale}: {rows} training rows are fewer than "
      f"the batch size {c.train.batch_size}; use a scale of at least {need:.2g}"
    )
  s = c.data.synthetic
  s.enabled = True
  s.num_labels, s.num_train = L, n
  s.num_test = max(round(ds.num_test * scale), 100)
  s.mean_labels = ds.labels_per_point
  s.max_labels = math.ceil(ds.labels_per_point + 4 * math.sqrt(ds.labels_per_point)) + 1
  s.hidden_own_words = STAND_IN_HIDDEN_OWN_WORDS
  c.negatives.k_p = s.max_labels
  c.data.dir = f"data/{ds.name}-synthetic"
  c.data.num_labels, c.data.num_train = L, n
  c.data.max_len = 32
  c.data.missing_hint = ""
  _unlink(c.encoder, "hf_dir", "")  # tiny random BERT (base config's fields)
  _unlink(c.data, "tokenizer_dir", "")  # the generator's tokenizer
  c.encoder.dtype = "float32"
  c.optim.encoder_lr = TINY_ENCODER_LR
  c.encoder.embedding_dropout = TINY_EMBEDDING_DROPOUT
  _unlink(c.optim, "classifier_momentum", STAND_IN_CLASSIFIER_MOMENTUM)
  c.optim.warmup_steps = max(1, round(c.optim.warmup_steps * scale))
  k_h = c.paper.k_h_per_gpu * c.paper.gpus
  k_r = c.paper.k_r_per_gpu * c.paper.gpus
  total = min(L / 2, max((k_h + k_r) * scale, SYNTHETIC_MIN_NEGATIVES))
  shrink = min(1.0, total / (k_h + k_r))
  shards = c.mesh.get_ref("model")
  hard = max(1, int(k_h * shrink))
  c.negatives.k_h = FieldReference(hard) // shards
  c.negatives.k_r = FieldReference(max(1, int(total) - hard)) // shards  # the total, not 1 less
  c.mesh.data = c.mesh.model = 1
  c.paper.synthetic_scale = scale
  return c


def full_label_variant(
  c: ml_collections.ConfigDict, num_train: int, config_file: str
) -> ml_collections.ConfigDict:
  """The synthetic stand-in at the dataset's full label count with `num_train` queries:
  the label side (W, refreshes, evaluation, export) at the real size, the query side
  small enough for a CPU.

  From `synthetic_variant` at scale 1 (its label statistics, k_p, the stand-in's lrs),
  then:
    * a query's positives from one group of FULL_LABEL_GROUP_SIZE (see there), groups in
    topics of FULL_LABEL_TOPIC_SIZE labels (see there);
    * classifier lr FULL_LABEL_CLASSIFIER_LR (see there);
    * num_train queries, FULL_LABEL_NUM_TEST test rows, FULL_LABEL_VOCAB_SIZE words or
      FULL_LABEL_VOCAB_PER_LABEL per label if more, and an n-gram table that grows with
      them (FULL_LABEL_BUCKETS_PER_TOKEN);
      warmup x num_train / N (the same share of training);
    * the hashed n-gram bag encoder (`encoder.arch=ngram_bag`, the cheapest on a CPU) of
      width d = 64, no bottleneck, unigrams only (FULL_LABEL_NGRAM_ORDERS);
    * no label texts as training rows: L of them would outnumber the queries;
    * FULL_LABEL_K_H hard + FULL_LABEL_K_R random negatives per query (see there);
    * refreshes at a fixed cost per query, FULL_LABEL_ROWS_PER_QUERY rows in leaves of
      FULL_LABEL_LEAF_ROWS at 10^6 rows, smaller above, trained in groups, re-ranking
      FULL_LABEL_SCANN_REORDER candidates (see there);
    * W initialised from the label texts' embeddings (`classifier.init=label_text`);
    * its own data directory (data/<name>-full-labels): other sizes are other datasets.
  `--config.data.synthetic.num_labels=N` (and `data.num_labels`) runs it at fewer labels.
  """
  ds = catalog.DATASETS[c.data.name]
  if num_train < c.train.batch_size:
    raise ValueError(
      f"{config_file}:full_labels,{num_train}: fewer queries than the batch "
      f"size {c.train.batch_size}"
    )
  c = synthetic_variant(c, 1.0, config_file)
  s = c.data.synthetic
  s.num_train, s.num_test = num_train, FULL_LABEL_NUM_TEST
  s.vocab_size = FULL_LABEL_VOCAB_SIZE
  s.vocab_per_label = FULL_LABEL_VOCAB_PER_LABEL
  c.encoder.ngram.buckets_per_token = FULL_LABEL_BUCKETS_PER_TOKEN
  s.group_size, s.same_group_prob = FULL_LABEL_GROUP_SIZE, FULL_LABEL_SAME_GROUP_PROB
  _unlink(c.optim, "classifier_lr", FULL_LABEL_CLASSIFIER_LR)
  c.data.num_train = num_train
  c.data.dir = f"data/{ds.name}-full-labels"
  c.data.augment_label_text = False
  c.optim.warmup_steps = max(1, round(c.optim.warmup_steps * num_train / ds.num_train))
  c.encoder.arch = "ngram_bag"
  c.encoder.hidden_size = 64
  c.encoder.bottleneck_dim = 0
  c.encoder.ngram.orders = FULL_LABEL_NGRAM_ORDERS
  s.topic_size, s.topic_words = FULL_LABEL_TOPIC_SIZE, FULL_LABEL_TOPIC_WORDS
  c.negatives.k_h = FULL_LABEL_K_H
  c.negatives.k_r = FULL_LABEL_K_R
  c.negatives.index.kind = "scann"
  c.negatives.index.rows_per_query = FULL_LABEL_ROWS_PER_QUERY
  c.negatives.index.avq = FULL_LABEL_SCANN_AVQ
  c.negatives.index.soar_lambda = FULL_LABEL_SCANN_SOAR_LAMBDA
  c.negatives.index.reorder = FULL_LABEL_SCANN_REORDER
  # A leaf size, not a count: each W shard's index has (its rows) / (this, shrunk by the
  # shard's rows) leaves, at any --config.data.synthetic.num_labels and any mesh.model.
  c.negatives.index.leaf_rows = FULL_LABEL_LEAF_ROWS
  c.negatives.index.leaf_shrink = FULL_LABEL_LEAF_SHRINK
  c.negatives.index.group_rows = FULL_LABEL_GROUP_ROWS
  # W starts from each label's text embedding (NGAME's classifier init): with 100-1,000
  # times fewer queries than labels most rows would otherwise stay random vectors, whose
  # exact top-k is arbitrary and which no query can rank (docs/results/paper_configs.md).
  c.classifier.init = "label_text"
  c.paper.full_labels_num_train = num_train
  return c
