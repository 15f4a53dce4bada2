"""Growing a trained model with labels it never saw, measured (`reproduce --table=grow` on a
real dataset, `--table=grow_stand_in` on the synthetic stand-in).

For each held-out share h, a share h of the labels (drawn by the spec's seed among the labels
whose text is their own: growing refuses a text the model has) is held out:
the first model sees neither them nor any training pair of theirs (every training row is
kept, renumbered labels only). Then:

  before     that model, trained by the spec's config on the other labels;
  zero_shot  it grown with the held-out labels' texts (serving/grow.py);
  text_alone its encoder ranking every label by cos(E(x), E(z_l));
  few_shot   the grown model trained on for `few_shot_epochs` epochs with every training
             pair, the held-out labels' included (`train.init_from`: rows matched by text;
             no warm start; hard negatives mined from the grown W before the first epoch),
             in the setting (what trains, the learning rates) chosen among the spec's on a
             validation split of the training rows (few_shot_choice.py);
  retrain    the config trained on all labels: the full retrain growing is to avoid (one
             for every share, shared).

Each is scored on the test split in the original label ids, each row's own item filtered as
the config does: P@1 / P@5 / PSP@5 on all test rows, on the rows with a held-out label, and
P@1 by the other labels alone (the truth restricted to the labels the first model knew).
The training runs are reproduce `Run`s under the protocol's workdir, reused when finished
with the same config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import NamedTuple

import ml_collections
import numpy as np

from astra_jax.data import dataset, synthetic, validation, xc_format
from astra_jax.data.sparse_rows import SparseRows
from astra_jax.evaluation import metrics
from astra_jax.reproduce import few_shot_choice
from astra_jax.reproduce.runs import Run, load_or_run, run_dir
from astra_jax.runtime.errors import InputError
from astra_jax.serving import grow
from astra_jax.serving.predictor import ExactLabels, Predictor
from astra_jax.training import few_shot
from astra_jax.training.few_shot import FewShot
from astra_jax.xc.score_fusion import unit_rows

K = 5
MODELS = ("before", "zero_shot", "few_shot", "retrain", "text_alone")


@dataclasses.dataclass(frozen=True)
class GrowSpec:
  """One protocol: the config (FILE[:VARIANT]) and its overrides for every training run, the
  data (a directory in the XC layout, or "" for the config's synthetic stand-in, generated
  into the protocol's workdir), the held-out shares, the draw's seed, the few-shot epochs
  and the few-shot settings to choose among (one: no choice, no validation runs)."""

  config: str
  data_dir: str = ""
  holdouts: tuple[float, ...] = (0.1,)
  seed: int = 0
  few_shot_epochs: int = 1
  overrides: tuple[tuple[str, object], ...] = ()
  few_shot: tuple[FewShot, ...] = few_shot_choice.CANDIDATES

  def run(self, name: str, data_dir: str, extra: dict | None = None) -> Run:
    """A training run of the config on `data_dir` with the spec's overrides and `extra`."""
    file, _, variant = self.config.partition(":")
    overrides = dict(self.overrides)
    overrides.update({"data.dir": data_dir, "data.synthetic.enabled": False})
    overrides.update(extra or {})
    return Run(name, file, variant, tuple(sorted(overrides.items())))


REAL_CONFIG = "experiments/xc_text.py:ngram"
STAND_IN_LABELS = 1_000_000


def real_spec(data_dir: str) -> GrowSpec:
  """The protocol on a real dataset: the CPU recipe, 10% held out, one few-shot epoch."""
  return GrowSpec(REAL_CONFIG, data_dir)


# The stand-in at 10^6 labels and 10^5 training queries, as benchmarks/scale_run.py trains
# it at that size (3 epochs, the first refresh after epoch 2); 10% held out, and 90%: a model
# of 10^5 labels grown tenfold.
STAND_IN = GrowSpec(
  "experiments/ss20m.py:full_labels,100000",
  holdouts=(0.1, 0.9),
  overrides=(
    ("data.num_labels", STAND_IN_LABELS),
    ("data.synthetic.num_labels", STAND_IN_LABELS),
    ("negatives.tau_r", 3),
    ("negatives.tau_s", 2),
    ("train.epochs", 3),
  ),
)


def held_out_labels(label_texts: list[str], share: float, seed: int) -> np.ndarray:
  """The sorted ids of round(share * L) labels drawn without replacement by `seed` among
  those whose text no other label shares (growing refuses a text the model already has).

  Raises:
    InputError: fewer such labels than the share asks.
  """
  counts: dict[str, int] = {}
  for t in label_texts:
    counts[t.strip()] = counts.get(t.strip(), 0) + 1
  unique = np.array([i for i, t in enumerate(label_texts) if counts[t.strip()] == 1], np.int64)
  n = round(share * len(label_texts))
  if n > len(unique):
    raise InputError(
      f"holding out {n} labels needs as many with a text of their own; "
      f"{len(unique)} of {len(label_texts)} have one"
    )
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(unique, n, replace=False))


def _rows(labels: SparseRows) -> list[list[int]]:
  return [labels.row(i).tolist() for i in range(labels.num_rows)]


def derived_dataset(files: dataset.DatasetFiles, out: str, keep: np.ndarray) -> None:
  """The dataset of `files` with only the labels `keep` (renumbered in that order), every row
  kept, in the same layout; a `tokenizer/` beside the data is copied."""
  if files.layout == "json":
    raise InputError(f"{files.train_texts}: the grow protocol reads the XC text layouts only")
  label_texts = xc_format.read_texts(files.label_texts)
  new_id = np.full(len(label_texts), -1)
  new_id[keep] = np.arange(len(keep))
  text_layout = "uid" if files.layout == "ngame" else "lines"
  source_dir = os.path.dirname(files.train_labels)
  names = dataset.LAYOUTS[files.layout]
  for texts, labels, x_name, y_name in (
    (files.train_texts, files.train_labels, names[0], "trn_X_Y.txt"),
    (files.test_texts, files.test_labels, names[1], "tst_X_Y.txt"),
  ):
    y = xc_format.read_sparse(labels, len(label_texts))
    rows = [[int(new_id[j]) for j in r if new_id[j] >= 0] for r in _rows(y)]
    xc_format.write_sparse(os.path.join(out, y_name), SparseRows.from_lists(rows, len(keep)))
    os.makedirs(os.path.dirname(os.path.join(out, x_name)), exist_ok=True)
    xc_format.write_texts(os.path.join(out, x_name), xc_format.iter_texts(texts), text_layout)
  xc_format.write_texts(os.path.join(out, names[2]), [label_texts[i] for i in keep], text_layout)
  tokenizer = os.path.join(source_dir, "tokenizer")
  if os.path.isdir(tokenizer) and not os.path.isdir(os.path.join(out, "tokenizer")):
    shutil.copytree(tokenizer, os.path.join(out, "tokenizer"))


def scores(pred: np.ndarray, truth: SparseRows, inv_prop: np.ndarray, rows=None) -> dict:
  """P@1 / P@5 / PSP@5 (percent) of `pred` (n, K) against `truth`, on `rows` or all rows."""
  if rows is not None:
    pred = pred[rows]
    truth = SparseRows.from_lists([truth.row(i).tolist() for i in rows], truth.num_cols)
  m = metrics.as_percent(metrics.compute(pred, truth, inv_prop, (1, 5)))
  return {k: round(m[k], 2) for k in ("P@1", "P@5", "PSP@5")}


def text_alone(p: Predictor, test_texts: list[str], label_texts: list[str]) -> np.ndarray:
  """(n, K) labels by cos(E(x), E(z_l)), a label whose text is the row's own left out (label
  texts are unique, so one search of K + 1 suffices)."""
  z = unit_rows(p.encode(p.to_tokens(label_texts)[0]))
  q = unit_rows(p.encode(p.to_tokens(test_texts)[0]))
  _, ids = ExactLabels(z).search(q, K + 1)
  own = {t.strip(): j for j, t in enumerate(label_texts)}
  out = np.empty((len(q), K), np.int64)
  for r, text in enumerate(test_texts):
    row = [j for j in ids[r] if j != own.get(text.strip(), -1)]
    out[r] = row[:K]
  return out


def _training_seconds(result: dict) -> float:
  stages = result.get("stage_seconds", {})
  return round(stages.get("warm_start", 0.0) + stages.get("training", 0.0), 1)


def _data_dir(spec: GrowSpec, workdir: str) -> tuple[str, dict]:
  """The dataset's directory (the stand-in generated into WORKDIR/data when the spec names
  none) and the overrides it needs."""
  if spec.data_dir:
    return spec.data_dir, {}
  c = spec.run("data", "").config()
  out = os.path.join(workdir, "data")
  synthetic.ensure_generated(out, synthetic.spec_from_config(c.data.synthetic), workers=0)
  return out, {"data.tokenizer_dir": os.path.join(out, "tokenizer")}


class _TestSet(NamedTuple):
  """What every held-out share is scored on, read once."""

  data_dir: str
  data_overrides: dict
  files: dataset.DatasetFiles
  label_texts: list[str]
  test: SparseRows
  test_texts: list[str]
  train_texts: list[str]
  train_labels: SparseRows
  optim: ml_collections.ConfigDict  # the config's optimizer, which the settings scale
  # The split the few-shot candidates hold out: the config's data.validation_* at
  # few_shot_choice.VALIDATION_FRACTION.
  validation_split: validation.SplitSpec
  inv_prop: np.ndarray
  retrain_pred: np.ndarray  # (n, K) the full retrain's predictions, original ids


def measure(spec: GrowSpec, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Runs the protocol of the module docstring (training runs reused when finished) and
  writes its record to WORKDIR/results.json.

  Args:
    spec: what to measure.
    workdir: where its data, runs and grown models go.
    log: progress lines.
  Returns:
    {"spec": the spec, "num_labels", "test_rows", "retrain_s", "protocols": one record per
    held-out share: sizes, seconds of each step and the scores of every model}.
  """
  data_dir, data_overrides = _data_dir(spec, workdir)
  cfg = spec.run("config", data_dir, data_overrides).config()
  files = dataset.dataset_files(cfg.data)
  label_texts = xc_format.read_texts(files.label_texts)
  L = len(label_texts)
  train_labels = xc_format.read_sparse(files.train_labels, L)
  test_texts = xc_format.read_texts(files.test_texts)
  retrain = load_or_run(spec.run("retrain", data_dir, data_overrides), workdir, log)
  retrain_p = Predictor.from_workdir(os.path.join(workdir, "retrain"), index="exact")
  data = _TestSet(
    data_dir,
    data_overrides,
    files,
    label_texts,
    xc_format.read_sparse(files.test_labels, L),
    test_texts,
    xc_format.read_texts(files.train_texts),
    train_labels,
    cfg.optim,
    dataclasses.replace(
      validation.SplitSpec.from_config(cfg.data), fraction=few_shot_choice.VALIDATION_FRACTION
    ),
    metrics.inverse_propensity(train_labels, cfg.data.propensity_A, cfg.data.propensity_B),
    retrain_p.predict(test_texts, k=K).ids,
  )
  out = {
    "spec": dataclasses.asdict(spec),
    "num_labels": L,
    "test_rows": data.test.num_rows,
    "retrain_s": _training_seconds(retrain),
    "protocols": [],
  }
  for share in spec.holdouts:
    log(f"grow protocol: holding out {share:g} of {L:,} labels")
    out["protocols"].append(_one_share(spec, workdir, share, data, log))
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(out, f, indent=1)
  return out


def _start_share(root: str, held: np.ndarray, log: Callable[[str], None]) -> None:
  """Keeps ROOT (a share's derived data and runs) only if it was made for these held-out
  labels (ROOT/held_out.json); else starts it afresh: its runs' configs would not show that
  they trained on another draw."""
  path = os.path.join(root, "held_out.json")
  if os.path.exists(path):
    with open(path) as f:
      if json.load(f) == held.tolist():
        return
    log(f"grow protocol: {root} was made for other held-out labels; starting it afresh")
    shutil.rmtree(root)
  os.makedirs(root, exist_ok=True)
  with open(path, "w") as f:
    json.dump(held.tolist(), f)


def _one_share(
  spec: GrowSpec, workdir: str, share: float, data: _TestSet, log: Callable[[str], None]
) -> dict:
  """The protocol for one held-out share (`measure`'s record of it)."""
  label_texts, test = data.label_texts, data.test
  L = len(label_texts)
  held = held_out_labels(label_texts, share, spec.seed)
  keep = np.setdiff1d(np.arange(L), held)
  root = os.path.join(workdir, f"holdout_{share:g}")
  _start_share(root, held, log)
  derived = os.path.join(root, "data_without")
  if not os.path.exists(os.path.join(derived, "tst_X_Y.txt")):
    derived_dataset(data.files, derived, keep)
  before = load_or_run(spec.run("before", derived, data.data_overrides), root, log)
  grown_wd = os.path.join(root, "grown")
  log(f"grow protocol: growing by {len(held):,} labels into {grown_wd}")
  t0 = time.time()
  report = grow.grow_model(os.path.join(root, "before"), [label_texts[i] for i in held], grown_wd)
  grow_s = time.time() - t0
  is_held = np.zeros(L, bool)
  is_held[held] = True
  few_shot_extra = {**data.data_overrides, **few_shot.run_overrides(grown_wd, spec.few_shot_epochs)}
  chosen, validation_p5 = spec.few_shot[0], {}
  if len(spec.few_shot) > 1:
    fraction = data.validation_split.fraction

    def train_candidate(c: FewShot) -> str:
      extra = {**few_shot_extra, **c.overrides(data.optim), "data.validation_fraction": fraction}
      run = dataclasses.replace(spec.run(c.name, data.data_dir, extra), group="few_shot_choice")
      load_or_run(run, root, log)
      return run_dir(root, run)

    rows = few_shot_choice.validation_rows(
      data.train_texts, data.train_labels, is_held, data.validation_split
    )
    chosen, validation_p5 = few_shot_choice.choose(spec.few_shot, train_candidate, rows, log)
    log(f"grow protocol: few-shot setting {chosen.name}, chosen on validation")
  few_extra = {**few_shot_extra, **chosen.overrides(data.optim)}
  few = load_or_run(spec.run("few_shot", data.data_dir, few_extra), root, log)
  with_held = [i for i in range(test.num_rows) if is_held[test.row(i)].any()]
  others = SparseRows.from_lists([[j for j in r if not is_held[j]] for r in _rows(test)], L)
  grown_ids = np.concatenate([keep, held])
  preds = {"retrain": data.retrain_pred}
  for name, wd, to_original in (
    ("before", os.path.join(root, "before"), keep),
    ("zero_shot", grown_wd, grown_ids),
    ("few_shot", os.path.join(root, "few_shot"), np.arange(L)),
  ):
    log(f"grow protocol: scoring {name}")
    p = Predictor.from_workdir(wd, index="exact")
    ids = p.predict(data.test_texts, k=K).ids
    preds[name] = np.where(ids >= 0, to_original[np.maximum(ids, 0)], -1)
    if name == "zero_shot":
      grown_texts = [label_texts[i] for i in grown_ids]
      preds["text_alone"] = grown_ids[text_alone(p, data.test_texts, grown_texts)]
  record = {
    "holdout": share,
    "held_out_labels": len(held),
    "test_rows_with_held_out_label": len(with_held),
    "seconds": {
      "before": _training_seconds(before),
      "grow": round(grow_s, 2),
      "few_shot": _training_seconds(few),
    },
    "few_shot_setting": chosen.name,
    "few_shot_validation_P@5": validation_p5,
    "few_shot_trained": few.get("trained"),
    "map_fit_labels": report.fit_labels,
    "map_fit_r2": round(report.fit_r2, 4),
  }
  for name in MODELS:
    record[name] = {
      "all_rows": scores(preds[name], test, data.inv_prop),
      "rows_with_held_out_label": scores(preds[name], test, data.inv_prop, with_held),
      "other_labels_P@1": scores(preds[name], others, data.inv_prop)["P@1"],
    }
  return record


# --- the table -------------------------------------------------------------------------------

_LABELS = {
  "before": "before growing (trained without the held-out labels)",
  "zero_shot": "(a) grown by text (zero-shot)",
  "few_shot": "(b) grown, then the few-shot update",
  "retrain": "(c) full retrain on all labels",
  "text_alone": "(d) (a)'s encoder, text similarity alone",
}


def tab_grow(results: dict[str, dict]) -> list[list[str]]:
  """One block of rows per held-out share: each model's scores and training seconds."""
  (result,) = results.values()
  rows = [
    [
      "held out",
      "model",
      "all rows P@1 / P@5 / PSP@5",
      "rows with a held-out label P@1 / P@5 / PSP@5",
      "P@1 by the other labels",
      "seconds",
    ]
  ]
  fmt = lambda s: f"{s['P@1']:.2f} / {s['P@5']:.2f} / {s['PSP@5']:.2f}"
  for p in result["protocols"]:
    sizes = f"{p['held_out_labels']:,} labels, {p['test_rows_with_held_out_label']:,} rows"
    held = f"{p['holdout']:g} ({sizes})"
    seconds = {
      "before": p["seconds"]["before"],
      "zero_shot": p["seconds"]["grow"],
      "few_shot": p["seconds"]["few_shot"],
      "retrain": result["retrain_s"],
      "text_alone": "",
    }
    for name in MODELS:
      m = p[name]
      label = _LABELS[name]
      if name == "few_shot" and "few_shot_setting" in p:
        label += f" ({p['few_shot_setting']})"
      rows.append(
        [
          held,
          label,
          fmt(m["all_rows"]),
          fmt(m["rows_with_held_out_label"]),
          f"{m['other_labels_P@1']:.2f}",
          str(seconds[name]),
        ]
      )
  return rows


def _setting_line(p: dict) -> str:
  """How (b)'s setting was chosen, from the share's record ("" for a record without one)."""
  p5 = p.get("few_shot_validation_P@5") or {}
  if not p5:
    return ""
  scores = ", ".join(f"{name} {value:.2f}" for name, value in p5.items())
  return f" (b)'s setting: {p['few_shot_setting']}, by validation P@5 ({scores})."


def grow_summary(results: dict[str, dict]) -> str:
  """The targets of growing, per held-out share: (b)'s P@5 on the new labels' rows against
  (c)'s and its time against (c)'s, the other labels' P@1 against the model before growing,
  and (a) against (d) on the new labels' rows."""
  (result,) = results.values()
  lines = []
  for p in result["protocols"]:
    rows = {name: p[name]["rows_with_held_out_label"] for name in MODELS}
    few, full = rows["few_shot"]["P@5"], rows["retrain"]["P@5"]
    few_s, full_s = p["seconds"]["few_shot"], result["retrain_s"]
    before, after = p["before"]["other_labels_P@1"], p["few_shot"]["other_labels_P@1"]
    lines.append(
      f"- held out {p['holdout']:g} ({p['held_out_labels']:,} labels): on the rows with a "
      f"held-out label (b)'s P@5 is {100 * few / max(full, 1e-9):.1f}% of (c)'s ({few:.2f} / "
      f"{full:.2f}), in {100 * few_s / max(full_s, 1e-9):.1f}% of its training seconds "
      f"({few_s} / {full_s} s); the other labels' P@1 is {after:.2f} after (b) against "
      f"{before:.2f} before growing ({after - before:+.2f}); (a) minus (d) on those rows: "
      f"{rows['zero_shot']['P@1'] - rows['text_alone']['P@1']:+.2f} P@1, "
      f"{rows['zero_shot']['P@5'] - rows['text_alone']['P@5']:+.2f} P@5; growing took "
      f"{p['seconds']['grow']} s." + _setting_line(p)
    )
  return "\n" + "\n".join(lines) + "\n"
