"""The tiny training problem the step tests share: a 1-layer encoder of width D, L labels
with 3 positives in each of 40 rows, and three batches of B rows with k_h = KH hard
negatives per W shard, sampled as the trainer samples them."""

import jax
import ml_collections
import numpy as np
from flax import nnx

from astra_jax.data.batch import TrainBatch
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.model.encoder import Encoder, EncoderConfig
from astra_jax.negatives.sampler import NegativeSampler

L, B, D, KH = 64, 16, 8, 3


def problem(
  num_shards, micro_batches=1, dropout=0.3, dtype="float32", per_query=False, num_labels=L, k_p=4
):
  """(graphdef, encoder parameters, optimizer config, 3 batches of `micro_batches` stacked
  micro-batches, W's starting rows) for a W split into `num_shards` row shards."""
  cfg = EncoderConfig(
    vocab_size=40,
    hidden_size=D,
    num_layers=1,
    num_heads=2,
    intermediate_size=16,
    max_position=16,
    embedding_dropout=dropout,
    hidden_dropout=0.1 if dropout else 0.0,
    attention_dropout=0.1 if dropout else 0.0,
    dtype=dtype,
  )
  graphdef, enc = nnx.split(Encoder(cfg, nnx.Rngs(0)), nnx.Param)
  oc = ml_collections.ConfigDict(
    dict(
      encoder_lr=1e-2,
      classifier_lr=0.5,
      warmup_steps=1,
      encoder_weight_decay=0.0,
      classifier_weight_decay=0.05,
      classifier_momentum=0.0,
      grad_clip_norm=0.0,
    )
  )
  rng = np.random.default_rng(0)
  n = num_labels
  labels = SparseRows.from_lists([list(rng.choice(n, 3, replace=False)) for _ in range(40)], n)
  sampler = NegativeSampler(
    labels, k_p=k_p, k_h=KH, k_r=24, num_shards=num_shards, per_query_random=per_query
  )
  R = -(-n // num_shards)  # rows per shard of the padded W; the last shard's real: n - s R
  batches = []
  for _ in range(3):
    rows = rng.choice(40, B, replace=False)
    # hard negatives grouped by shard, as the per-shard indexes return them
    hard = np.concatenate(
      [s * R + rng.choice(min(R, n - s * R), (B, KH)) for s in range(num_shards)], 1
    )
    parts = [
      sampler(r, rng, h)
      for r, h in zip(np.split(rows, micro_batches), np.split(hard, micro_batches))
    ]
    labels = jax.tree.map(lambda *xs: np.stack(xs), *parts)
    batches.append(
      TrainBatch(
        rng.integers(1, 40, (micro_batches, B // micro_batches, 10)).astype(np.int32), labels
      )
    )
  w0 = 0.5 * np.asarray(jax.random.normal(jax.random.key(1), (n, D)))
  return graphdef, enc, oc, batches, w0
