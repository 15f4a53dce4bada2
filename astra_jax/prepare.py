"""A downloaded dataset -> a ready data directory (texts, labels, tokenized cache).

  python -m astra_jax.prepare --src=DOWNLOAD --out=DIR [--tokenizer=NAME_OR_DIR]
      [--max_len=32] [--use_content] [--config=experiments/<name>.py]
  python -m astra_jax.prepare --config=experiments/<name>.py:synthetic   # a stand-in

With a config whose data are synthetic (`data.synthetic.enabled`) and no --src, the
stand-in is generated into the config's data.dir (unless the data there are already that
spec's) and tokenized there with the generator's tokenizer, as training would do at its start.

DOWNLOAD is the Extreme Classification Repository's download: a .zip, or a directory (or
a directory holding one dataset directory) in any layout `data/dataset.py` reads
({trn,tst,lbl}.json.gz; trn_X.txt/tst_X.txt/Y.txt or raw_data/*.raw.txt with
trn_X_Y.txt/tst_X_Y.txt). Its files are extracted (zip) or linked into DIR (a Mac zip's
`__MACOSX/` and `._*` entries are skipped), every label file is parsed into a binary CSR
cache and every text file tokenized, into DIR/astra_cache, the caches training
memory-maps; the summary names each cache's rows, positives, bytes and build seconds,
after checking the label caches. With --config, the tokenizer, max_len,
use_content and DIR default to the config's (e.g. data/LF-AmazonTitles-131K), so training
needs no further flag.

Resumable: files already extracted with the right size are kept, and token files whose
metadata matches (source size and time, tokenizer, max_len) are not rebuilt, nor are label
caches of unchanged files; a killed tokenization goes on from its last checkpoint (every
2^20 rows); nothing else is left half-written (temporary names, renamed when whole).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zipfile

from absl import flags, logging
from ml_collections import config_flags

from astra_jax.config import base as config_base
from astra_jax.data import dataset, label_cache, synthetic
from astra_jax.model import pretrained
from astra_jax.runtime import cli, tmpnames
from astra_jax.runtime.errors import InputError

# Files a data directory can use, by name (see data/dataset.py LAYOUTS).
DATA_FILES = {name for layout in dataset.LAYOUTS.values() for name in layout} | {
  "trn_X_Y.txt",
  "tst_X_Y.txt",
  dataset.FILTER_FILE,
  dataset.RENEE_FILTER_FILE,
  "filter_labels_train.txt",
  "trn_filter_labels.txt",
}


def _dataset_root(names: list[str]) -> str:
  """The directory prefix (within a zip or a tree) that holds the training texts."""
  roots = sorted(
    {
      n[: -len(trn)]
      for n in names
      for trn in (layout[0] for layout in dataset.LAYOUTS.values())
      if n.endswith(trn)
    }
  )
  if not roots:
    raise InputError(
      "no dataset in the download: expected one of "
      + ", ".join(layout[0] for layout in dataset.LAYOUTS.values())
    )
  if len(roots) > 1:
    raise InputError(
      f"several datasets in the download ({', '.join(r or '.' for r in roots)}); point --src at one"
    )
  return roots[0]


def _mac_metadata(name: str) -> bool:
  """A zip made on a Mac also holds __MACOSX/... and ._NAME resource forks."""
  parts = name.split("/")
  return "__MACOSX" in parts or parts[-1].startswith("._")


def _wanted(rel: str) -> bool:
  return rel in DATA_FILES


def extract_zip(src: str, out: str) -> list[str]:
  """Extracts the dataset's files (flattened below its root); skips those already there."""
  done = []
  with zipfile.ZipFile(src) as z:
    infos = [i for i in z.infolist() if not i.is_dir() and not _mac_metadata(i.filename)]
    root = _dataset_root([i.filename for i in infos])
    for info in infos:
      rel = info.filename[len(root) :]
      if not info.filename.startswith(root) or not _wanted(rel):
        continue
      dest = os.path.join(out, rel)
      if os.path.exists(dest) and os.path.getsize(dest) == info.file_size:
        logging.info("prepare: %s already extracted", rel)
      else:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp-{tmpnames.unique_suffix()}"
        t0 = time.time()
        with z.open(info) as fin, open(tmp, "wb") as fout:
          shutil.copyfileobj(fin, fout, 1 << 20)
        os.replace(tmp, dest)
        logging.info(
          "prepare: extracted %s (%.0f MB, %.1fs)", rel, info.file_size / 1e6, time.time() - t0
        )
      done.append(rel)
  return done


def link_tree(src: str, out: str) -> list[str]:
  """Symlinks the dataset's files from a directory (absolute links; nothing copied)."""
  names = []
  for dirpath, dirs, files in os.walk(src):
    # --out inside --src: not its own links again on a second run
    dirs[:] = [
      x for x in dirs if os.path.realpath(os.path.join(dirpath, x)) != os.path.realpath(out)
    ]
    names += [
      n
      for n in (os.path.relpath(os.path.join(dirpath, f), src).replace(os.sep, "/") for f in files)
      if not _mac_metadata(n)
    ]
  root = _dataset_root(names)
  done = []
  for name in names:
    rel = name[len(root) :]
    if not name.startswith(root) or not _wanted(rel):
      continue
    dest, target = os.path.join(out, rel), os.path.abspath(os.path.join(src, name))
    if os.path.abspath(dest) != target:
      if os.path.lexists(dest) and os.path.realpath(dest) != os.path.realpath(target):
        raise InputError(f"{dest} exists and is not {target}; remove it or choose another --out")
      if not os.path.lexists(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.symlink(target, dest)
    done.append(rel)
  return done


def prepare(src: str, out: str, data_cfg) -> dataset.XCData:
  """Materialises the download in `out` and tokenizes it into out/astra_cache."""
  os.makedirs(out, exist_ok=True)
  if os.path.isfile(src) and zipfile.is_zipfile(src):
    files = extract_zip(src, out)
  elif os.path.isdir(src):
    files = link_tree(src, out)
  else:
    raise InputError(f"--src={src!r} is neither a zip file nor a directory")
  logging.info("prepare: %s holds %s", out, ", ".join(sorted(files)))
  with data_cfg.unlocked():
    data_cfg.dir = out
    data_cfg.tokenizer_dir = pretrained.resolve(data_cfg.tokenizer_dir)
  return dataset.load(data_cfg)  # tokenizes what is missing or stale; checks row counts


def prepare_synthetic(out: str, data_cfg) -> dataset.XCData:
  """Generates the config's synthetic stand-in into `out` (when not there already) and
  tokenizes it into out/astra_cache; the tokenizer is the generator's unless the config
  names one."""
  synthetic.ensure_generated(out, synthetic.spec_from_config(data_cfg.synthetic), workers=0)
  with data_cfg.unlocked():
    data_cfg.dir = out
    data_cfg.tokenizer_dir = pretrained.resolve(
      data_cfg.tokenizer_dir or os.path.join(out, "tokenizer")
    )
  return dataset.load(data_cfg)


def summary(data: dataset.XCData, cache_dir: str) -> str:
  """What was built: the dataset's sizes, then each cache's rows, size and build time (the
  label caches verified on the way)."""
  lines = [
    f"{data.data_dir}: L = {data.num_labels:,} labels, {data.num_train_original:,} "
    f"training rows, {data.test_labels.num_rows:,} test rows, label texts: "
    f"{'yes' if data.label_tokens is not None else 'no'}, "
    f"{len(data.test_filter):,} filtered test pairs"
  ]
  for name in sorted(os.listdir(cache_dir)):
    if not name.endswith(".meta.json"):
      continue
    stem = name[: -len(".meta.json")]
    if stem.endswith(".labels"):
      meta = label_cache.verify(os.path.join(cache_dir, stem))
      lines.append(
        f"  {stem}: {meta['rows']:,} rows, {meta['nnz']:,} positives over "
        f"{meta['cols']:,} labels, {meta['bytes'] / 1e6:,.1f} MB, parsed in "
        f"{meta['seconds']}s"
      )
      continue
    with open(os.path.join(cache_dir, name)) as f:
      meta = json.load(f)
    size = os.path.getsize(os.path.join(cache_dir, stem + ".tokens.npy"))
    lines.append(
      f"  {stem}: {meta['rows']:,} rows x {meta['max_len']} tokens, "
      f"{meta['truncated_rows']:,} truncated, {size / 1e6:,.1f} MB, built in "
      f"{meta['seconds']}s"
    )
  return "\n".join(lines)


def define_flags() -> None:
  """The command line (defined on demand: importing this module defines no flags, so it
  can share a process with other CLIs, e.g. in tests)."""
  config_flags.DEFINE_config_file(
    "config",
    None,
    "experiment config (optional): its data fields are the defaults",
    lock_config=False,
  )
  flags.DEFINE_string("src", None, "the download: a .zip or a directory")
  flags.DEFINE_string("out", None, "the data directory to build (default: the config's data.dir)")
  flags.DEFINE_string(
    "tokenizer", None, "tokenizer name or directory (default: the config's, else all-MiniLM-L6-v2)"
  )
  flags.DEFINE_integer("max_len", None, "tokens per text (default: the config's, else 32)")
  flags.DEFINE_bool("use_content", None, "json layout: title + content (full-text datasets)")


def main(argv):
  del argv  # cli.run allows none
  F = flags.FLAGS
  logging.get_absl_handler().python_handler.stream = sys.stdout
  c = cli.config_flag()
  c = c if c is not None else config_base.base_config()
  dc = c.data
  with dc.unlocked():
    if F.tokenizer is not None or not (dc.tokenizer_dir or dc.synthetic.enabled):
      dc.tokenizer_dir = F.tokenizer or "all-MiniLM-L6-v2"
    if F.max_len is not None:
      dc.max_len = F.max_len
    if F.use_content is not None:
      dc.use_content = F.use_content
    dc.cache_dir = ""
  out = F.out or dc.dir
  if not out:
    sys.exit("error: --out=DIR is required without a --config that sets data.dir")
  if F.src is None and not dc.synthetic.enabled:
    sys.exit("error: --src=DOWNLOAD is required unless --config's data are synthetic")
  try:
    data = prepare(F.src, out, dc) if F.src is not None else prepare_synthetic(out, dc)
    print(summary(data, os.path.join(out, "astra_cache")))
  except (InputError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")


def cli_main() -> None:
  """The console entry point `astra-prepare` (and `python -m astra_jax.prepare`)."""
  cli.run(main, define_flags, __doc__)


if __name__ == "__main__":
  cli_main()
