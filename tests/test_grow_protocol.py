"""The growing protocol behind `reproduce --table=grow|grow_stand_in`
(astra_jax/reproduce/grow_protocol.py): the derived dataset, the held-out draw, the table's
reading of its targets, and the whole protocol on a tiny stand-in."""

import json
import os

import ml_collections
import numpy as np
import pytest

from astra_jax.data import dataset, validation, xc_format
from astra_jax.data.dataset import XCData
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.reproduce import few_shot_choice, grow_protocol as gp
from astra_jax.reproduce.tables import to_markdown
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export
from astra_jax.training.few_shot import FewShot

LABELS = ["red car", "blue car", "green boat", "red boat"]
TRAIN = (["a red car", "blue or green", "red boat ride"], [[0], [1, 2], [3, 0]])
TEST = (["green boats", "cars"], [[2], [0, 1]])


def _write(d, layout: str) -> dataset.DatasetFiles:
  """The hand-made dataset above in `layout` (renee: lines; ngame: raw_data/, uid->text)."""
  names = dataset.LAYOUTS[layout]
  text_layout = "uid" if layout == "ngame" else "lines"
  os.makedirs(d / "raw_data", exist_ok=True)
  for name, texts in zip(names, (TRAIN[0], TEST[0], LABELS)):
    xc_format.write_texts(d / name, texts, text_layout)
  xc_format.write_sparse(d / "trn_X_Y.txt", SparseRows.from_lists(TRAIN[1], 4))
  xc_format.write_sparse(d / "tst_X_Y.txt", SparseRows.from_lists(TEST[1], 4))
  return dataset.dataset_files(ml_collections.ConfigDict({"dir": str(d), "layout": "auto"}))


@pytest.mark.parametrize("layout", ["renee", "ngame"])
def test_derived_dataset_keeps_every_row_and_renumbers_the_kept_labels(tmp_path, layout):
  files = _write(tmp_path / "src", layout)
  (tmp_path / "src" / "tokenizer").mkdir()
  (tmp_path / "src" / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
  gp.derived_dataset(files, str(tmp_path / "out"), np.array([3, 0, 1]))  # label 2 held out
  out = dataset.dataset_files(
    ml_collections.ConfigDict({"dir": str(tmp_path / "out"), "layout": "auto"})
  )
  assert out.layout == layout
  # New ids by position in keep: 3 -> 0, 0 -> 1, 1 -> 2; label 2 is gone from every row.
  assert xc_format.read_texts(out.label_texts) == ["red boat", "red car", "blue car"]
  trn = xc_format.read_sparse(out.train_labels, 3)
  assert [sorted(trn.row(i).tolist()) for i in range(3)] == [[1], [2], [0, 1]]
  tst = xc_format.read_sparse(out.test_labels, 3)
  assert [sorted(tst.row(i).tolist()) for i in range(2)] == [[], [1, 2]]
  assert xc_format.read_texts(out.train_texts) == TRAIN[0]
  assert xc_format.read_texts(out.test_texts) == TEST[0]
  assert (tmp_path / "out" / "tokenizer" / "vocab.txt").read_text() == "[PAD]\n"


def test_held_out_labels_is_a_seeded_share_of_the_labels_with_their_own_text():
  texts = [f"label {i}" for i in range(1000)]
  texts[10] = texts[20] = texts[30] = "a shared text"  # none of these three may be drawn
  held = gp.held_out_labels(texts, 0.5, seed=0)
  assert len(held) == 500 and len(set(held.tolist())) == 500
  assert np.all(np.diff(held) > 0) and held.min() >= 0 and held.max() < 1000
  assert not {10, 20, 30} & set(held.tolist())
  np.testing.assert_array_equal(held, gp.held_out_labels(texts, 0.5, seed=0))
  assert not np.array_equal(held, gp.held_out_labels(texts, 0.5, seed=1))
  with pytest.raises(InputError, match="995 of 1000 have one"):
    gp.held_out_labels(texts[:998] + ["x", "x"], 0.999, seed=0)  # 3 + 2 shared


def _scores(p1, p5, psp5):
  return {"P@1": p1, "P@5": p5, "PSP@5": psp5}


def test_the_summary_reads_the_targets_from_the_record():
  def model(held_p1, held_p5, other_p1):
    return {
      "all_rows": _scores(50.0, 20.0, 40.0),
      "rows_with_held_out_label": _scores(held_p1, held_p5, 30.0),
      "other_labels_P@1": other_p1,
    }

  record = {
    "retrain_s": 400.0,
    "protocols": [
      {
        "holdout": 0.1,
        "held_out_labels": 200,
        "test_rows_with_held_out_label": 50,
        "seconds": {"before": 380.0, "grow": 4.5, "few_shot": 36.0},
        "before": model(30.0, 18.0, 49.0),
        "zero_shot": model(41.0, 24.5, 48.4),
        "few_shot": model(47.0, 27.0, 48.7),
        "retrain": model(50.0, 30.0, 47.6),
        "text_alone": model(38.5, 19.0, 41.2),
      }
    ],
  }
  text = gp.grow_summary({"grow": record})
  # 27 / 30 = 90.0%; 36 / 400 = 9.0%; 48.7 - 49.0 = -0.30; 41.0 - 38.5, 24.5 - 19.0.
  assert "(b)'s P@5 is 90.0% of (c)'s (27.00 / 30.00), in 9.0% of its training" in text
  assert "P@1 is 48.70 after (b) against 49.00 before growing (-0.30)" in text
  assert "+2.50 P@1, +5.50 P@5; growing took 4.5 s." in text
  rows = gp.tab_grow({"grow": record})
  assert len(rows) == 1 + len(gp.MODELS)
  assert rows[3][2:] == ["50.00 / 20.00 / 40.00", "47.00 / 27.00 / 30.00", "48.70", "36.0"]
  assert rows[4][-1] == "400.0"  # the retrain's seconds on every share's row
  assert "| 0.1 (200 labels, 50 rows) |" in to_markdown(rows)


@pytest.mark.slow
def test_the_protocol_on_a_tiny_stand_in_grows_and_reuses_its_runs(tmp_path):
  spec = gp.GrowSpec(
    "experiments/demo.py",
    holdouts=(0.2,),
    overrides=(
      ("data.synthetic.num_labels", 100),
      ("data.synthetic.num_train", 800),
      ("data.synthetic.num_test", 50),
      ("negatives.k_r", 32),
      ("optim.warmup_steps", 5),
      ("train.batch_size", 64),
      ("train.epochs", 1),
      ("train.eval_every_epochs", 0),
      ("train.profile_steps", 0),
    ),
    few_shot=(
      FewShot("new_rows", freeze_encoder=True, freeze_old_rows=True),
      FewShot("all", freeze_encoder=False, freeze_old_rows=False),
    ),
  )
  wd = str(tmp_path / "grow")
  record = gp.measure(spec, wd, log=lambda _: None)
  (share,) = record["protocols"]
  assert record["num_labels"] == 100 and share["held_out_labels"] == 20
  texts = xc_format.read_texts(os.path.join(wd, "data", "Y.txt"))
  held = gp.held_out_labels(texts, 0.2, spec.seed)
  keep = np.setdiff1d(np.arange(100), held)
  # The first model knows only the kept labels; the grown one appends the held-out ones.
  root = os.path.join(wd, "holdout_0.2")
  before = export.load_model(os.path.join(root, "before"))
  assert before.label_texts == [texts[i] for i in keep]
  grown = export.load_model(os.path.join(root, "grown"))
  assert grown.label_texts == [texts[i] for i in keep] + [texts[i] for i in held]
  np.testing.assert_array_equal(grown.classifier[:80], before.classifier)
  # The few-shot run trained on the original data, starting from the grown model, in the
  # setting with the higher validation P@5; each candidate left the validation rows out.
  with open(os.path.join(root, "few_shot", "results.json")) as f:
    few = json.load(f)
  assert few["config"]["train"]["init_from"] == os.path.join(root, "grown")
  p5 = share["few_shot_validation_P@5"]
  assert set(p5) == {"new_rows", "all"}
  chosen = "all" if p5["all"] > p5["new_rows"] else "new_rows"
  assert share["few_shot_setting"] == chosen
  for name in p5:
    with open(os.path.join(root, "few_shot_choice", name, "results.json")) as f:
      assert json.load(f)["num_train"] == 800 - 80  # validation_fraction 0.1
  if chosen == "new_rows":
    # Only the 20 new rows trained: the old ones are the grown model's, bit for bit.
    assert few["trained"] == {"encoder": False, "classifier_rows": 20}
    w = export.load_model(os.path.join(root, "few_shot")).classifier
    np.testing.assert_array_equal(w[keep], grown.classifier[:80])
  else:
    assert few["trained"] == {"encoder": True, "classifier_rows": 100}
  for name in gp.MODELS:
    for part in ("all_rows", "rows_with_held_out_label"):
      assert all(0.0 <= v <= 100.0 for v in share[name][part].values())
  # A second call trains nothing again: the same runs' results, the same record.
  mtimes = {
    n: os.path.getmtime(os.path.join(root, n, "results.json")) for n in ("before", "few_shot")
  }
  again = gp.measure(spec, wd, log=lambda _: None)
  assert again["protocols"][0]["before"] == share["before"]
  assert again["protocols"][0]["few_shot"] == share["few_shot"]
  assert mtimes == {
    n: os.path.getmtime(os.path.join(root, n, "results.json")) for n in ("before", "few_shot")
  }


def test_validation_rows_are_the_split_the_runs_hold_out_with_a_held_out_label():
  n = 40
  texts = [f"query {i}" for i in range(n)]
  labels = SparseRows.from_lists([[i % 4] for i in range(n)], 4)
  is_held = np.array([False, True, False, False])  # label 1: rows 1, 5, 9, ...
  # The rows a training run with data.validation_fraction=0.5, data.validation_seed=3
  # evaluates on: validation.carve's, each query's token its row number.
  tokens = np.arange(n, dtype=np.int32)[:, None]
  data = XCData("d", 4, tokens, labels, tokens[:1], labels.head(1), None, np.zeros((0, 2)), 0, 9, n)
  carved = validation.carve(data, validation.SplitSpec(0.5, seed=3)).validation
  held_rows = [int(t[0]) for t in carved.test_tokens[:] if t[0] % 4 == 1]
  assert held_rows  # the draw has some rows of label 1
  rows = few_shot_choice.validation_rows(texts, labels, is_held, validation.SplitSpec(0.5, seed=3))
  assert rows.texts == [f"query {r}" for r in held_rows]
  assert [rows.truth.row(i).tolist() for i in range(len(held_rows))] == [[1]] * len(held_rows)


def test_a_setting_that_freezes_old_rows_turns_off_the_decay():
  optim = ml_collections.ConfigDict({"encoder_lr": 1e-3, "classifier_lr": 0.3})
  new_rows = FewShot("n", freeze_encoder=True, freeze_old_rows=True, lr_scale=3.0)
  assert new_rows.overrides(optim) == {
    "train.freeze_encoder": True,
    "train.freeze_old_rows": True,
    "optim.encoder_lr": 3e-3,
    "optim.classifier_lr": 0.3 * 3.0,
    "optim.classifier_weight_decay": 0.0,
  }
  assert "optim.classifier_weight_decay" not in FewShot("a", False, False).overrides(optim)


def test_a_share_made_for_another_draw_starts_afresh(tmp_path):
  root = tmp_path / "holdout_0.1"
  gp._start_share(str(root), np.array([1, 2]), log=lambda _: None)
  (root / "before").mkdir()
  gp._start_share(str(root), np.array([1, 2]), log=lambda _: None)
  assert (root / "before").is_dir()  # the same draw: its runs are kept
  gp._start_share(str(root), np.array([1, 3]), log=lambda _: None)
  assert not (root / "before").exists()
  assert json.loads((root / "held_out.json").read_text()) == [1, 3]
