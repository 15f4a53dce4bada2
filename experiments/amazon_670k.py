"""Amazon-670K: 490,449 training products, 670,091 labels without label features, 153,025 test
points (product-to-product recommendation from full text; 128 tokens).

Data: the Extreme Classification Repository
(http://manikvarma.org/downloads/XC/XMLRepository.html), raw-text version, unpacked into
data/Amazon-670K (or --config.data.dir=PATH):
  trn.json.gz, tst.json.gz, lbl.json.gz   one JSON object per line (uid, title, content,
                                          target_ind)
or trn_X_Y.txt + tst_X_Y.txt with the texts as trn_X.txt/tst_X.txt/Y.txt (Renée) or
raw_data/{train,test,label}.raw.txt (NGAME). The text of a point is its title + content
(data.use_content); label texts, if present, are not trained on.

  python -m astra_jax.plan --config=experiments/amazon_670k.py --gpu=v100-32gb
  python -m astra_jax.main --config=experiments/amazon_670k.py --workdir=workdir/amazon670k
  python -m astra_jax.main --config=experiments/amazon_670k.py:synthetic  # CPU stand-in

Encoder: DistilBERT as in the paper (sentence-transformers/msmarco-distilbert-base-v4; Renée
used all-roberta-large-v1 with 512 tokens here; the paper says d = 768 up to 3M labels, and
we use 128 tokens as for the other full-text datasets): put it (config.json,
model.safetensors, tokenizer files) in $ASTRA_MODELS_DIR/msmarco-distilbert-base-v4 (default
models/), or pass --config.encoder.hf_dir=DIR (the tokenizer follows). Without it: an error;
--config.encoder.hf_dir=all-MiniLM-L6-v2 trains the installed MiniLM (d = 384) instead.

Hyper-parameters: the appendix table's row, translated by astra_jax/config/paper_configs.py: global
batch 16 x 16 = 256, 16 x 50 = 800 hard and 16 x 400 = 6,400 random negatives per query,
classifier lr 0.01 x 256. Gradient accumulation 4: the smallest that leaves a quarter of a
V100-32GB free in fp32 with DistilBERT (python -m astra_jax.plan). One device (the paper's
single-V100 timings); --config.mesh.data=-1 spreads the same batch over all GPUs.
"""

from astra_jax.config import paper_configs
from astra_jax.config.base import base_config


def get_config(variant: str = ""):
  c = base_config()
  paper_configs.set_dataset(c, "Amazon-670K")
  paper_configs.set_table_row(
    c,
    batch_size=16,
    epochs=70,
    encoder_lr=4e-5,
    classifier_lr=0.01,
    dropout=0.8,
    warmup=10000,
    weight_decay=1e-3,
    k_r=400,
    k_h=50,
    k_p=7,
  )
  paper_configs.set_encoder(c, "sentence-transformers/msmarco-distilbert-base-v4")
  c.train.grad_accum_steps = 4
  c.mesh.data, c.mesh.model = 1, 1
  return paper_configs.apply_variant(c, variant, "experiments/amazon_670k.py")
