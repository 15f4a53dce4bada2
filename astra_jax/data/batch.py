"""A training batch as typed records, each array's logical sharding axes declared once.

  LabelBatch   the label side the sampler draws (negatives/sampler.py) and the loss reads
  TrainBatch   what a train step receives: the queries' token ids and their LabelBatch
  HostBatch    what the input pipeline yields: a TrainBatch and the training rows it holds

All three are NamedTuples, so jit, scan and shard_map see their arrays as pytree leaves
(an absent optional field is None, an empty subtree). The logical axes of every field are
written once, here (`LABEL_AXES`, `INPUT_AXES`); sharding.py maps logical names to mesh
axes (its RULES) and builds every PartitionSpec from them.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class LabelBatch(NamedTuple):
  """The label side of a batch (or micro-batch); B queries, M W shards.

  Attributes:
    pos_ids: (B, k_p) int32 global label ids of the kept positives (masked slots: 0).
    pos_mask: (B, k_p) bool.
    hard_ids: (B, M h) int32 hard negatives, grouped by W shard (block s from shard s).
    hard_mask: (B, M h) bool: real negatives (not padding, not a positive).
    rand_ids: (M r,) one uniform draw per shard shared by the batch, or (B, M r) drawn per
      query (negatives.random_draws=per_query).
    rand_mask: (B, M r) bool: draws that are not a positive or hard negative of the query.
    rand_weight: (M r,) float32 L_s / r, the unbiased weight of a shard's draw.
    pos_weight: (B,) float32 |P| / kept positives (None: 1).
    all_pos_ids: (B, P_max) int32 every positive, -1 padded, for the strategies that need
      them (full-L, the uptodate oracle); None otherwise.
  """

  pos_ids: Any
  pos_mask: Any
  hard_ids: Any
  hard_mask: Any
  rand_ids: Any
  rand_mask: Any
  rand_weight: Any
  pos_weight: Any = None
  all_pos_ids: Any = None

  @property
  def per_query_random(self) -> bool:
    """Random negatives drawn per query (rand_ids has the queries' axis) or shared."""
    return self.rand_ids.ndim == self.pos_ids.ndim


class TrainBatch(NamedTuple):
  """A step's input: arrays with a leading micro-batch axis A (train.grad_accum_steps).

  Attributes:
    input_ids: (A, B/A, T) int32 token ids of the queries.
    labels: their LabelBatch, each array (A, B/A, ...) (a shared draw: (A, M r)).
  """

  input_ids: Any
  labels: LabelBatch


class HostBatch(NamedTuple):
  """What the input pipeline yields (numpy).

  Attributes:
    rows: (B,) int32 training row ids of the step's queries, in batch order.
    batch: the TrainBatch sent to the devices.
  """

  rows: Any
  batch: TrainBatch


# Logical axes of each field (after the micro-batch axis), by the names of sharding.RULES:
# a query's token ids are split over every device; its labels over its data group ('data'),
# W's rows, and so the negatives drawn from them, over 'model'.
INPUT_AXES = ("query", None)
LABEL_AXES = LabelBatch(
  pos_ids=("query_group", None),
  pos_mask=("query_group", None),
  hard_ids=("query_group", "label_shard"),
  hard_mask=("query_group", "label_shard"),
  rand_ids=("label_shard",),
  rand_mask=("query_group", "label_shard"),
  rand_weight=("label_shard",),
  pos_weight=("query_group",),
  all_pos_ids=("query_group", None),
)
PER_QUERY_RAND_AXES = ("query_group", "label_shard")  # rand_ids drawn per query


def label_axes(labels: LabelBatch) -> LabelBatch:
  """LABEL_AXES for these labels: per-query random draws laid out like hard negatives, and
  None where a field is absent."""
  axes = (
    LABEL_AXES._replace(rand_ids=PER_QUERY_RAND_AXES) if labels.per_query_random else (LABEL_AXES)
  )
  return LabelBatch(*(None if x is None else a for x, a in zip(labels, axes)))
