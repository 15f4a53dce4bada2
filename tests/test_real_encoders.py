"""The encoders' real-data tables: settings chosen on the validation split only, then the
chosen recipe (and its frozen-encoder twin) tested, from hand-written results."""

import json
import os

import pytest

from astra_jax.reproduce import real_encoders, runs, tables


@pytest.fixture(autouse=True)
def _hand_made_results_are_current(monkeypatch):
  """The results here are written by hand, without the config a real run records."""
  monkeypatch.setattr(runs, "stale", lambda run, cached: "")


def _write(root, run, result):
  d = runs.run_dir(root, run)
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(result, f)


def _validation_result(val_p1: float, test_p1: float) -> dict:
  """A run read on the validation split at epochs 5 and 10, and on test at its end."""
  ev = lambda p1, epoch: {
    "split": "validation",
    "epoch": epoch,
    "P@1": p1,
    "P@3": 2.0,
    "P@5": 1.0,
    "W-alone P@1": p1 - 5,
  }
  return {"evaluations": [ev(0.0, 5), ev(val_p1, 10)], "P@1": test_p1, "train_time_s": 30.0}


def test_validation_runs_hold_out_a_split_and_share_only_equal_warm_starts(tmp_path):
  vruns = real_encoders.validation_runs(str(tmp_path / "debian"))
  by_name = {r.name: r for r in vruns}
  assert set(by_name) == set(real_encoders.VALIDATION_RUNS)
  for r in vruns:
    c = r.config()
    assert c.data.validation_fraction == real_encoders.VALIDATION_FRACTION
    if r.warmstart_from:
      # A copied warm start is what the run would have trained: the donor runs first and
      # every field the stage reads is equal.
      donor = by_name[r.warmstart_from].config()
      assert vruns.index(by_name[r.warmstart_from]) < vruns.index(r)
      for section in ("warmstart", "encoder", "data"):
        assert c[section].to_dict() == donor[section].to_dict(), (r.name, section)
      assert c.train.seed == donor.train.seed
  base = by_name["minilm"].config()
  assert base.encoder.hf_dir == "all-MiniLM-L6-v2" and base.warmstart.epochs > 0
  assert by_name["minilm_no_ws"].config().warmstart.epochs == 0
  assert by_name["ngram_momentum_0.9"].config().optim.classifier_momentum == 0.9


def test_choice_reads_validation_only_and_breaks_ties_by_order():
  results = {n: _validation_result(30.0, 90.0) for n in real_encoders.VALIDATION_RUNS}
  # The best test P@1 is never the reason: minilm_no_ws has it but a lower validation P@1.
  results["minilm_no_ws"] = _validation_result(29.0, 99.0)
  results["minilm_cls_lr_0.1"] = _validation_result(31.0, 10.0)
  results["minilm_dropout_0.2"] = _validation_result(31.0, 10.0)  # a tie, listed later
  results["ngram"] = _validation_result(50.0, 50.0)  # not a MiniLM variant
  assert real_encoders.choose(results) == "minilm_cls_lr_0.1"
  del results["minilm"]["evaluations"]
  assert real_encoders.validation_p(results["minilm"]) is None


def test_test_runs_carry_the_chosen_settings_and_freeze_the_encoder(tmp_path):
  truns = {r.name: r for r in real_encoders.test_runs(str(tmp_path / "d"), "minilm_cls_lr_0.1")}
  assert list(truns) == ["ngram", "minilm", "minilm_frozen"]
  chosen, frozen = truns["minilm"].config(), truns["minilm_frozen"].config()
  assert chosen.optim.classifier_lr == 0.1 and chosen.data.validation_fraction == 0
  assert frozen.optim.classifier_lr == 0.1 and frozen.optim.encoder_lr == 0
  assert frozen.warmstart.epochs == 0 and chosen.warmstart.epochs > 0
  assert truns["ngram"].config().eval.tfidf_baseline
  assert truns["ngram"].config().eval.peers == "xrlinear,parabel,bonsai,plt"


def test_encoders_real_chooses_on_validation_then_tabulates_the_test_runs(tmp_path):
  data, root, out = str(tmp_path / "debian"), str(tmp_path / "wd"), str(tmp_path / "out")
  for r in real_encoders.validation_runs(data):
    _write(
      root, r.at(root), _validation_result(35.0 if r.name == "minilm_ws_lr_3e-4" else 30.0, 1.0)
    )
  ngram = {
    "P@1": 52.0,
    "P@3": 30.0,
    "P@5": 22.0,
    "PSP@5": 40.0,
    "total_time_s": 60.0,
    "stage_seconds": {"warm_start": 10.0, "training": 40.0},
    "device_kind": "cpu",
    "encoder": {"architecture": "ngram_bag", "name": "", "parameters": 2_000_000},
    "popularity_baseline": {"P@1": 6.6, "P@3": 5.5, "P@5": 4.3},
    "tfidf_knn_baseline": {"P@1": 34.8, "P@3": 20.3, "P@5": 14.1},
    "tfidf_label_text_baseline": {"P@1": 37.7, "P@3": 21.1, "P@5": 14.2},
    "peer_baselines": {
      "Bonsai (omikuji 0.5.2)": {
        "P@1": 37.7,
        "P@3": 21.0,
        "P@5": 14.5,
        "PSP@5": 30.0,
        "train_seconds": 100.0,
        "predict_seconds": 20.0,
      }
    },
  }
  minilm = {**ngram, "P@1": 55.0, "encoder": {"name": "all-MiniLM-L6-v2", "parameters": 22_700_000}}
  for r in real_encoders.test_runs(data, "minilm_ws_lr_3e-4"):
    _write(root, r.at(root), {"ngram": ngram, "minilm": minilm, "minilm_frozen": ngram}[r.name])
  logs = []
  md = tables.reproduce("encoders_real", root, out, 0.01, 1, log=logs.append, data_dir=data)
  assert "encoders_real_validation chose minilm_ws_lr_3e-4" in logs
  assert (
    "| minilm_ws_lr_3e-4 | `:minilm` warmstart.lr=0.0003 | 35.00 | 2.00 | 1.00 | 30.00 | 30 | yes |"
    in md
  )
  assert (
    "| MiniLM recipe (chosen on validation) | all-MiniLM-L6-v2, 22.7M parameters | 55.00 | 30.00 "
    "| 22.00 | 40.00 | 10 | 40 | 60 | cpu |" in md
  )
  assert "| TF-IDF query <-> label text (char 2-4) |  | 37.70 | 21.10 | 14.20 |  |" in md
  assert (
    "| Bonsai (omikuji 0.5.2) | TF-IDF words 1-2 + chars 2-4 | 37.70 | 21.00 | 14.50 | 30.00 "
    "|  |  | 120 (train + predict) |  |" in md
  )
  assert os.path.exists(os.path.join(out, "encoders_real_validation.md"))
  assert os.path.exists(os.path.join(out, "encoders_real.csv"))
