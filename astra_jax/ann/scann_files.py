"""A ScaNN searcher over a partition computed outside ScaNN (grouped_index's leaves).

ScaNN's Python API trains its own partition only. But a searcher it loads from disk takes
the partition from its files: the leaf centres (`serialized_partitioner.pb`) and each row's
leaves (`datapoint_to_token.npy`). Written with the float rows and the searcher's config,
and no quantizer, they load into a searcher that trains its anisotropic quantizer and codes
the rows itself, as a build would have. The file layout is ScaNN's (1.4): a row's leaves
interleaved, in increasing order, -1 where a row has one leaf only.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
from google.protobuf import text_format

_ASSETS = """\
assets { asset_type: PARTITIONER asset_path: "serialized_partitioner.pb" }
assets { asset_type: TOKENIZATION_NPY asset_path: "datapoint_to_token.npy" }
assets { asset_type: DATASET_NPY asset_path: "dataset.npy" }
"""


def partitioner_proto(centres: np.ndarray, soar: bool):
  """ScaNN's SerializedPartitioner for a one-level k-means tree with these leaf centres
  (leaf i: row i), learned spilling on where rows have SOAR's second leaf."""
  from scann.partitioning import partitioner_pb2

  spilling = "learned_spilling_type: TWO_CENTER_ORTHOGONALITY_AMPLIFIED" if soar else ""
  proto = text_format.Parse(
    f"n_tokens: {len(centres)} kmeans {{ kmeans_tree {{ root {{ leaf_id: -1 "
    f"learned_spilling_threshold: nan }} {spilling} }} }}",
    partitioner_pb2.SerializedPartitioner(),
  )
  root = proto.kmeans.kmeans_tree.root
  for i, centre in enumerate(np.asarray(centres, np.float32)):
    root.centers.add().dimension.extend(centre.tolist())
    child = root.children.add()
    child.leaf_id = i
    child.learned_spilling_threshold = float("nan")
  return proto


def token_file(tokens: np.ndarray) -> np.ndarray:
  """ScaNN's datapoint_to_token array for (L, 1) or (L, 2) leaf ids: (L,) as they are, or
  each row's two ids in increasing order (-1, one leaf only, last), flattened."""
  tokens = np.asarray(tokens, np.int32)
  if tokens.shape[1] == 1:
    return tokens[:, 0].copy()
  first, second = tokens[:, 0], tokens[:, 1]
  low = np.where(second >= 0, np.minimum(first, second), first)
  high = np.where(second >= 0, np.maximum(first, second), -1)
  return np.stack([low, high], axis=1).ravel()


def load_with_partition(
  rows: np.ndarray,
  config_text: str,
  centres: np.ndarray,
  tokens: np.ndarray,
  tmp_dir: str | None = None,
):
  """A ScaNN searcher over `rows` whose leaves are `centres` and `tokens`.

  Args:
    rows: (L, d) float32 rows (a memmap is copied to the files in blocks).
    config_text: the searcher's ScannConfig as text (a builder's `create_config()`), its
      partitioning's leaf count equal to len(centres).
    centres: (leaves, d) float32 leaf centres.
    tokens: (L, 1) leaf ids, or (L, 2) with SOAR's second leaf (-1 for none).
    tmp_dir: where the files are written, then removed (None: TMPDIR); they hold one
      float32 copy of `rows`.
  Returns:
    The loaded ScannSearcher."""
  import scann
  from scann.proto import scann_pb2

  config = text_format.Parse(config_text, scann_pb2.ScannConfig())
  if config.partitioning.num_children != len(centres):
    raise ValueError(
      f"the config has {config.partitioning.num_children} leaves, the partition {len(centres)}"
    )
  if len(tokens) != len(rows):
    raise ValueError(f"{len(tokens)} rows' leaves for {len(rows)} rows")
  path = tempfile.mkdtemp(prefix="scann-partition-", dir=tmp_dir)
  try:
    with open(os.path.join(path, "scann_config.pb"), "wb") as f:
      f.write(config.SerializeToString())
    proto = partitioner_proto(centres, soar=tokens.shape[1] > 1)
    with open(os.path.join(path, "serialized_partitioner.pb"), "wb") as f:
      f.write(proto.SerializeToString())
    np.save(os.path.join(path, "datapoint_to_token.npy"), token_file(tokens))
    dataset = np.lib.format.open_memmap(
      os.path.join(path, "dataset.npy"), "w+", np.float32, rows.shape
    )
    for s in range(0, len(rows), 1 << 20):
      dataset[s : s + (1 << 20)] = rows[s : s + (1 << 20)]
    dataset.flush()
    del dataset
    with open(os.path.join(path, "scann_assets.pbtxt"), "w") as f:
      f.write(_ASSETS)
    return scann.scann_ops_pybind.load_searcher(path, assets_backcompat_shim=False)
  finally:
    shutil.rmtree(path, ignore_errors=True)
