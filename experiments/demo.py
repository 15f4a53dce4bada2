"""The embedded demo: a synthetic XC dataset (generated once, cached) and a tiny BERT.

  python -m astra_jax.main --config=experiments/demo.py --workdir=workdir/demo

Runs end to end in a few minutes on 2 CPU cores.
"""

import os

from astra_jax.config.base import base_config


def get_config():
  c = base_config()
  c.data.dir = os.path.join(
    os.environ.get("ASTRA_DATA", os.path.expanduser("~/.cache/astra_jax")), "demo"
  )
  c.data.synthetic.enabled = True
  c.data.synthetic.num_labels = 2000
  c.data.synthetic.num_train = 20000
  c.data.synthetic.num_test = 4000
  c.data.max_len = 24
  c.data.augment_label_text = True
  # The tiny random BERT is the base config's encoder (hidden 64, 2 layers).
  c.encoder.embedding_dropout = 0.2
  c.negatives.k_p = 7
  c.negatives.k_h = 16
  c.negatives.k_r = 256
  c.negatives.tau_s = 4
  c.negatives.tau_r = 2
  c.optim.encoder_lr = 2e-3
  c.optim.classifier_lr = 20.0  # per-row SGD step is lr / batch_size (mean over batch)
  c.optim.warmup_steps = 100
  c.train.epochs = 10
  c.train.batch_size = 128
  c.train.eval_every_epochs = 2
  c.eval.max_test_rows = 1000
  return c
