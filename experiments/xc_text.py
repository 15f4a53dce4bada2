"""Train on your own dataset in the Extreme Classification Repository layout.

  python -m astra_jax.main --config=experiments/xc_text.py --config.data.dir=PATH
  python -m astra_jax.main --config=experiments/xc_text.py:tiny --config.data.dir=PATH
  python -m astra_jax.main --config=experiments/xc_text.py:ngram --config.data.dir=PATH

PATH holds trn_X_Y.txt, tst_X_Y.txt and texts in any layout (trn_X.txt/tst_X.txt/Y.txt,
raw_data/{train,test,label}.raw.txt, or {trn,tst,lbl}.json.gz), optionally
filter_labels_test.txt. Variants:

- default (`minilm`): the pretrained all-MiniLM-L6-v2 with its tokenizer (GPU advised),
  trained with the real-data stages (`paper_configs.set_real_data_stages`: a warm start on
  (query, label text) pairs, W from the warm-started label texts, the fused score).
- `tiny`: a small randomly initialised BERT over the same vocabulary (fast on a CPU).
- `ngram`: the CPU recipe for short texts: a hashed token n-gram bag encoder
  (`encoder.arch=ngram_bag`, 2^17 buckets), a 5-epoch siamese warm start on (query, label
  text) pairs (inverse temperature 10), W from the warm-started label texts, a 4-epoch
  classifier stage (the table's Adam on the rows a batch reads) with hard negatives from
  its third epoch and 4,096 random negatives a step shared by the batch, embedding
  dropout 0.5, and, after training, on a validation split of 10% of the training rows
  that W does not train on: the label-text term's shape (`scoring.label_text_shape_choices`),
  then the score's label-text and neighbour-vote weights together
  (`scoring.label_text_weight_choices` x `scoring.neighbour_weight_choices`), then,
  likewise, the weights of two lexical terms (TF-IDF similarity to the label texts and a
  TF-IDF neighbour vote, `scoring.lexical_*`).

All variants set `data.filter_self=auto` (each test row's own item filtered where the
training labels show items never list themselves; astra_jax/data/self_filter.py). Set the
propensity constants for your data family: --config.data.propensity_A/B (Amazon 0.6/2.6,
Wikipedia 0.5/0.4, otherwise 0.55/1.5). How `:ngram` was tuned and what each recipe
measured on debian-recommends-20k and debian-builddeps-33k, beside the XC libraries users
try first (`python -m astra_jax.baselines --data=PATH --methods=xrlinear,parabel,bonsai,plt`):
docs/real_data.md and docs/results/builddeps.md.
"""

from astra_jax.config import paper_configs
from astra_jax.config.base import base_config


def get_config(variant: str = "minilm"):
  if variant not in ("minilm", "tiny", "ngram"):
    raise ValueError(f"experiments/xc_text.py:{variant}: variants are 'minilm', 'tiny' and 'ngram'")
  c = base_config()
  c.data.tokenizer_dir = "all-MiniLM-L6-v2"  # resolved to the installed package's files
  c.data.max_len = 32  # titles; use 128 for full text
  c.data.augment_label_text = True  # used only when label texts exist
  # A row's own item is filtered from its ranking when the training labels say items never
  # list themselves (item-to-item data such as debian-recommends; astra_jax/data/self_filter.py).
  c.data.filter_self = "auto"
  c.negatives.k_p = 7
  c.negatives.k_h = 50
  c.negatives.k_r = 400
  c.optim.warmup_steps = 500
  c.train.epochs = 10
  c.train.batch_size = 128
  c.train.eval_every_epochs = 5
  if variant == "minilm":
    c.encoder.hf_dir = "all-MiniLM-L6-v2"
    c.encoder.embedding_dropout = 0.0
    # The stages that made `:ngram` work, on the pretrained encoder: NGAME's first stage,
    # W from the warm-started label texts, the fused score (the paper configs' `:staged`).
    paper_configs.set_real_data_stages(c)
    c.optim.encoder_lr = 2e-5
    c.optim.classifier_lr = 0.3
  elif variant == "ngram":
    # Tuned on the validation splits of debian-recommends-20k and debian-builddeps-33k.
    c.encoder.arch = "ngram_bag"
    c.encoder.hidden_size = 256
    # 2^17 buckets read as 2^18 on both validation splits: the table's dense Adam update is
    # most of a step, so half the table is about half the step (docs/results/builddeps.md).
    c.encoder.ngram.hash_buckets = 1 << 17
    # 1,024 pairs per step, four times the base config's in-batch negatives; 5 epochs read
    # as 10 and 20 on both validation splits, in less time (docs/results/builddeps.md).
    c.warmstart.epochs = 5
    c.warmstart.batch_size = 1024
    c.warmstart.lr = 3e-3
    # A softer in-batch softmax than the base config's 20: higher on the held-out reads of
    # both datasets (docs/results/builddeps.md, "The warm start's softmax").
    c.warmstart.inverse_temperature = 10.0
    c.classifier.init = "label_text"
    # A third of the warm start's rate: the classifier stage moves E(x) less, and the
    # neighbour vote reads the training rows' E(x) (docs/results/builddeps.md).
    c.optim.encoder_lr = 3e-4
    c.optim.classifier_lr = 0.3
    # Adam on the table rows a batch reads: half the step (training/table_rows.py).
    c.optim.encoder_table_update = "rows"
    # 4 epochs of the classifier stage, hard negatives refreshed for the third: 5 read no
    # higher on the held-out reads of both datasets (and 10 no higher than 5 on their
    # validation splits), in more time (docs/results/builddeps.md).
    c.train.epochs = 4
    c.negatives.tau_s = c.negatives.tau_r = 2
    # 4,096 draws shared by the batch, each weighted L / 4096, instead of 400 per query at
    # L / 400: less variance for a dense matmul (docs/results/builddeps.md).
    c.negatives.random_draws = "shared"
    c.negatives.k_r = 4096
    c.encoder.embedding_dropout = 0.5
    # How much the label texts weigh is the dataset's: chosen on the held-out 10%.
    c.data.validation_fraction = 0.1
    # At most 10^5 rows: past that a read is no sharper, and a tenth of a 10^8-row dataset
    # would be rows W never trains on, each read by every pass of the choice over all
    # labels (docs/planner.md, "The score choice").
    c.data.validation_max_rows = 100_000
    c.scoring.label_text_weight = 0.5  # the periodic evaluations' score
    c.scoring.label_text_weight_choices = (0.0, 0.1, 0.3, 0.5, 0.7)
    c.scoring.label_text_scale = 5.0
    # And the label-text term's shape, first: sigmoid(s (cos - theta)) with theta 0 lifts
    # every tail label whose text points the query's way above head labels W holds; a shift
    # keeps the term for close texts (docs/results/depends.md).
    c.scoring.label_text_shape_choices = ((5.0, 0.0), (10.0, 0.75), (20.0, 0.75))
    # So is how much the nearest training rows' labels weigh (xc/neighbour_vote.py).
    c.scoring.neighbour_weight_choices = (0.0, 0.3, 0.5, 0.7, 0.9)
    # Both at once: where W is weak the vote wants more of the label texts than W alone does
    # (docs/results/pypi.md, "The score's two weights, chosen together").
    c.scoring.choose_jointly = True
    # By P@1 + P@5, the two precisions users read: by P@1 alone, one validation row can
    # decide among 25 pairs (docs/results/pypi.md).
    c.scoring.choose_by = ("P@1", "P@5")
    # Then the lexical terms' two weights (xc/lexical.py), with the model's weights fixed:
    # where a label follows from one exact token of the text, TF-IDF keeps what E(x) blurs
    # (docs/results/lexical.md).
    c.scoring.lexical_label_text_weight_choices = (0.0, 0.1, 0.3)
    c.scoring.lexical_neighbour_weight_choices = (0.0, 0.1, 0.3, 0.5)
  else:
    # The tiny random BERT is the base config's encoder (hidden 64, 2 layers).
    c.encoder.embedding_dropout = 0.2
    c.optim.encoder_lr = 2e-3
    c.optim.classifier_lr = 20.0
  return c
