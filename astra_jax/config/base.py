"""The default configuration every experiment starts from, and its validation.

Experiments (`experiments/*.py`) call `base_config()` and change what differs; any field
can be overridden on the command line (`--config.train.epochs=3`); an unknown key is an
error from ml_collections that names it.
"""

from __future__ import annotations

import importlib.util

import ml_collections

from astra_jax.data import dataset, synthetic
from astra_jax.model import architectures, encoder_source
from astra_jax.negatives import strategies
from astra_jax.negatives.strategies import HardShare
from astra_jax.runtime.errors import InputError
from astra_jax.xc import classifier_init

# encoder.matmul_precision's values, as jax.default_matmul_precision takes them.
MATMUL_PRECISIONS = ("default", "high", "highest")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  c.data = ml_collections.ConfigDict()
  c.data.name = ""  # dataset name (informational; paper configs set it)
  c.data.dir = ""  # dataset directory (repository layout)
  # Appended to the error when data.dir holds no dataset: where to get it, or the command
  # that trains on a synthetic stand-in instead.
  c.data.missing_hint = ""
  # The dataset's size when known without reading it (the paper's statistics table); only
  # the memory planner (astra_jax/plan/) reads them, when the data is not on disk. 0: unknown.
  c.data.num_labels = 0
  c.data.num_train = 0
  c.data.layout = "auto"  # auto | renee | ngame | json
  c.data.tokenizer_dir = ""  # local HF tokenizer directory
  c.data.max_len = 32  # 32 titles, 128 full text, 256 Wikipedia
  c.data.use_content = False  # json layout: title + content instead of title
  c.data.augment_label_text = False  # label texts as extra training rows
  c.data.filter_file = dataset.FILTER_FILE  # relative to data.dir (this default name also
  # finds Renée's tst_filter_labels.txt); ignored
  # if absent
  # Also filter each test (and validation) row's own item, a label whose text is the row's
  # text, as LF-* datasets' filter files do (astra_jax/data/self_filter.py; needs label
  # texts): off | on | auto (on when the training rows' own items are not their labels).
  c.data.filter_self = "off"
  c.data.cache_dir = ""  # tokenized memmaps; default <data.dir>/astra_cache
  # A share of the training rows held out as the validation split (deterministic by
  # validation_seed): periodic evaluations report it, the test split only the final one.
  c.data.validation_fraction = 0.0
  c.data.validation_seed = 0
  # > 0: train and test on that many labels sampled by label_subset_seed and the queries
  # with a positive among them (astra_jax/data/label_subset.py; the paper's Figure 1).
  c.data.label_subset = 0
  c.data.label_subset_seed = 0
  c.data.propensity_A = 0.55  # 0.6 Amazon, 0.5 Wikipedia, 0.55 otherwise
  c.data.propensity_B = 1.5  # 2.6 Amazon, 0.4 Wikipedia, 1.5 otherwise
  # Synthetic data: when enabled, generated once into data.dir (or a cache dir) first.
  c.data.synthetic = ml_collections.ConfigDict()
  c.data.synthetic.enabled = False
  c.data.synthetic.num_labels = 2000
  c.data.synthetic.num_train = 20000
  c.data.synthetic.num_test = 4000
  c.data.synthetic.group_size = 8
  c.data.synthetic.vocab_size = 8000
  c.data.synthetic.zipf_exponent = 0.75
  c.data.synthetic.mean_labels = 2.5
  c.data.synthetic.max_labels = 7
  c.data.synthetic.same_group_prob = 0.3  # an extra positive comes from the first's group
  c.data.synthetic.own_word_prob = 0.85  # a query names each positive's own words with it
  c.data.synthetic.hidden_own_words = 0  # own words (of 2) its label's text leaves out
  c.data.synthetic.noise_words = 2
  c.data.synthetic.seed = 0
  # Topics of this many labels whose groups share words from topic_words words of their
  # own (0: no topics; synthetic.py's docstring says what they change).
  c.data.synthetic.topic_size = 0
  c.data.synthetic.topic_words = 16
  # > 0: at least this many content words per label (vocab_size is then a floor), so a
  # word is shared by as many labels whatever L (synthetic.content_vocab_size).
  c.data.synthetic.vocab_per_label = 0.0
  # The version of the data the generator writes (a record, not a choice): a workdir trained
  # on an older generator's data is another run, refused on resume like any config change.
  c.data.synthetic.generator = synthetic.GENERATOR_VERSION

  c.encoder = ml_collections.ConfigDict()
  # The architecture (astra_jax/model/architectures.py): bert (BERT / DistilBERT, pretrained
  # from hf_dir or the tiny random one below) | ngram_bag (hashed token n-grams, encoder.ngram).
  c.encoder.arch = "bert"
  c.encoder.hf_dir = ""  # dir with config.json (+ model.safetensors); "" = tiny BERT
  c.encoder.load_weights = True  # load model.safetensors from hf_dir when present
  # A workdir whose exported model (WORKDIR/model, export.py) gives the encoder's starting
  # weights; its encoder must have this config's shape. "": none.
  c.encoder.init_from_workdir = ""
  c.encoder.hidden_size = 64  # used when hf_dir is empty (random init); ngram_bag's width
  c.encoder.num_layers = 2
  c.encoder.num_heads = 2
  c.encoder.intermediate_size = 128
  c.encoder.hidden_dropout = 0.1
  c.encoder.bottleneck_dim = 0  # 64 for very large L (SS datasets)
  c.encoder.embedding_dropout = 0.5  # the paper's (high) dropout on E(x)
  c.encoder.dtype = "float32"  # compute dtype: float32 | bfloat16 | float16
  # float32 matmuls (jax_default_matmul_precision): default = the backend's choice, which
  # on A100/H100 is TF32 (10-bit mantissa inputs); highest = full float32 passes; high
  # = bf16x3 / TF32-like where the backend has it.
  c.encoder.matmul_precision = "default"
  # The ngram_bag encoder: every 1..orders-gram of token ids hashed into hash_buckets vectors.
  c.encoder.ngram = ml_collections.ConfigDict()
  c.encoder.ngram.orders = 3
  c.encoder.ngram.hash_buckets = 1 << 18
  # > 0: at least the power of two >= this many buckets per token of the tokenizer (then
  # hash_buckets is a floor), so the share of words that collide does not grow with the
  # vocabulary: with a fixed table, words of unrelated topics share vectors as L grows.
  c.encoder.ngram.buckets_per_token = 0
  c.encoder.ngram.normalize_scale = 10.0  # E(x) scaled to this L2 norm; 0: not normalised

  c.negatives = ml_collections.ConfigDict()
  c.negatives.strategy = "random+w_hard"  # ASTRA; see astra_jax/negatives/strategies.py
  c.negatives.k_p = 7  # positives per query (padded with a mask)
  c.negatives.k_h = 50  # hard negatives per query
  c.negatives.k_r = 400  # random negatives per query (per W shard)
  # per_query: each query draws its own k_r (the paper's Algorithm 1); shared: one draw of
  # k_r serves the whole batch (a B x k_r matmul, B times fewer rows gathered, but every
  # drawn row takes the whole batch's push at weight L/k_r: far noisier W updates; README)
  c.negatives.random_draws = "per_query"
  c.negatives.tau_s = 5  # first epoch with hard negatives
  c.negatives.tau_r = 5  # epochs between index refreshes
  # The refresh's index over each W shard (ann/index.py, `IndexKnobs`): its kind, and
  # overrides of `index.scann_defaults` (0: scaled to L, or off). docs/scale.md says when
  # to set which.
  c.negatives.index = ml_collections.ConfigDict()
  c.negatives.index.kind = "auto"  # auto (exact up to 50k labels, else scann) | exact | scann
  c.negatives.index.num_leaves = 0  # 0: scaled to L (2 sqrt(L))
  c.negatives.index.leaves_to_search = 0  # 0: max(64, leaves / 3), at most all leaves
  c.negatives.index.reorder = 0  # 0: max(20 k, 1000)
  c.negatives.index.rows_per_query = 0  # > 0: rows a query scores, whatever L
  c.negatives.index.leaf_rows = 0  # > 0: leaves of this many rows in every shard
  c.negatives.index.leaf_shrink = 0.0  # > 0: leaves shrink as (10^6 / shard rows)^this
  c.negatives.index.group_rows = 0  # > 0: built in groups of this many rows
  c.negatives.index.avq = 0.0  # > 0: anisotropic leaf centres at this eta
  c.negatives.index.soar_lambda = 0.0  # > 0: SOAR's second copy of each row at this lambda
  c.negatives.recall_sample = 1000  # queries checked against exact search at each refresh
  # Threads of a refresh worker (ScaNN, numpy's BLAS): 0 = this task's CPUs
  # (SLURM_CPUS_PER_TASK, or the affinity mask) less train.input_threads, at least 1.
  c.negatives.refresh_threads = 0
  # A refresh that fails (worker error, kill, out of memory): "continue" trains on with the
  # previous (or random) negatives, a warning every epoch it is missing and counts in
  # results.json's "degraded"; "fail" stops the run in one line (a rerun retries it).
  c.negatives.on_refresh_failure = "continue"
  c.negatives.curriculum_final_hard_fraction = 0.5
  c.negatives.inject_fault = ""  # tests only: "raise" or "kill" fails the first refresh

  c.optim = ml_collections.ConfigDict()
  c.optim.encoder_lr = 1e-4
  c.optim.classifier_lr = 0.05
  c.optim.warmup_steps = 3000
  c.optim.encoder_weight_decay = 0.0
  c.optim.encoder_adam_eps = 1e-8  # the paper configs take Renee's 1e-6 (paper_configs.py)
  c.optim.classifier_weight_decay = 1e-4
  # SGD momentum beta of the classifier, weight decay inside it (torch's SGD; optim.py). The
  # sparse update does it at the cost of the rows a step touches (sparse_momentum.py);
  # its state is a velocity as large as W. 0: plain SGD + decay (W = scale * V).
  c.optim.classifier_momentum = 0.0
  c.optim.classifier_update = "sparse"  # sparse: O(rows touched) per step, exact; dense: optax
  c.optim.grad_clip_norm = 0.0
  # Loss scaling for float16 compute: 0 = dynamic (start 2^15, halve on overflow and skip
  # the update, double after 2000 good steps) when encoder.dtype=float16, off otherwise;
  # > 0 = that static scale.
  c.optim.loss_scale = 0.0

  # W's starting point (astra_jax/xc/classifier_init.py): normal (std
  # train.classifier_init_std) or label_text (init_scale * E(z_l) / |E(z_l)|, computed with
  # the encoder as training starts).
  # An optional first stage (astra_jax/training/warmstart.py, NGAME's stage 1): the encoder alone,
  # trained on (query, positive label text) pairs with in-batch negatives, before W exists.
  c.warmstart = ml_collections.ConfigDict()
  c.warmstart.epochs = 0  # 0: no warm start
  c.warmstart.batch_size = 256  # pairs per step (the in-batch negatives)
  c.warmstart.lr = 1e-3  # Adam, linear warmup then cosine decay to 0
  c.warmstart.warmup_steps = 100
  c.warmstart.inverse_temperature = 20.0  # logits = this x cosine similarity

  # How the model ranks labels (astra_jax/xc/score_fusion.py): with label_text_weight = beta > 0,
  # (1 - beta) sigmoid(<w_l, E(x)>) + beta sigmoid(label_text_scale cos(E(x), E(z_l))), the
  # label's text similarity mixed in (NGAME's inference); 0: the classifiers alone.
  c.scoring = ml_collections.ConfigDict()
  c.scoring.label_text_weight = 0.0
  c.scoring.label_text_scale = 5.0

  c.classifier = ml_collections.ConfigDict()
  c.classifier.init = "normal"
  c.classifier.init_scale = 1.0

  c.train = ml_collections.ConfigDict()
  c.train.epochs = 10
  c.train.batch_size = 256  # global batch (all devices, all accumulation steps)
  c.train.grad_accum_steps = 1  # micro-batches per update (batch_size / this each)
  c.train.seed = 0
  c.train.log_every_steps = 50
  c.train.eval_every_epochs = 0  # 0: evaluate at the end only
  c.train.profile_steps = 20  # steps timed phase by phase for the time break-up
  c.train.prefetch = 4  # batches prepared ahead of the step
  c.train.input_threads = 2  # threads preparing them (a fast GPU: more; README)
  c.train.classifier_init_std = 0.02
  c.train.stop_after_steps = 0  # tests/debugging: behave as if SIGTERM came after N steps
  c.train.full_label_block = 8192  # strategy=full: labels per block of the full-L loss
  # A step (or a collective inside one) that makes no progress for this long ends the
  # process with every thread's stack (astra_jax/runtime/watchdog.py): a stuck rank would otherwise
  # hold the whole job until its time limit. 0: no watchdog.
  c.train.hang_timeout_s = 1800.0

  # Device mesh: data x model devices; 1 x 1 is the single-device step. data=-1 takes every
  # device the model axis leaves. W's rows are split over 'model'.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1
  c.mesh.model = 1
  # Multi-process runs (one process per GPU): auto = jax.distributed.initialize() when the
  # environment says so (SLURM with more than one task, or JAX_COORDINATOR_ADDRESS set).
  c.mesh.distributed = "auto"  # auto | on | off

  # Checkpoints (orbax) in <workdir>/checkpoints: at every epoch end, every `every_steps`
  # steps and every `every_minutes` minutes (0 = not by that rule), and on SIGTERM/SIGINT.
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.enabled = True
  c.checkpoint.every_steps = 0
  c.checkpoint.every_minutes = 30.0
  c.checkpoint.keep = 3  # the last N, plus the best by P@5 (periodic evals)

  c.eval = ml_collections.ConfigDict()
  c.eval.ks = (1, 3, 5)
  c.eval.batch_size = 1024
  c.eval.label_block = 32768
  c.eval.max_test_rows = 0  # 0: all; >0 evaluates the first rows only (periodic evals)
  # The final evaluation records its progress every this many test rows (rows done and the
  # metrics' partial sums), so that a preempted run resumes it instead of starting over.
  c.eval.progress_rows = 65536
  # 0: the final evaluation scores every test row; > 0: the first this many only (smoke runs
  # at a huge L), said in a warning, results.json's num_test_evaluated and "degraded".
  c.eval.final_max_rows = 0
  # exact: the final evaluation ranks over all of W (sharded_topk.py). scann: every test row
  # is also ranked through the exported model's serving index (ann_eval.py), the metrics a
  # deployment sees at the index's cost; results.json's "ann_eval" compares both on the
  # rows the exact evaluation covers (set eval.final_max_rows to bound them at huge L).
  c.eval.search = "exact"
  # Beside each evaluation, P@k of a k-NN vote over the encoder's own embeddings of the
  # training rows (astra_jax/evaluation/knn.py): what the encoder knows, next to what W makes of it.
  # 0: off; > 0: that many neighbours.
  c.eval.knn_diagnostic = 0
  # With a fused score (scoring.label_text_weight > 0), also report each evaluation's P@k by
  # W alone ("W-alone P@k"): one more evaluation pass each time.
  c.eval.classifier_alone = False
  # results.json: the TF-IDF kNN baseline beside popularity (needs scikit-learn; skipped
  # without it) (astra_jax/baselines.py).
  c.eval.tfidf_baseline = False
  return c


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field."""

  def need(cond, field, msg):
    if not cond:
      raise InputError(f"config.{field}: {msg}")

  need(c.data.dir, "data.dir", "no dataset directory given (--config.data.dir=PATH)")
  need(
    c.data.get("filter_self", "off") in ("off", "on", "auto"),
    "data.filter_self",
    f"must be off, on or auto, got {c.data.get('filter_self')!r}",
  )
  need(
    c.data.tokenizer_dir or c.data.synthetic.enabled,
    "data.tokenizer_dir",
    "no tokenizer directory given",
  )
  need(c.data.max_len >= 2, "data.max_len", f"must be >= 2, got {c.data.max_len}")
  need(
    not c.data.synthetic.enabled or c.data.synthetic.generator == synthetic.GENERATOR_VERSION,
    "data.synthetic.generator",
    f"this astra_jax generates version {synthetic.GENERATOR_VERSION} of the synthetic data, "
    f"not {c.data.synthetic.generator}",
  )
  own_words = synthetic.SyntheticSpec.own_words
  need(
    not c.data.synthetic.enabled or 0 <= c.data.synthetic.hidden_own_words <= own_words,
    "data.synthetic.hidden_own_words",
    f"must be in [0, {own_words}] (a label's own words), got {c.data.synthetic.hidden_own_words}",
  )
  need(c.data.synthetic.vocab_per_label >= 0, "data.synthetic.vocab_per_label", "must be >= 0")
  need(
    c.data.layout in ("auto", "renee", "ngame", "json"),
    "data.layout",
    f"unknown layout {c.data.layout!r}",
  )
  strategy = strategies.get(c.negatives.strategy)  # an unknown one: names the field
  need(c.negatives.k_p >= 1, "negatives.k_p", f"must be >= 1, got {c.negatives.k_p}")
  need(c.negatives.k_h >= 0, "negatives.k_h", "must be >= 0")
  if strategy.allows_hard_only:
    # k_r = 0: hard negatives only, the paper's Figure 1 oracle and stale strategy (the
    # estimator then has no random term: the biased hard-only objective).
    need(c.negatives.k_r >= 0, "negatives.k_r", f"must be >= 0, got {c.negatives.k_r}")
    need(
      c.negatives.k_h + c.negatives.k_r >= 1,
      "negatives.k_h",
      f"k_h + k_r must be >= 1 (negatives per query), got {c.negatives.k_h} + {c.negatives.k_r}",
    )
  else:
    need(
      c.negatives.k_r >= 1,
      "negatives.k_r",
      f"must be >= 1, got {c.negatives.k_r} (0 only with strategy "
      f"{', '.join(strategies.names(lambda s: s.allows_hard_only))}: hard negatives alone)",
    )
  if strategy.hard_share is HardShare.CURRICULUM:
    # The hard share rises from k_h / (k_h + k_r) at tau_s: the batches keep k_r random
    # columns, and the total per query stays k_h + k_r.
    first = c.negatives.k_h / (c.negatives.k_h + c.negatives.k_r)
    need(
      first <= c.negatives.curriculum_final_hard_fraction <= 1,
      "negatives.curriculum_final_hard_fraction",
      f"must be in [k_h / (k_h + k_r) = {first:.3g}, 1] (the curriculum's hard share "
      f"rises from there), got {c.negatives.curriculum_final_hard_fraction}",
    )
  need(
    c.negatives.random_draws in ("per_query", "shared"),
    "negatives.random_draws",
    f"use per_query or shared, got {c.negatives.random_draws!r}",
  )
  need(
    c.negatives.index.kind in ("auto", "exact", "scann"),
    "negatives.index.kind",
    f"unknown index {c.negatives.index.kind!r}; use auto, exact or scann",
  )
  need(
    c.negatives.index.rows_per_query >= 0,
    "negatives.index.rows_per_query",
    f"must be >= 0 (0: a third of the leaves), got {c.negatives.index.rows_per_query}",
  )
  need(
    c.negatives.index.leaf_shrink >= 0,
    "negatives.index.leaf_shrink",
    f"must be >= 0 (0: leaves of one size), got {c.negatives.index.leaf_shrink}",
  )
  need(
    c.negatives.index.group_rows >= 0,
    "negatives.index.group_rows",
    f"must be >= 0 (0: one index per W shard), got {c.negatives.index.group_rows}",
  )
  need(
    c.negatives.refresh_threads >= 0,
    "negatives.refresh_threads",
    "must be >= 0 (0: the task's CPUs less the input threads)",
  )
  need(
    c.negatives.inject_fault in ("", "raise", "kill"),
    "negatives.inject_fault",
    "use '', 'raise' or 'kill'",
  )
  for field in (
    "train.batch_size",
    "train.grad_accum_steps",
    "train.log_every_steps",
    "train.input_threads",
    "eval.batch_size",
    "checkpoint.keep",
  ):
    section, name = field.split(".")
    need(c[section][name] >= 1, field, f"must be >= 1, got {c[section][name]}")
  need(
    c.optim.classifier_update in ("sparse", "dense"),
    "optim.classifier_update",
    f"use sparse or dense, got {c.optim.classifier_update!r}",
  )
  need(
    0 <= c.optim.classifier_momentum < 1,
    "optim.classifier_momentum",
    f"must be in [0, 1) (0: no momentum), got {c.optim.classifier_momentum}",
  )
  need(c.train.epochs >= 1, "train.epochs", "must be >= 1")
  dense = c.optim.classifier_update == "dense" or strategy.dense_update_only
  need(
    not (dense and (c.encoder.dtype == "float16" or c.optim.loss_scale > 0)),
    "encoder.dtype",
    "float16 needs loss scaling, which only the sparse step does; the "
    "dense update (optim.classifier_update=dense, or a dense-only strategy: "
    + ", ".join(strategies.names(lambda s: s.dense_update_only))
    + ") runs in "
    "float32 or bfloat16",
  )
  need(
    c.optim.classifier_lr * c.optim.classifier_weight_decay < 1,
    "optim.classifier_weight_decay",
    f"classifier_lr x classifier_weight_decay = "
    f"{c.optim.classifier_lr * c.optim.classifier_weight_decay:g}: a step would scale W "
    "by 1 - lr wd <= 0",
  )
  need(
    c.encoder.dtype in ("float32", "bfloat16", "float16"),
    "encoder.dtype",
    f"unknown dtype {c.encoder.dtype!r}",
  )
  need(
    c.encoder.matmul_precision in MATMUL_PRECISIONS,
    "encoder.matmul_precision",
    f"use one of {', '.join(MATMUL_PRECISIONS)}, got {c.encoder.matmul_precision!r}",
  )
  need(c.train.hang_timeout_s >= 0, "train.hang_timeout_s", "must be >= 0 (0: no watchdog)")
  need(c.eval.progress_rows >= 1, "eval.progress_rows", "must be >= 1")
  need(c.eval.final_max_rows >= 0, "eval.final_max_rows", "must be >= 0 (0: every test row)")
  need(
    c.negatives.on_refresh_failure in ("continue", "fail"),
    "negatives.on_refresh_failure",
    f"must be continue or fail, got {c.negatives.on_refresh_failure!r}",
  )
  need(
    c.eval.search in ("exact", "scann"),
    "eval.search",
    f"must be exact or scann, got {c.eval.search!r}",
  )
  need(
    0 <= c.data.validation_fraction < 1,
    "data.validation_fraction",
    f"must be in [0, 1), got {c.data.validation_fraction}",
  )
  need(c.data.label_subset >= 0, "data.label_subset", "must be >= 0 (0: all labels)")
  need(c.eval.knn_diagnostic >= 0, "eval.knn_diagnostic", "must be >= 0")
  classifier_init.validate(c)
  need(0 <= c.scoring.label_text_weight <= 1, "scoring.label_text_weight", "must be in [0, 1]")
  need(c.scoring.label_text_scale > 0, "scoring.label_text_scale", "must be > 0")
  need(c.warmstart.epochs >= 0, "warmstart.epochs", "must be >= 0 (0: no warm start)")
  need(c.warmstart.batch_size >= 2, "warmstart.batch_size", "must be >= 2 (in-batch negatives)")
  need(
    c.warmstart.lr > 0 and c.warmstart.inverse_temperature > 0,
    "warmstart",
    "lr and inverse_temperature must be > 0",
  )
  need(0 <= c.encoder.embedding_dropout < 1, "encoder.embedding_dropout", "must be in [0, 1)")
  need(
    c.encoder.arch in architectures.names(),
    "encoder.arch",
    f"unknown {c.encoder.arch!r}; use one of {', '.join(architectures.names())}",
  )
  need(
    c.encoder.ngram.orders >= 1 and c.encoder.ngram.hash_buckets >= 1,
    "encoder.ngram",
    "orders and hash_buckets must be >= 1",
  )
  need(c.encoder.ngram.buckets_per_token >= 0, "encoder.ngram.buckets_per_token", "must be >= 0")
  need(c.encoder.ngram.normalize_scale >= 0, "encoder.ngram.normalize_scale", "must be >= 0")
  encoder_source.check(c.encoder)


def load_config(path: str, variant: str | None = None) -> ml_collections.ConfigDict:
  """An experiment file's `get_config()` (`get_config(variant)` for `--config=PATH:VARIANT`),
  outside absl's --config flag."""
  spec = importlib.util.spec_from_file_location("_astra_experiment", path)
  if spec is None:
    raise InputError(f"{path}: not a Python config file")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if variant is None else module.get_config(variant)
