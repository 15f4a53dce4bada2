"""The paper's datasets: their statistics (ASTRA paper, table `tab:datastats`) and where
they come from. Used by the dataset configs (`experiments/<dataset>.py`) for their sizes,
synthetic stand-ins and missing-data messages, and by the memory planner when a dataset
is not on disk.

The table's two "average" columns are swapped for some rows: N x (labels per point) must
equal L x (points per label). `labels_per_point` below is the value that satisfies it
(LF-AmazonTitles-131K / LF-Amazon-131K 2.3, LF-AmazonTitles-1.3M 22.2, LF-Wikipedia-500K
4.8 — the repository's own figures), except for SS-120M, where neither reading does
(10.4 and 10.4 printed): we take 10.4 labels per point (so 32 points per label).
"""

from __future__ import annotations

import dataclasses

XC_REPOSITORY = "http://manikvarma.org/downloads/XC/XMLRepository.html"


@dataclasses.dataclass(frozen=True)
class PaperDataset:
  name: str
  config: str  # its experiment file
  text: str  # "titles" (short text), "full" (full text), "wikipedia"
  num_train: int
  num_labels: int
  num_test: int
  labels_per_point: float
  label_features: bool  # label texts exist (appended as training rows)
  public: bool  # in the Extreme Classification Repository

  @property
  def points_per_label(self) -> float:
    return self.num_train * self.labels_per_point / self.num_labels

  @property
  def propensity(self) -> tuple[float, float]:
    """(A, B) of the propensity model: Amazon 0.6/2.6, Wikipedia 0.5/0.4, else 0.55/1.5."""
    if self.name.startswith(("Amazon", "LF-Amazon")):
      return 0.6, 2.6
    if "Wikipedia" in self.name:
      return 0.5, 0.4
    return 0.55, 1.5

  @property
  def max_len(self) -> int:
    """Tokens per text as the field uses them: 32 titles, 128 full text, 256 Wikipedia."""
    return {"titles": 32, "full": 128, "wikipedia": 256}[self.text]


DATASETS = {
  d.name: d
  for d in [
    PaperDataset(
      "LF-AmazonTitles-131K",
      "experiments/lf_amazontitles_131k.py",
      "titles",
      294_805,
      131_073,
      134_835,
      2.3,
      True,
      True,
    ),
    PaperDataset(
      "LF-Amazon-131K",
      "experiments/lf_amazon_131k.py",
      "full",
      294_805,
      131_073,
      134_835,
      2.3,
      True,
      True,
    ),
    PaperDataset(
      "LF-Wikipedia-500K",
      "experiments/lf_wikipedia_500k.py",
      "wikipedia",
      1_813_391,
      501_070,
      783_743,
      4.8,
      True,
      True,
    ),
    PaperDataset(
      "LF-AmazonTitles-1.3M",
      "experiments/lf_amazontitles_1_3m.py",
      "titles",
      2_248_619,
      1_305_265,
      970_237,
      22.2,
      True,
      True,
    ),
    PaperDataset(
      "Amazon-670K",
      "experiments/amazon_670k.py",
      "full",
      490_449,
      670_091,
      153_025,
      5.5,
      False,
      True,
    ),
    PaperDataset(
      "Amazon-3M",
      "experiments/amazon_3m.py",
      "full",
      1_717_899,
      2_812_281,
      742_507,
      36.0,
      False,
      True,
    ),
    PaperDataset(
      "SS-20M",
      "experiments/ss20m.py",
      "titles",
      146_193_053,
      19_049_952,
      16_629_030,
      26.0,
      True,
      False,
    ),
    PaperDataset(
      "SS-120M",
      "experiments/ss120m.py",
      "titles",
      370_080_440,
      120_293_341,
      92_532_582,
      10.4,
      True,
      False,
    ),
  ]
}


def missing_hint(ds: PaperDataset) -> str:
  """The sentence appended to the missing-data error: where to get the dataset, or the
  command that trains on its synthetic stand-in."""
  synthetic = f"python -m astra_jax.main --config={ds.config}:synthetic"
  if ds.public:
    return (
      f"{ds.name}: download its raw-text version from the Extreme Classification "
      f"Repository ({XC_REPOSITORY}) and unpack it there (or point --config.data.dir "
      f"at it), or train on its synthetic stand-in: {synthetic}"
    )
  return (
    f"{ds.name} is proprietary (the paper's sponsored-search data) and cannot be "
    f"downloaded; train on its synthetic stand-in instead: {synthetic}"
  )
