"""SS-120M: the paper's proprietary sponsored-search dataset (queries -> advertisers' bid
phrases): 370,080,440 training queries, 120,293,341 labels with texts, 92,532,582 test
queries, 10.4 labels per query (astra_jax/data/catalog.py on the paper's inconsistent
averages); short text (32 tokens). Trained in the paper on 8 V100s in 25 hours.

It cannot be downloaded. Its synthetic stand-in has the same statistics at a scale that
trains in minutes on a CPU (L, N and test points x SCALE; default ~1e-4):

  python -m astra_jax.main --config=experiments/ss120m.py:synthetic --workdir=workdir/ss120m-synth
  python -m astra_jax.main --config=experiments/ss120m.py:synthetic,0.001   # 120k labels

With the real data (or any of that size), data/SS-120M (or --config.data.dir=PATH) holds
trn_X_Y.txt, tst_X_Y.txt and the texts as trn_X.txt/tst_X.txt/Y.txt (or
raw_data/{train,test,label}.raw.txt, or {trn,tst,lbl}.json.gz):

  python -m astra_jax.plan --config=experiments/ss120m.py --gpu=v100-32gb
  python -m astra_jax.main --config=experiments/ss120m.py --workdir=workdir/ss120m

The appendix table has no row for the SS datasets; ours is a starting point, not the
paper's: LF-AmazonTitles-1.3M's row (short text, the largest public L) with a per-GPU batch
of 128 (global 2,048), 10 epochs (what 25 hours on 8 V100s allow at a few thousand queries
per second per GPU; hard negatives from epoch 5), k_p = 69 (10.4 positives per query on
average; paper_configs.positives_to_cover). As the paper does for very large L: a bias-free
bottleneck to d = 64 and W split over all 8 GPUs (mesh 1 x 8; the encoder is data parallel
over all 8). Negatives: 16 x 15 = 240 hard and 16 x 100 = 1,600 random per query, i.e.
30 and 200 per W shard. No gradient accumulation: 256 queries per V100 fit in fp32 with a
third of it free (python -m astra_jax.plan; raise train.grad_accum_steps for larger
batches or fewer GPUs). Encoder: DistilBERT (see lf_amazontitles_131k.py for where it is
looked for; without it, an error).
"""

from astra_jax.config import paper_configs
from astra_jax.config.base import base_config


def get_config(variant: str = ""):
  c = base_config()
  paper_configs.set_dataset(c, "SS-120M")
  paper_configs.set_table_row(
    c,
    batch_size=128,
    epochs=10,
    encoder_lr=3e-6,
    classifier_lr=0.01,
    dropout=0.75,
    warmup=5000,
    weight_decay=1e-4,
    k_r=100,
    k_h=15,
    k_p=16,
    source="not in the paper: LF-AmazonTitles-1.3M's row, batch 128 per GPU, 10 epochs, k_p 16",
  )
  paper_configs.set_encoder(c, "sentence-transformers/msmarco-distilbert-base-v4")
  c.encoder.bottleneck_dim = 64
  c.train.grad_accum_steps = 1
  c.mesh.data, c.mesh.model = 1, 8
  return paper_configs.apply_variant(c, variant, "experiments/ss120m.py")
