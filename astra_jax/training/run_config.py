"""A workdir's recorded config (config.json) and what a rerun may change: keys that leave the
computation as it was (FREE_KEYS), keys added or renamed since runs were recorded, and the
refusal of a rerun whose config changes the computation."""

from __future__ import annotations

import json
import os

import ml_collections
from absl import logging

from astra_jax.data import xc_format
from astra_jax.runtime.errors import InputError

# Keys a rerun may change. All but mesh.* leave what is computed unchanged; a new mesh
# restores the same W, encoder and optimizer state laid out anew, and the same estimator
# from then on, but other draws (random negatives are drawn per W shard) and, if mesh.model
# changed, random negatives until the next refresh (hard negatives are mined per shard).
FREE_KEYS = (
  "train.log_every_steps",
  "train.profile_steps",
  "train.prefetch",
  "train.input_threads",
  "eval.",
  "checkpoint.",
  "mesh.",
  "negatives.inject_fault",
  "data.cache_dir",
  "train.stop_after_steps",
  "train.hang_timeout_s",
  "negatives.refresh_threads",
  "negatives.on_refresh_failure",
  "scoring.neighbour_memory",
)


_SYNTHETIC_ON = "data.synthetic.enabled"


# Keys added after runs were recorded, each with the value that computes what those runs
# computed: a saved config without the key reads as that value (not as a changed run).
ADDED_KEYS = {
  "data.synthetic.hidden_own_words": 0,
  "negatives.index.rows_per_query": 0,
  "encoder.matmul_precision": "default",
  "optim.encoder_adam_eps": 1e-8,
  "optim.classifier_momentum": 0.0,
  "data.validation_fraction": 0.0,
  "eval.peers": "",
  "scoring.label_text_weight_choices": (),
  "data.validation_seed": 0,
  "data.filter_self": "off",
  "classifier.init": "normal",
  "classifier.init_scale": 1.0,
  "data.label_subset": 0,
  "data.label_subset_seed": 0,
  "encoder.init_from_workdir": "",
  "encoder.arch": "bert",
  "encoder.ngram.orders": 3,
  "encoder.ngram.hash_buckets": 1 << 18,
  "encoder.ngram.buckets_per_token": 0,
  "encoder.ngram.normalize_scale": 10.0,
  "warmstart.epochs": 0,
  "warmstart.batch_size": 256,
  "warmstart.lr": 1e-3,
  "warmstart.warmup_steps": 100,
  "warmstart.inverse_temperature": 20.0,
  "scoring.label_text_weight": 0.0,
  "scoring.label_text_scale": 5.0,
  "scoring.label_text_shift": 0.0,
  "data.validation_max_rows": 0,
  "scoring.label_text_shape_choices": (),
  "negatives.refresh_backend": "host",
  "train.init_from": "",
  "train.freeze_encoder": False,
  "train.freeze_old_rows": False,
  "data.synthetic.topic_size": 0,
  "data.synthetic.topic_words": 16,
  "data.synthetic.vocab_per_label": 0.0,
  "negatives.index.avq": 0.0,
  "negatives.index.soar_lambda": 0.0,
  "negatives.index.leaf_rows": 0,
  "negatives.index.group_rows": 0,
  "negatives.index.leaf_shrink": 0.0,
  "scoring.neighbour_weight": 0.0,
  "scoring.neighbours": 50,
  "scoring.neighbour_temperature": 0.1,
  "scoring.neighbour_search": "auto",
  "scoring.neighbour_search_rows": 50_000,
  "scoring.neighbour_memory": "auto",
  "scoring.neighbour_weight_choices": (),
  "optim.encoder_table_update": "dense",
  "optim.warmup_max_fraction": 1.0,
  "scoring.choose_jointly": False,
  "scoring.choose_by": ("P@1",),
}


# Keys renamed since runs were recorded: a saved config's old key reads as the new one.
RENAMED_KEYS = {
  "negatives.index": "negatives.index.kind",
  "negatives.scann_leaves": "negatives.index.num_leaves",
  **{
    f"negatives.scann_{name}": f"negatives.index.{name}"
    for name in (
      "leaves_to_search",
      "reorder",
      "rows_per_query",
      "leaf_rows",
      "leaf_shrink",
      "group_rows",
      "avq",
      "soar_lambda",
    )
  },
}


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _trained(workdir: str) -> bool:
  """Whether the workdir holds anything a run computed: a checkpoint or final results."""
  ck = os.path.join(workdir, "checkpoints")
  return os.path.exists(os.path.join(workdir, "results.json")) or (
    os.path.isdir(ck) and any(d.isdigit() for d in os.listdir(ck))
  )


def config_diff(saved: dict, now: dict) -> list[tuple[str, object, object]]:
  """(flattened key, saved value, new value) where two configs' JSON differ, FREE_KEYS
  aside."""
  saved = {RENAMED_KEYS.get(k, k): v for k, v in _flat(saved).items()}
  saved, now = {**ADDED_KEYS, **saved}, _flat(now)
  # A real-data run does not read the synthetic generator's fields.
  free = (
    FREE_KEYS
    if saved.get(_SYNTHETIC_ON) or now.get(_SYNTHETIC_ON)
    else (FREE_KEYS + ("data.synthetic.",))
  )
  return [
    (k, saved.get(k), now.get(k))
    for k in sorted(set(saved) | set(now))
    if saved.get(k) != now.get(k) and not k.startswith(free)
  ]


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """WORKDIR/config.json as a config: renamed keys read as their new names, keys added since
  it was written as ADDED_KEYS' values (what the run computed).

  Raises:
    InputError: the workdir has no config.json.
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise InputError(f"{path} does not exist: not a training run's workdir")
  with open(path) as f:
    flat = {RENAMED_KEYS.get(k, k): v for k, v in _flat(json.load(f)).items()}
  nested: dict = {}
  for key, value in {**ADDED_KEYS, **flat}.items():
    *path_, leaf = key.split(".")
    node = nested
    for part in path_:
      node = node.setdefault(part, {})
    node[leaf] = value
  return ml_collections.ConfigDict(nested)


def check_config(workdir: str, config_json: dict, write: bool = True) -> None:
  """Records the config in a new workdir; in one holding a checkpoint or results, refuses a
  changed computation. (A run that stopped before either, e.g. on missing data, binds
  nothing: its config.json is replaced.) write=False: only the refusal (the processes
  other than the leader)."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      diff = config_diff(json.load(f), config_json)
    if not diff:
      return
    if _trained(workdir):
      shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in diff[:8])
      raise InputError(
        f"{path}: the workdir holds a run with a different config ({shown}"
        f"{' ...' if len(diff) > 8 else ''}); use a new --workdir or the same "
        "config"
      )
    logging.info("%s: nothing trained in this workdir yet; recording the new config", path)
  if write:  # atomically: another process may be reading it
    with xc_format.atomic_text_writer(path) as f:
      json.dump(config_json, f, indent=1)
