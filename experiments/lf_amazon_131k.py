"""LF-Amazon-131K: 294,805 training products, 131,073 labels with texts, 134,835 test points
(product-to-product recommendation from title + description; 128 tokens).

Data: the Extreme Classification Repository
(http://manikvarma.org/downloads/XC/XMLRepository.html), raw-text version, unpacked into
data/LF-Amazon-131K (or --config.data.dir=PATH):
  trn.json.gz, tst.json.gz, lbl.json.gz   one JSON object per line (uid, title, content,
                                          target_ind)
  filter_labels_test.txt                  reciprocal pairs, removed at evaluation
or trn_X_Y.txt + tst_X_Y.txt with the texts as trn_X.txt/tst_X.txt/Y.txt (Renée) or
raw_data/{train,test,label}.raw.txt (NGAME). The text of a point is its title + content
(data.use_content).

  python -m astra_jax.plan --config=experiments/lf_amazon_131k.py --gpu=v100-32gb
  python -m astra_jax.main --config=experiments/lf_amazon_131k.py --workdir=workdir/lfa131k
  python -m astra_jax.main --config=experiments/lf_amazon_131k.py:synthetic  # CPU stand-in

Encoder: DistilBERT as in the paper (sentence-transformers/msmarco-distilbert-base-v4; as
Renée's command for LF-AmazonTitles-131K names): put it (config.json, model.safetensors,
tokenizer files) in $ASTRA_MODELS_DIR/msmarco-distilbert-base-v4 (default models/), or pass
--config.encoder.hf_dir=DIR (the tokenizer follows). Without it: an error;
--config.encoder.hf_dir=all-MiniLM-L6-v2 trains the installed MiniLM (d = 384) instead.

Hyper-parameters: the appendix table's row, translated by astra_jax/config/paper_configs.py: global
batch 16 x 32 = 512, 16 x 15 = 240 hard and 16 x 100 = 1,600 random negatives per query,
classifier lr 0.05 x 512. Gradient accumulation 4: the smallest that leaves a quarter of a
V100-32GB free in fp32 with DistilBERT (python -m astra_jax.plan). One device (the paper's
single-V100 timings); --config.mesh.data=-1 spreads the same batch over all GPUs.
"""

from astra_jax.config import paper_configs
from astra_jax.config.base import base_config


def get_config(variant: str = ""):
  c = base_config()
  paper_configs.set_dataset(c, "LF-Amazon-131K")
  paper_configs.set_table_row(
    c,
    batch_size=32,
    epochs=100,
    encoder_lr=1e-4,
    classifier_lr=0.05,
    dropout=0.75,
    warmup=5000,
    weight_decay=1e-4,
    k_r=100,
    k_h=15,
    k_p=7,
  )
  paper_configs.set_encoder(c, "sentence-transformers/msmarco-distilbert-base-v4")
  c.train.grad_accum_steps = 4
  c.mesh.data, c.mesh.model = 1, 1
  return paper_configs.apply_variant(c, variant, "experiments/lf_amazon_131k.py")
