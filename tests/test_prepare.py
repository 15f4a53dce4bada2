"""prepare: a zipped or unpacked download -> a data directory training reads, resumably."""

import os
import subprocess
import sys
import zipfile

from astra_jax import prepare
from astra_jax.config import base as config_base
from astra_jax.data import dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data_cfg(tok):
  c = config_base.base_config()
  c.data.tokenizer_dir, c.data.max_len = tok, 6
  return c.data


def test_zip_download_to_a_data_directory_and_resume(tmp_path, json_dataset):
  tok = json_dataset(tmp_path / "LF-Tiny")
  (tmp_path / "LF-Tiny" / "tst_filter_labels.txt").write_text("0 0\n")
  zpath = tmp_path / "LF-Tiny.raw.zip"
  with zipfile.ZipFile(zpath, "w") as z:  # the download's files below a top directory
    for name in ("trn.json.gz", "tst.json.gz", "lbl.json.gz", "tst_filter_labels.txt"):
      z.write(tmp_path / "LF-Tiny" / name, f"LF-Tiny/{name}")
    z.writestr("__MACOSX/LF-Tiny/._trn.json.gz", b"resource fork")  # zipped on a Mac
  out = tmp_path / "data" / "LF-Tiny"
  data = prepare.prepare(str(zpath), str(out), _data_cfg(tok))
  assert data.num_labels == 4 and data.num_train_original == 3 and len(data.test_filter) == 1
  cache = out / "astra_cache"
  built = {p: os.path.getmtime(cache / p) for p in os.listdir(cache) if p.endswith(".npy")}
  labels = [
    f"{split}.labels.{part}.npy"
    for split in ("trn", "tst")
    for part in ("counts", "indices", "indptr")
  ]
  assert sorted(built) == sorted(
    labels + ["lbl.L6.tokens.npy", "trn.L6.tokens.npy", "tst.L6.tokens.npy"]
  )
  # Again: nothing extracted or tokenized anew.
  before = os.path.getmtime(out / "trn.json.gz")
  prepare.prepare(str(zpath), str(out), _data_cfg(tok))
  assert os.path.getmtime(out / "trn.json.gz") == before
  assert {p: os.path.getmtime(cache / p) for p in built} == built
  # Training reads the directory as it is, Renée's filter file name included.
  assert not os.path.exists(out / "filter_labels_test.txt")
  c = _data_cfg(tok)
  c.dir = str(out)
  data = dataset.load(c)
  assert data.num_labels == 4 and data.test_filter.tolist() == [[0, 0]]


def test_out_inside_src_prepares_twice(tmp_path, json_dataset):
  tok = json_dataset(tmp_path / "dl")
  out = tmp_path / "dl" / "prepared"
  for _ in range(2):  # the second run must not take its own links for a second dataset
    assert prepare.prepare(str(tmp_path / "dl"), str(out), _data_cfg(tok)).num_labels == 4


def test_directory_download_is_linked_and_cli_summarises(tmp_path, json_dataset):
  tok = json_dataset(tmp_path / "dl")
  out = tmp_path / "out"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.prepare",
      f"--src={tmp_path / 'dl'}",
      f"--out={out}",
      f"--tokenizer={tok}",
      "--max_len=6",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert os.path.islink(out / "trn.json.gz")
  assert "L = 4 labels, 3 training rows, 2 test rows, label texts: yes" in r.stdout
  assert "trn.L6: 3 rows x 6 tokens" in r.stdout
  assert "trn.labels: 3 rows, 4 positives over 4 labels" in r.stdout


def test_synthetic_config_without_src_generates_then_tokenizes(tmp_path, load_config):
  from astra_jax.data import synthetic

  out = tmp_path / "synth"
  sizes = [
    "--config.data.synthetic.num_labels=50",
    "--config.data.synthetic.num_train=40",
    "--config.data.synthetic.num_test=10",
  ]
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.prepare",
      "--config=experiments/demo.py",
      f"--config.data.dir={out}",
      *sizes,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  spec = synthetic.SyntheticSpec(
    **{
      **synthetic.spec_from_config(load_config("experiments/demo.py").data.synthetic).__dict__,
      "num_labels": 50,
      "num_train": 40,
      "num_test": 10,
    }
  )
  assert synthetic.is_current(str(out), spec)
  assert "L = 50 labels, 40 training rows, 10 test rows" in r.stdout
  assert os.path.exists(out / "astra_cache")
  # Without --src and without synthetic data: one line that says what is missing.
  r = subprocess.run(
    [sys.executable, "-m", "astra_jax.prepare", f"--out={tmp_path / 'x'}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode != 0
  assert r.stderr.strip().splitlines()[-1] == (
    "error: --src=DOWNLOAD is required unless --config's data are synthetic"
  )
