"""The dataset fields (`config.data`): where the data is, its layout, tokenization, the
validation split, label subsets, own-item filtering and the synthetic stand-in's generator."""

from __future__ import annotations

import ml_collections

from astra_jax.config.require import require
from astra_jax.data import dataset, synthetic


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the sections `data` with their defaults."""
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
  # In data.dir, ignored if absent (the default name also finds Renée's tst_filter_labels.txt).
  c.data.filter_file = dataset.FILTER_FILE
  # Filter each test row's own item (a label with the row's text; data/self_filter.py):
  # off | on | auto (on when the training rows' own items are not their labels).
  c.data.filter_self = "off"
  c.data.cache_dir = ""  # tokenized memmaps; default <data.dir>/astra_cache
  # A share of the training rows held out as the validation split (deterministic by
  # validation_seed): periodic evaluations report it, the test split only the final one.
  c.data.validation_fraction = 0.0
  c.data.validation_seed = 0
  # > 0: at most that many rows held out (the fraction's first ones). Past about 10^5 rows a
  # choice reads no sharper, while every held-out row is one W does not train on and one
  # each candidate of the score choice scores against all labels (data/validation.py).
  c.data.validation_max_rows = 0
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


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field of `data`."""
  require(c.data.dir, "data.dir", "no dataset directory given (--config.data.dir=PATH)")
  require(
    c.data.get("filter_self", "off") in ("off", "on", "auto"),
    "data.filter_self",
    f"must be off, on or auto, got {c.data.get('filter_self')!r}",
  )
  require(
    c.data.tokenizer_dir or c.data.synthetic.enabled,
    "data.tokenizer_dir",
    "no tokenizer directory given",
  )
  require(c.data.max_len >= 2, "data.max_len", f"must be >= 2, got {c.data.max_len}")
  require(
    not c.data.synthetic.enabled or c.data.synthetic.generator == synthetic.GENERATOR_VERSION,
    "data.synthetic.generator",
    f"this astra_jax generates version {synthetic.GENERATOR_VERSION} of the synthetic data, "
    f"not {c.data.synthetic.generator}",
  )
  own_words = synthetic.SyntheticSpec.own_words
  require(
    not c.data.synthetic.enabled or 0 <= c.data.synthetic.hidden_own_words <= own_words,
    "data.synthetic.hidden_own_words",
    f"must be in [0, {own_words}] (a label's own words), got {c.data.synthetic.hidden_own_words}",
  )
  require(c.data.synthetic.vocab_per_label >= 0, "data.synthetic.vocab_per_label", "must be >= 0")
  require(
    c.data.layout in ("auto", "renee", "ngame", "json"),
    "data.layout",
    f"unknown layout {c.data.layout!r}",
  )
  require(
    0 <= c.data.validation_fraction < 1,
    "data.validation_fraction",
    f"must be in [0, 1), got {c.data.validation_fraction}",
  )
  require(
    c.data.validation_max_rows >= 0,
    "data.validation_max_rows",
    f"must be >= 0 (0: no cap), got {c.data.validation_max_rows}",
  )
  require(c.data.label_subset >= 0, "data.label_subset", "must be >= 0 (0: all labels)")
