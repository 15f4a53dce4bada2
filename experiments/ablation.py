"""The negative-sampling ablation (paper table tab:rq3) at CPU scale: a synthetic set where
random negatives rarely land in a query's group of confusable labels.

  python benchmarks/strategies.py --config=experiments/ablation.py --out=ablation.jsonl

10,000 labels in groups of 16 that share 3 of their 5 words, 40,000 training queries; each
step sees 144 negatives per query (k_h=16, k_r=128): uniform draws hit a query's group
about 0.2 times, an index over W returns the whole group.
"""
import os

from astra_jax.config_base import base_config


def get_config():
  c = base_config()
  c.data.dir = os.path.join(os.environ.get("ASTRA_DATA", os.path.expanduser("~/.cache/astra_jax")),
                            "ablation")
  c.data.synthetic.enabled = True
  c.data.synthetic.num_labels = 10000
  c.data.synthetic.num_train = 40000
  c.data.synthetic.num_test = 5000
  c.data.synthetic.group_size = 16
  c.data.synthetic.vocab_size = 20000
  c.data.max_len = 24
  c.data.augment_label_text = True
  c.encoder.hidden_size = 64
  c.encoder.num_layers = 2
  c.encoder.num_heads = 2
  c.encoder.intermediate_size = 128
  c.encoder.embedding_dropout = 0.2
  c.negatives.k_p = 7
  c.negatives.k_h = 16
  c.negatives.k_r = 128
  c.negatives.tau_s = 2
  c.negatives.tau_r = 2
  c.optim.encoder_lr = 2e-3
  c.optim.classifier_lr = 20.0
  c.optim.warmup_steps = 200
  c.train.epochs = 8
  c.train.batch_size = 128
  c.train.eval_every_epochs = 0
  return c
