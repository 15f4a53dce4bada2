"""SS-20M: the paper's proprietary sponsored-search dataset (queries -> advertisers' bid
phrases): 146,193,053 training queries, 19,049,952 labels with texts, 16,629,030 test
queries, 26 labels per query; short text (32 tokens). Trained in the paper on 2 V100s.

It cannot be downloaded. Its synthetic stand-in has the same statistics at a scale that
trains in minutes on a CPU (L, N and test points x SCALE; default ~1e-4):

  python -m astra_jax.main --config=experiments/ss20m.py:synthetic --workdir=workdir/ss20m-synth
  python -m astra_jax.main --config=experiments/ss20m.py:synthetic,0.001    # 19k labels

With the real data (or any of that size), data/SS-20M (or --config.data.dir=PATH) holds
trn_X_Y.txt, tst_X_Y.txt and the texts as trn_X.txt/tst_X.txt/Y.txt (or
raw_data/{train,test,label}.raw.txt, or {trn,tst,lbl}.json.gz):

  python -m astra_jax.plan --config=experiments/ss20m.py --gpu=v100-32gb
  python -m astra_jax.main --config=experiments/ss20m.py --workdir=workdir/ss20m

The appendix table has no row for the SS datasets; ours is a starting point, not the
paper's: LF-AmazonTitles-1.3M's row (short text, the largest public L) with a per-GPU batch
of 128 (global 2,048; 2 micro-batches of 1,024 on 2 GPUs: the smallest accumulation that
leaves a quarter of a V100-32GB free in fp32, python -m astra_jax.plan), 20 epochs (what
130 hours on 2 V100s allow at a few thousand queries per second per GPU), k_p = 177 (26
positives per query on average; paper_configs.positives_to_cover). As the paper does for
very large L: a bias-free bottleneck to d = 64 and W split over both GPUs (mesh 1 x 2;
the encoder is data parallel over both). Negatives: 16 x 15 = 240 hard and 16 x 100 = 1,600
random per query, i.e. 120 and 800 per W shard. Encoder: DistilBERT (see
lf_amazontitles_131k.py for where it is looked for; without it, an error).
"""

from astra_jax.config import paper_configs
from astra_jax.config.base import base_config


def get_config(variant: str = ""):
  c = base_config()
  paper_configs.set_dataset(c, "SS-20M")
  paper_configs.set_table_row(
    c,
    batch_size=128,
    epochs=20,
    encoder_lr=3e-6,
    classifier_lr=0.01,
    dropout=0.75,
    warmup=5000,
    weight_decay=1e-4,
    k_r=100,
    k_h=15,
    k_p=32,
    source="not in the paper: LF-AmazonTitles-1.3M's row, batch 128 per GPU, 20 epochs, k_p 32",
  )
  paper_configs.set_encoder(c, "sentence-transformers/msmarco-distilbert-base-v4")
  c.encoder.bottleneck_dim = 64
  c.train.grad_accum_steps = 2
  c.mesh.data, c.mesh.model = 1, 2
  return paper_configs.apply_variant(c, variant, "experiments/ss20m.py")
