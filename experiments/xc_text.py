"""Train on your own dataset in the Extreme Classification Repository layout.

  python -m astra_jax.main --config=experiments/xc_text.py --config.data.dir=PATH
  python -m astra_jax.main --config=experiments/xc_text.py:tiny --config.data.dir=PATH
  python -m astra_jax.main --config=experiments/xc_text.py:ngram --config.data.dir=PATH

PATH holds trn_X_Y.txt, tst_X_Y.txt and texts in any layout (trn_X.txt/tst_X.txt/Y.txt,
raw_data/{train,test,label}.raw.txt, or {trn,tst,lbl}.json.gz), optionally
filter_labels_test.txt. The default encoder is the pretrained all-MiniLM-L6-v2 with its
tokenizer (GPU advised), trained with the real-data stages (`paper_configs.
set_real_data_stages`: a warm start on (query, label text) pairs, W from the warm-started
label texts, the fused score); its learning rates and dropout are chosen on a validation
split by `python -m astra_jax.reproduce --table=encoders_real --data=PATH`, which then
reads the test split once (docs/real_data.md, "The pretrained encoder's recipe": not yet
measured at full length). `:tiny` keeps its tokenizer but trains a small randomly
initialised BERT over the same vocabulary (fast on a CPU). `:ngram` is the CPU recipe for
short texts: a hashed token n-gram bag encoder (fastText's architecture, `encoder.arch=ngram_bag`),
a 20-epoch siamese warm start on (query, label text) pairs, 1,024 per step (NGAME's
first stage), W initialised from the warm-started label-text embeddings, and the model's
score mixing the classifier with the label-text similarity (`scoring.label_text_weight`,
NGAME's inference).
Set propensity constants for your data family:
--config.data.propensity_A/B (Amazon 0.6/2.6, Wikipedia 0.5/0.4, otherwise 0.55/1.5).

Choose settings on --config.data.validation_fraction=0.1 (never on the test split), and
compare with what classic methods get for free: `python -m astra_jax.baselines --data=PATH`,
--config.eval.tfidf_baseline=True, --config.eval.knn_diagnostic=20 (docs/real_data.md). On
the real debian-recommends-20k, `:tiny` reaches test P@1 22.5, below TF-IDF kNN's 34.4.

`:ngram` was tuned on debian-recommends-20k's validation split only
(--config.data.validation_fraction=0.1, seed 0; 1,188 rows), one lever at a time, each
read at its evaluations (docs/real_data.md has every run): the classifier learning rate
(20 -> 3 -> 1 -> 0.3 -> 0.1: 0.3 best), the warm start with label-text init (validation P@1
after 2 epochs 18.3 without, 30.2 with), the encoder's learning rate after the warm start
(3e-3 or 1e-3: equal on W alone), and the fusion's weight and scale on a grid of 3 x 4 (a
plateau around beta 0.5, s 5: validation P@1 40.2 against 33-35 for W alone), then the
warm start's length and batch (5 epochs of 256 pairs -> 10 of 256 -> 20 of 1,024, the last
as many steps as the first with four times the in-batch negatives: the warm-started
encoder's label-text ranking alone reads validation P@1 26.9 -> 28.0 -> 29.4 and W alone at
the end 34.9 -> 35.2 -> 36.4, the fused score 40.2 -> 39.9 -> 40.5, equal within the split's
noise of about 1.4 points). Mining hard negatives from the first epoch (negatives.tau_s=0)
and a narrower bag with fewer collisions (hidden 128, 2^19 buckets) moved nothing either.
The test split was read once per fixed setting: with the 5-epoch warm start P@1 / P@3 /
P@5 38.74 / 28.90 / 21.44, with these settings 39.25 / 28.61 / 21.22 (19.7 minutes on 2
shared cores), against the TF-IDF kNN floor's 34.66 / 20.09 / 14.05.

All variants set `data.filter_self=auto`: where the training labels show that an item
never lists itself (item-to-item data: 45% of debian-recommends' points are labels
themselves, with the same text), each test row's own item is filtered from its ranking,
as the LF-* datasets' filter files do; on search-like data, whose queries equal their
labels' texts, nothing is filtered (astra_jax/data/self_filter.py). With it `:ngram` reads
test P@1 / P@3 / P@5 52.57 / 30.79 / 22.00 on debian-recommends-20k (8 minutes for the
whole run on 2 unloaded cores), against 37.70 / 21.09 / 14.18 for TF-IDF label text and
34.77 / 20.28 / 14.12 for TF-IDF kNN under the same filter
(`python -m astra_jax.baselines --data=PATH --filter_self=auto`).
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
    # Tuned on debian-recommends-20k's validation split (docstring above).
    c.encoder.arch = "ngram_bag"
    c.encoder.hidden_size = 256
    c.encoder.embedding_dropout = 0.0
    # 1,024 pairs per step: four times the in-batch negatives of the base config's 256 at
    # the same number of steps as 5 epochs of 256 (docs/real_data.md).
    c.warmstart.epochs = 20
    c.warmstart.batch_size = 1024
    c.warmstart.lr = 3e-3
    c.classifier.init = "label_text"
    c.optim.encoder_lr = 1e-3
    c.optim.classifier_lr = 0.3
    c.scoring.label_text_weight = 0.5
    c.scoring.label_text_scale = 5.0
  else:
    # The tiny random BERT is the base config's encoder (hidden 64, 2 layers).
    c.encoder.embedding_dropout = 0.2
    c.optim.encoder_lr = 2e-3
    c.optim.classifier_lr = 20.0
  return c
