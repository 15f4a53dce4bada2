"""Train on your own dataset in the Extreme Classification Repository layout.

  python -m astra_jax.main --config=experiments/xc_text.py --config.data.dir=PATH
  python -m astra_jax.main --config=experiments/xc_text.py:tiny --config.data.dir=PATH

PATH holds trn_X_Y.txt, tst_X_Y.txt and texts in any layout (trn_X.txt/tst_X.txt/Y.txt,
raw_data/{train,test,label}.raw.txt, or {trn,tst,lbl}.json.gz), optionally
filter_labels_test.txt. The default encoder is the pretrained all-MiniLM-L6-v2 with its
tokenizer; `:tiny` keeps its tokenizer but trains a small randomly initialised BERT over
the same vocabulary (fast on a CPU). Set propensity constants for your data family:
--config.data.propensity_A/B (Amazon 0.6/2.6, Wikipedia 0.5/0.4, otherwise 0.55/1.5).

Choose settings on --config.data.validation_fraction=0.1 (never on the test split), and
compare with what classic methods get for free: `python -m astra_jax.baselines --data=PATH`,
--config.eval.tfidf_baseline=True, --config.eval.knn_diagnostic=20 (docs/real_data.md). On
the real debian-recommends-20k, `:tiny` reaches test P@1 22.5, below TF-IDF kNN's 34.4.
"""
from astra_jax.config_base import base_config


def get_config(variant: str = "minilm"):
  if variant not in ("minilm", "tiny", "ngram"):
    raise ValueError(f"experiments/xc_text.py:{variant}: variants are 'minilm', 'tiny' and "
                     f"'ngram'")
  c = base_config()
  c.data.tokenizer_dir = "all-MiniLM-L6-v2"   # resolved to the installed package's files
  c.data.max_len = 32                         # titles; use 128 for full text
  c.data.augment_label_text = True            # used only when label texts exist
  c.negatives.k_p = 7
  c.negatives.k_h = 50
  c.negatives.k_r = 400
  c.optim.warmup_steps = 500
  c.train.epochs = 10
  c.train.batch_size = 128
  c.train.eval_every_epochs = 5
  if variant == "minilm":
    c.encoder.hf_dir = "all-MiniLM-L6-v2"
    c.encoder.embedding_dropout = 0.7
    c.optim.encoder_lr = 1e-4
    c.optim.classifier_lr = 1.0
  elif variant == "ngram":
    # Tuned on debian-recommends-20k's validation split (docstring above).
    c.encoder.arch = "ngram_bag"
    c.encoder.hidden_size = 256
    c.encoder.embedding_dropout = 0.0
    c.warmstart.epochs = 5
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
