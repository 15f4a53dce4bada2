"""The model's fields: the encoder (`config.encoder`), W's starting rows
(`config.classifier`) and how the model ranks labels (`config.scoring`)."""

from __future__ import annotations

import re

import ml_collections

from astra_jax.ann import memory_search
from astra_jax.config.require import require
from astra_jax.model import architectures
from astra_jax.xc import classifier_init

# encoder.matmul_precision's values, as jax.default_matmul_precision takes them.
MATMUL_PRECISIONS = ("default", "high", "highest")


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the sections `encoder`, `classifier`, `scoring` with their defaults."""
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
  # float32 matmuls (jax_default_matmul_precision): default (the backend's: TF32 on
  # A100/H100) | high (bf16x3) | highest (full float32).
  c.encoder.matmul_precision = "default"
  # The ngram_bag encoder: every 1..orders-gram of token ids hashed into hash_buckets vectors.
  c.encoder.ngram = ml_collections.ConfigDict()
  c.encoder.ngram.orders = 3
  c.encoder.ngram.hash_buckets = 1 << 18
  # > 0: at least this many buckets per tokenizer token (a power of two; hash_buckets is a
  # floor), so that the share of colliding words does not grow with the vocabulary.
  c.encoder.ngram.buckets_per_token = 0
  c.encoder.ngram.normalize_scale = 10.0  # E(x) scaled to this L2 norm; 0: not normalised

  # W's starting point (xc/classifier_init.py): normal (std train.classifier_init_std) or
  # label_text (init_scale * E(z_l) / |E(z_l)|, by the encoder as training starts).
  c.classifier = ml_collections.ConfigDict()
  c.classifier.init = "normal"
  c.classifier.init_scale = 1.0

  # How the model ranks labels (xc/score_fusion.py): label_text_weight = beta > 0 mixes in
  # the label text's similarity, beta sigmoid(label_text_scale (cos(E(x), E(z_l)) -
  # label_text_shift)); 0: W alone.
  c.scoring = ml_collections.ConfigDict()
  c.scoring.label_text_weight = 0.0
  c.scoring.label_text_scale = 5.0
  c.scoring.label_text_shift = 0.0
  # Candidates for (label_text_scale, label_text_shift), one of which is chosen after
  # training on the validation split before the weights are (training/score_choice.py).
  # (): the two as set.
  c.scoring.label_text_shape_choices = ()
  # Candidates for label_text_weight, one of which is chosen after training by P@1 on the
  # validation split (training/score_choice.py; needs data.validation_fraction > 0): the
  # final evaluation and the export use the chosen one. (): label_text_weight as set.
  c.scoring.label_text_weight_choices = ()
  # neighbour_weight = a > 0 mixes in the vote of the `neighbours` training rows nearest to
  # the query under the same encoder (xc/neighbour_vote.py): (1 - a) p + a v, each row's
  # vote weighted exp((cos - best cos) / neighbour_temperature). The model then keeps the
  # training rows' embeddings (N x d float32) to vote with.
  c.scoring.neighbour_weight = 0.0
  c.scoring.neighbours = 50
  c.scoring.neighbour_temperature = 0.1
  # How the memory is searched (ann/memory_search.py): auto (exactly on GPUs and TPUs, and on
  # CPUs up to 4 x neighbour_search_rows memory rows, with a ScaNN index above), exact, or
  # scann, whose queries score about neighbour_search_rows rows each.
  c.scoring.neighbour_search = "auto"
  c.scoring.neighbour_search_rows = memory_search.SCANN_ROWS_PER_QUERY
  # Where the memory's keys live after training (ann/memory_search.LAYOUTS): auto (split over
  # the devices where a device's share takes at most half its free memory, else over the
  # processes' hosts), devices, or hosts.
  c.scoring.neighbour_memory = "auto"
  # Candidates for neighbour_weight, chosen after label_text_weight, as it is.
  c.scoring.neighbour_weight_choices = ()
  # True: with both lists given, every (label_text_weight, neighbour_weight) pair is read on
  # the validation split and the best pair taken, instead of one weight after the other.
  c.scoring.choose_jointly = False
  # The validation metrics whose sum the choices maximise (names as results.json has them).
  c.scoring.choose_by = ("P@1",)
  # Lexical terms (xc/lexical.py; scikit-learn's TF-IDF over the dataset's texts): the score
  # becomes (1 - g - h) m + g t + h u, m the score above, t the TF-IDF cosine of the query
  # and the label's text (g = lexical_label_text_weight), u the neighbour vote over the
  # training rows' TF-IDF vectors (h = lexical_neighbour_weight; its k and temperature are
  # neighbours and neighbour_temperature). The model then keeps the training rows' TF-IDF.
  c.scoring.lexical_label_text_weight = 0.0
  c.scoring.lexical_neighbour_weight = 0.0
  # Candidates for both, every (g, h) pair with g + h < 1 read on the validation split after
  # the weights above are chosen (training/score_choice.py). (): the weight as set.
  c.scoring.lexical_label_text_weight_choices = ()
  c.scoring.lexical_neighbour_weight_choices = ()


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises InputError naming the first bad field of `encoder`, `classifier`, `scoring`."""
  require(
    c.encoder.dtype in ("float32", "bfloat16", "float16"),
    "encoder.dtype",
    f"unknown dtype {c.encoder.dtype!r}",
  )
  require(
    c.encoder.matmul_precision in MATMUL_PRECISIONS,
    "encoder.matmul_precision",
    f"use one of {', '.join(MATMUL_PRECISIONS)}, got {c.encoder.matmul_precision!r}",
  )
  classifier_init.validate(c)
  require(0 <= c.scoring.label_text_weight <= 1, "scoring.label_text_weight", "must be in [0, 1]")
  require(c.scoring.label_text_scale > 0, "scoring.label_text_scale", "must be > 0")
  require(
    -1 <= c.scoring.label_text_shift < 1,
    "scoring.label_text_shift",
    f"a cosine in [-1, 1), got {c.scoring.label_text_shift}",
  )
  shapes = tuple(tuple(x) for x in c.scoring.label_text_shape_choices)
  require(
    all(len(x) == 2 and x[0] > 0 and -1 <= x[1] < 1 for x in shapes),
    "scoring.label_text_shape_choices",
    f"(scale > 0, shift in [-1, 1)) pairs, got {shapes}",
  )
  _require_validation_split(c, "label_text_shape_choices", bool(shapes))
  _require_choices(c, "label_text_weight_choices")
  sc = c.scoring
  require(
    0 <= sc.neighbour_weight <= 1,
    "scoring.neighbour_weight",
    f"must be in [0, 1], got {sc.neighbour_weight}",
  )
  require(sc.neighbours >= 1, "scoring.neighbours", f"must be >= 1, got {sc.neighbours}")
  require(
    sc.neighbour_temperature > 0,
    "scoring.neighbour_temperature",
    f"must be > 0, got {sc.neighbour_temperature}",
  )
  require(
    sc.neighbour_search in memory_search.SEARCHES,
    "scoring.neighbour_search",
    f"use one of {', '.join(memory_search.SEARCHES)}, got {sc.neighbour_search!r}",
  )
  require(
    sc.neighbour_memory in memory_search.LAYOUTS,
    "scoring.neighbour_memory",
    f"use one of {', '.join(memory_search.LAYOUTS)}, got {sc.neighbour_memory!r}",
  )
  require(
    sc.neighbour_search_rows >= 1,
    "scoring.neighbour_search_rows",
    f"must be >= 1, got {sc.neighbour_search_rows}",
  )
  _require_choices(c, "neighbour_weight_choices")
  _require_lexical(c)
  by = tuple(c.scoring.choose_by)
  require(
    bool(by) and all(re.fullmatch(r"(P|nDCG|PSP|PSnDCG)@[1-9][0-9]*", m) for m in by),
    "scoring.choose_by",
    f"names metrics such as P@1 or PSP@5, got {by}",
  )
  ks = tuple(c.eval.ks)
  chooses = any(bool(sc[f]) for f in sc if f.endswith("_choices"))
  require(
    not chooses or all(int(m.split("@")[1]) in ks for m in by),
    "scoring.choose_by",
    f"{by}: each metric's cut-off must be one of eval.ks = {ks}",
  )
  require(0 <= c.encoder.embedding_dropout < 1, "encoder.embedding_dropout", "must be in [0, 1)")
  require(
    c.encoder.arch in architectures.names(),
    "encoder.arch",
    f"unknown {c.encoder.arch!r}; use one of {', '.join(architectures.names())}",
  )
  require(
    c.encoder.ngram.orders >= 1 and c.encoder.ngram.hash_buckets >= 1,
    "encoder.ngram",
    "orders and hash_buckets must be >= 1",
  )
  require(c.encoder.ngram.buckets_per_token >= 0, "encoder.ngram.buckets_per_token", "must be >= 0")
  require(c.encoder.ngram.normalize_scale >= 0, "encoder.ngram.normalize_scale", "must be >= 0")


def _require_lexical(c: ml_collections.ConfigDict) -> None:
  """The lexical weights: each in [0, 1], and g + h < 1 for the pair set, or for one pair of
  the choices (the choice skips the others)."""
  sc = c.scoring
  _require_choices(c, "lexical_label_text_weight_choices")
  _require_choices(c, "lexical_neighbour_weight_choices")
  gs = tuple(sc.lexical_label_text_weight_choices) or (sc.lexical_label_text_weight,)
  hs = tuple(sc.lexical_neighbour_weight_choices) or (sc.lexical_neighbour_weight,)
  for field, w in (
    ("label_text", sc.lexical_label_text_weight),
    ("neighbour", sc.lexical_neighbour_weight),
  ):
    require(0 <= w <= 1, f"scoring.lexical_{field}_weight", f"must be in [0, 1], got {w}")
  require(
    min(gs) + min(hs) < 1,
    "scoring.lexical_label_text_weight",
    f"with lexical_neighbour_weight must leave the model a share: {min(gs)} + {min(hs)} >= 1",
  )


def _require_choices(c: ml_collections.ConfigDict, field: str) -> None:
  """A score weight's candidates (`scoring.<field>`): each in [0, 1], and a validation split
  to choose on."""
  choices = tuple(c.scoring[field])
  require(
    all(0 <= w <= 1 for w in choices),
    f"scoring.{field}",
    f"every candidate must be in [0, 1], got {choices}",
  )
  _require_validation_split(c, field, bool(choices))


def _require_validation_split(c: ml_collections.ConfigDict, field: str, chooses: bool) -> None:
  """A choice listed in `scoring.<field>` needs a validation split to choose on."""
  require(
    not chooses or c.data.validation_fraction > 0,
    f"scoring.{field}",
    "chooses on the validation split: set data.validation_fraction > 0",
  )
