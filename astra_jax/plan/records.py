"""The planner's records: an estimated item, the dataset's size, the nodes' layout and the
plan itself, with the GPUs it plans for."""

from __future__ import annotations

import dataclasses

GiB = 2**30


# Memory per device (TPU chips too, for the TPU VM recipe in launch/README.md).
GPUS = {
  "v100-32gb": 32 * GiB,
  "v100-16gb": 16 * GiB,
  "a100-40gb": 40 * GiB,
  "a100-80gb": 80 * GiB,
  "h100-80gb": 80 * GiB,
  "h200-141gb": 141 * GiB,
  "tpu-v4-32gb": 32 * GiB,
  "tpu-v5e-16gb": 16 * GiB,
  "tpu-v5p-95gb": 95 * GiB,
}


USABLE_FRACTION = 0.9


@dataclasses.dataclass
class Item:
  name: str
  bytes: int
  formula: str = ""
  paged: bool = False  # a memmap: in the page cache when hot, not counted as resident


@dataclasses.dataclass
class DataSize:
  num_labels: int
  num_train: int  # training rows before label-text augmentation
  rows: int  # training rows the loop iterates over (+ label texts)
  source: str


@dataclasses.dataclass(frozen=True)
class NodeLayout:
  """How the devices are spread over nodes and processes."""

  num_gpus: int
  gpus_per_node: int
  processes_per_node: int

  @property
  def nodes(self) -> int:
    return self.num_gpus // self.gpus_per_node

  @property
  def gpus_per_process(self) -> int:
    return self.gpus_per_node // self.processes_per_node


@dataclasses.dataclass(frozen=True)
class VoteSearchCost:
  """The vote's search of the memory for the test and validation rows (ann/memory_search.py).

  Attributes:
    scann: True for a ScaNN index over the memory, False for the exact search.
    rows_per_query: memory rows (and ScaNN leaf centres) a query scores.
    search_flop: multiply-adds x 2 of those scores for every query.
    build_flop: multiply-adds x 2 of assigning the memory's rows to the index's leaves (0
      for the exact search).
  """

  scann: bool
  rows_per_query: int
  search_flop: float
  build_flop: float
  memory_rows: int = 0
  test_rows: int = 0
  validation_rows: int = 0
  on_devices: bool = True  # the keys split over every GPU, else over the processes' hosts


@dataclasses.dataclass(frozen=True)
class VoteTime:
  """The vote's seconds after training (vote_time.py).

  Attributes:
    encode_s: the memory's rows encoded over every GPU of the run.
    search_s: the search of the test and validation rows: over every GPU of the run (the
      exact search), or one process's share on its host cores (ScaNN).
    build_s: one process's ScaNN index builds (the choice's memory and the final one); 0
      for the exact search.
    search_on: where the search runs, in words.
  """

  encode_s: float
  search_s: float
  build_s: float
  search_on: str


@dataclasses.dataclass(frozen=True)
class PassTime:
  """One pass of the score choice over the validation split, in seconds of the run's
  GPUs (choice_time.py).

  Attributes:
    name: what it chooses (config/choice_reads.ChoicePass.name).
    weight_rows: the weight rows it mixes and ranks by.
    encode_s: the validation rows through the encoder.
    product_s: W's and the label texts' products.
    mix_s: each weight row's mix and top-k.
    host_s: the lexical terms' TF-IDF products on each process's host; 0 without them.
  """

  name: str
  weight_rows: int
  encode_s: float
  product_s: float
  mix_s: float
  host_s: float = 0.0

  @property
  def total_s(self) -> float:
    return self.encode_s + self.product_s + self.mix_s + self.host_s


@dataclasses.dataclass(frozen=True)
class ChoiceTime:
  """The score choice's seconds after training (choice_time.py).

  Attributes:
    validation_rows: the rows each pass reads, over all labels.
    passes: each pass's seconds, in the order the choice reads them.
    runs_on: where, in words.
  """

  validation_rows: int
  passes: tuple[PassTime, ...]
  runs_on: str

  @property
  def total_s(self) -> float:
    return sum(p.total_s for p in self.passes)


@dataclasses.dataclass(frozen=True)
class WarmStartCost:
  """The warm start's pairs, a process's memory during the stage, and its seconds
  (warm_start.py).

  Attributes:
    pairs: the (query, positive) pairs of the kept training rows.
    pairs_per_epoch: those an epoch takes.
    epochs: `warmstart.epochs`.
    items: host RAM of each process during the stage.
    gpus: the GPUs a step's pairs are split over.
    pairs_per_s: pairs a second over those GPUs (0: the GPU kind has no rates).
    epoch_s: an epoch's seconds (0 without a rate).
    estimated: whether the rate is the plan's estimate rather than a given one.
  """

  pairs: int
  pairs_per_epoch: int
  epochs: int
  items: list[Item]
  gpus: int
  pairs_per_s: float
  epoch_s: float
  estimated: bool


@dataclasses.dataclass
class Plan:
  config_name: str
  data: DataSize
  encoder: dict
  mesh: dict
  batch: dict
  negatives: dict
  gpu: str
  device_items: list[Item]
  worker_items: list[Item]  # host RAM of a refresh worker process
  trainer_items: list[Item]  # host RAM of a training process
  disk_items: list[Item]  # every file the run writes (one node's share of its processes')
  notes: list[str]
  node: dict = dataclasses.field(default_factory=dict)  # NodeLayout + shards per process
  prep_items: list[Item] = dataclasses.field(default_factory=list)  # a node's preparation
  node_items: list[Item] = dataclasses.field(default_factory=list)  # a node's RAM in training
  prep_seconds: dict = dataclasses.field(default_factory=dict)
  suggestions: list[str] = dataclasses.field(default_factory=list)
  # Seconds per refresh by each backend against an epoch (refresh_time.refresh_times).
  refresh: dict = dataclasses.field(default_factory=dict)
  # After training, each process: a score beyond W (score_extras.py).
  score_items: list[Item] = dataclasses.field(default_factory=list)
  # After training, each GPU beside the trained state: the vote memory's share.
  score_device_items: list[Item] = dataclasses.field(default_factory=list)
  vote_search: VoteSearchCost | None = None
  vote_time: VoteTime | None = None
  # Before W exists: the warm start's pairs, memory and hours (warm_start.WarmStartCost).
  warm_start: WarmStartCost | None = None
  # After training: the score choice's passes over the validation split (choice_time.py).
  choice_time: ChoiceTime | None = None

  @property
  def node_total(self) -> int:
    return sum(i.bytes for i in self.node_items)

  @property
  def prep_peak(self) -> int:
    """A node's preparation: one builder, its phases one after the other."""
    return max((i.bytes for i in self.prep_items), default=0)

  @property
  def disk_total(self) -> int:
    return sum(i.bytes for i in self.disk_items)

  @property
  def device_total(self) -> int:
    return sum(i.bytes for i in self.device_items)

  @property
  def usable(self) -> int:
    return int(GPUS[self.gpu] * USABLE_FRACTION)

  @property
  def fits(self) -> bool:
    return self.device_total <= self.usable

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    out.update(
      device_total=self.device_total,
      usable=self.usable,
      fits=self.fits,
      headroom=self.usable - self.device_total,
      worker_resident=resident(self.worker_items),
      trainer_resident=resident(self.trainer_items),
      node_total=self.node_total,
      node_resident=resident(self.node_items),
      prep_peak=self.prep_peak,
      disk_total=self.disk_total,
    )
    return out


def resident(items: list[Item]) -> int:
  return sum(i.bytes for i in items if not i.paged)
