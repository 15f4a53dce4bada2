import numpy as np
import pytest

from astra_jax.config import base as config_base
from astra_jax.data import dataset


def _cfg(d, tok, **data):
  c = config_base.base_config()
  c.data.dir, c.data.tokenizer_dir, c.data.max_len = str(d), tok, 6
  c.data.update(data)
  return c


def test_json_layout_with_label_text_augmentation(tmp_path, json_dataset):
  d = tmp_path / "ds"
  tok = json_dataset(d)
  data = dataset.load(_cfg(d, tok, augment_label_text=True).data)
  assert data.num_labels == 4 and data.num_train_original == 3
  assert len(data.train_tokens) == 7 and data.train_labels.num_rows == 7
  assert [list(data.train_labels.row(i)) for i in range(3, 7)] == [[0], [1], [2], [3]]
  # The augmented rows are the label texts' tokens.
  np.testing.assert_array_equal(data.train_tokens[np.array([3, 6])], data.label_tokens[[0, 3]])
  assert list(data.test_labels.row(1)) == [3]


def test_missing_dataset_lists_expected_layouts(tmp_path):
  with pytest.raises(
    dataset.MissingDataError, match=r"trn_X\.txt.*raw_data/train\.raw\.txt.*trn\.json\.gz"
  ):
    dataset.load(_cfg(tmp_path, "").data)


def test_augmentation_without_label_texts(tmp_path, json_dataset):
  d = tmp_path / "ds"
  tok = json_dataset(d)
  (d / "lbl.json.gz").unlink()
  with pytest.raises(dataset.MissingDataError, match=r"lbl\.json\.gz"):
    dataset.load(_cfg(d, tok, augment_label_text=True).data)
