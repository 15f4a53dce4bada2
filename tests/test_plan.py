"""The memory planner against hand counts and against what jax allocates; the dataset
configs (all variants) load and validate; the SS-20M missing-data message; the SS-20M
synthetic stand-in trains end to end."""

import copy
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from astra_jax import plan
from astra_jax.ann import memory_search
from astra_jax.ann.index import IndexKnobs
from astra_jax.config import base as config_base
from astra_jax.data import catalog
from astra_jax.model import factory
from astra_jax.runtime.errors import InputError
from astra_jax.training import run_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_CONFIGS = {d.config for d in catalog.DATASETS.values()}


def load_config(path, variant=None):
  return config_base.load_config(os.path.join(REPO, path), variant)


def small_config(labels=1000, model=4):
  """Tiny BERT over a synthetic vocabulary: every size below is easy to count by hand."""
  c = config_base.base_config()
  c.data.dir = "/unused"
  c.data.synthetic.enabled = True
  c.data.synthetic.num_labels, c.data.synthetic.num_train = labels, 5000
  c.data.augment_label_text = True
  c.mesh.data, c.mesh.model = 8 // model, model
  c.train.batch_size = 64
  return c


def timed_small_plan(c):
  """small_config's plan on 8 V100s, 8 processes on one node with 40 host cores, at 100
  training queries/s a GPU."""
  return plan.plan_config(
    c,
    "v100-32gb",
    mesh="2x4",
    processes_per_node=8,
    host_cores_per_node=40,
    train_queries_per_s=100.0,
  )


def item(p, prefix):
  items = p.device_items + p.worker_items + p.trainer_items
  (found,) = [i.bytes for i in items if i.name.startswith(prefix)]
  return found


def test_byte_counts_equal_hand_counts():
  p = plan.plan_config(small_config(labels=1000, model=3), "v100-32gb", mesh="2x3")
  # Tiny BERT: vocabulary 8000 words + 5 special tokens, 512 positions, 2 token types,
  # hidden 64, 2 layers, ffn 128.
  embeddings = (8005 + 512 + 2) * 64 + 2 * 64
  layer = 4 * (64 * 64 + 64) + 2 * 64 + (64 * 128 + 128) + (128 * 64 + 64) + 2 * 64
  params = embeddings + 2 * layer
  assert p.encoder["params"] == params == 612_288
  assert item(p, "encoder parameters") == 4 * params
  assert item(p, "Adam m, v") == 8 * params
  assert item(p, "W shard") == 334 * 64 * 4  # ceil(1000 / 3) rows of d = 64
  assert item(p, "classifier optimizer state") == 8  # sparse: a scale and a step
  assert item(p, "W snapshot") == 334 * 64 * 4
  assert item(p, "query embeddings being collected") == 6000 * 64 * 4  # + label texts
  assert p.negatives["k_h_per_shard"] == 50 and p.batch["encoder_queries_per_device"] == 11


def by_name(items, prefix):
  (found,) = [i.bytes for i in items if i.name.startswith(prefix)]
  return found


def test_node_plan_equals_hand_counts():
  """Two nodes of two GPUs, a process per GPU, a 2 x 2 mesh: each process holds one W shard
  (500 rows of d = 64) and mines 50 negatives per row for it, for the 3,000 rows of its data
  group; 6,000 rows (5,000 + 1,000 label texts) of 32 tokens, 12,500 positives, 4,000 test
  rows with 10,000 positives."""
  c = small_config(labels=1000, model=2)
  p = plan.plan_config(c, "v100-32gb", mesh="2x2", num_gpus=4, gpus_per_node=2)
  assert p.node == {
    "num_gpus": 4,
    "gpus_per_node": 2,
    "processes_per_node": 2,
    "nodes": 2,
    "shards_per_process": 1,
  }
  assert p.negatives["k_h_per_shard"] == 50 and p.negatives["index"] == "exact"
  index = 500 * 64 * 4 + 4096 * 500 * 4 * 2  # the shard + a score block, twice
  worker = index + 500 * 64 * 4  # + its W snapshot
  trainer = 500 * 64 * 4  # its shard's rows, copied for a refresh
  label_cache = 5001 * 8 + 12_500 * 4 + 1000 * 4  # indptr, indices, counts
  negatives, collection = 3000 * 50 * 4, 6000 * 64 * 4
  assert plan.resident(p.worker_items) == worker
  assert plan.resident(p.trainer_items) == trainer
  # The node: its two processes and two workers, the shared files once, each process's own.
  assert by_name(p.node_items, "token memmaps") == 6000 * 32 * 4
  assert by_name(p.node_items, "label cache") == label_cache
  assert (
    p.node_total
    == (
      2 * trainer
      + 2 * worker
      + 6000 * 32 * 4
      + label_cache
      + 2 * negatives
      + 2 * negatives
      + collection
    )
    == 38_334_008
  )
  assert plan.resident(p.node_items) == 2 * (trainer + worker)
  # A ScaNN index: an fp32 copy and codes of the shard's rows; with its leaves trained in
  # groups it is still one index over the shard, the same.
  c.negatives.index.kind = "scann"
  flat = plan.plan_config(c, "v100-32gb", mesh="2x2", num_gpus=4, gpus_per_node=2)
  assert by_name(flat.worker_items, "ANN index") == 2 * 500 * 64 * 4
  c.negatives.index.group_rows = 100
  grouped = plan.plan_config(c, "v100-32gb", mesh="2x2", num_gpus=4, gpus_per_node=2)
  assert by_name(grouped.worker_items, "ANN index") == 2 * 500 * 64 * 4
  # Disk: caches (train + test), 2 refreshes' inputs (the collected embeddings once, a W
  # snapshot per process), 2 negatives generations
  # per process, (3 kept + best + one being written) checkpoints, the export.
  params = 612_288
  checkpoint = 12 * params + 1000 * 64 * 4  # parameters, Adam m and v, W
  assert [i.bytes for i in p.disk_items] == [
    10_000 * 32 * 4,
    label_cache + 4001 * 8 + 10_000 * 4,
    2 * (collection + 2 * 500 * 64 * 4),
    2 * 2 * negatives,
    5 * checkpoint,
    4 * params + 1000 * 64 * 4,
  ]
  assert p.disk_total == 48_152_448
  # Preparation: the measured bounded peak; 22,500 "ddd:1 " pairs of 7 bytes to parse.
  assert p.prep_peak == plan.PARSE_PEAK_BYTES
  assert p.prep_seconds["label_text_bytes"] == 22_500 * 7
  assert p.prep_seconds["tokenize_rows"] == 10_000


def test_one_process_for_the_node_mines_for_every_shard():
  c = small_config(labels=1000, model=2)
  p = plan.plan_config(c, "v100-32gb", mesh="2x2", processes_per_node=1)
  assert p.node["shards_per_process"] == 2 and p.node["nodes"] == 1
  assert by_name(p.node_items, "hard negatives in use") == 6000 * 2 * 50 * 4
  with pytest.raises(InputError, match="--processes_per_node=3 does not divide"):
    plan.plan_config(c, "v100-32gb", mesh="2x2", processes_per_node=3)
  with pytest.raises(InputError, match="--gpus_per_node=3 does not divide the 4 devices"):
    plan.plan_config(c, "v100-32gb", mesh="2x2", gpus_per_node=3)


@pytest.mark.parametrize("path,gpus", [("experiments/ss20m.py", 2), ("experiments/ss120m.py", 8)])
def test_paper_scale_node_reports_name_every_structure(path, gpus):
  text = plan.format_plan(
    plan.plan_config(load_config(path), "v100-32gb", num_gpus=gpus, gpus_per_node=gpus)
  )
  for name in (
    "preparation, one builder per node",
    "label parse",
    "tokenization",
    "CPU min to parse",
    "each refresh worker",
    "each training process",
    "the node in training",
    f"x {gpus} processes",
    "label cache (once per node)",
    "token memmaps (once per node)",
    "query-embedding collection",
    "hard negatives being mined",
    "refresh inputs",
    "2 generations",
    "checkpoints: the last 3",
    "export",
  ):
    assert name in text, name


def test_curricula_plan_their_widest_columns():
  c = small_config(labels=1000, model=1)
  c.negatives.strategy = "curriculum"  # base: k_h 50, k_r 400; half of 450 hard at the end
  p = plan.plan_config(c, "v100-32gb", mesh="8x1")
  assert (p.negatives["k_h_per_shard"], p.negatives["k_r_per_shard"]) == (225, 400)
  assert item(p, "mined hard negatives") == 6000 // 8 * 225 * 4  # its data group's rows
  c.negatives.strategy = "random"
  p = plan.plan_config(c, "v100-32gb", mesh="8x1")
  assert (p.negatives["k_h_per_shard"], p.negatives["k_r_per_shard"]) == (0, 450)


def test_dense_momentum_is_a_full_copy_of_w():
  c = small_config(labels=1000, model=1)
  c.optim.classifier_update, c.optim.classifier_momentum = "dense", 0.9
  p = plan.plan_config(c, "a100-80gb", mesh="1x1")
  assert item(p, "classifier optimizer state") == 1000 * 64 * 4
  assert item(p, "dense W gradient") == 2 * 1000 * 64 * 4


def test_sparse_momentum_keeps_a_velocity_per_row_of_the_shard():
  c = small_config(labels=1000, model=4)
  c.optim.classifier_momentum = 0.9
  p = plan.plan_config(c, "a100-80gb", mesh="1x4")
  assert item(p, "classifier optimizer state") == 250 * 64 * 4


def test_byte_counts_equal_what_jax_allocates():
  import jax
  from flax import nnx

  from astra_jax.parallel import sharding
  from astra_jax.training import optim, steps

  c = small_config(labels=1001, model=4)
  p = plan.plan_config(c, "h100-80gb")
  encoder = factory.build_encoder(c, vocab_size=8005, pad_id=0, seed=0)
  _, params = nnx.split(encoder, nnx.Param)
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  assert nbytes(params) == item(p, "encoder parameters")
  adam = optim.encoder_optimizer(c.optim, total_steps=100).init(params)
  # Adam's m and v, plus two int32 step counters (Adam's and the schedule's).
  assert nbytes(adam) == item(p, "Adam m, v") + 8
  mesh = sharding.make_mesh(c.mesh.data, c.mesh.model)
  w = jax.numpy.zeros((sharding.padded_rows(1001, mesh), 64), jax.numpy.float32)
  placed, _ = steps.shard_params({"encoder": params, "classifier": w}, {}, mesh)
  shards = placed["classifier"].addressable_shards
  assert len(shards) == 8 and all(s.data.nbytes == item(p, "W shard") for s in shards)


def test_activation_plan_covers_what_xla_keeps():
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from astra_jax.training import steps

  c = config_base.base_config()  # the tiny BERT: hidden 64, 2 layers x 2 heads, ffn 128
  c.data.max_len = 48
  encoder = factory.build_encoder(c, vocab_size=1000, pad_id=0, seed=0)
  graphdef, params = nnx.split(encoder, nnx.Param)

  def loss(p, ids, key):
    return (steps.encode(graphdef, p, ids, key)[0] ** 2).sum()

  ids = jnp.ones((32, 48), jnp.int32)
  compiled = jax.jit(jax.grad(loss)).lower(params, ids, jax.random.key(0)).compile()
  xla = compiled.memory_analysis().temp_size_in_bytes
  planned, _ = plan.activation_bytes(plan.encoder_shape(c)[0], 32, 48)
  assert xla <= planned <= 2 * xla, (planned, xla)


def test_suggestions_when_it_does_not_fit():
  c = load_config("experiments/ss120m.py")
  p = plan.plan_config(c, "v100-32gb", mesh="1x1")
  assert not p.fits
  assert any("--mesh=1x" in s or "--num_gpus" in s for s in p.suggestions), p.suggestions
  # The per-shard negatives follow the mesh: 1,600 random per query on one shard.
  assert p.negatives["k_r_per_shard"] == 1600 and p.negatives["k_h_per_shard"] == 240


def test_cli_json_without_jax(tmp_path):
  code = (
    "import sys; sys.argv = ['astra-plan', '--config=experiments/ss20m.py', "
    "'--gpu=v100-32gb', '--num_gpus=2', '--json']\n"
    "from astra_jax.plan import __main__ as p\ntry:\n  p.cli_main()\n"
    "except SystemExit:\n  pass\n"
    "assert 'jax' not in sys.modules, 'the planner imported jax'\n"
  )
  r = subprocess.run(
    [sys.executable, "-c", code],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, "ASTRA_MODELS_DIR": str(tmp_path)},
  )
  assert r.returncode == 0, r.stderr[-2000:]
  out = json.loads(r.stdout)
  assert out["mesh"] == {"data": 1, "model": 2, "devices": 2}
  assert out["data"]["num_labels"] == 19_049_952 and out["fits"]
  assert out["negatives"]["k_h_per_shard"] == 120 and out["negatives"]["k_r_per_shard"] == 800


@pytest.mark.parametrize("path", sorted(glob.glob("experiments/*.py", root_dir=REPO)))
def test_every_config_loads_and_validates(path):
  variants = {"experiments/xc_text.py": ["minilm", "tiny", "ngram"], "experiments/demo.py": [None]}
  for variant in variants.get(path, ["", "staged", "synthetic"]):
    c = load_config(path, variant)
    c.data.dir = c.data.dir or "/some/dir"  # demo.py and xc_text.py leave it to the user
    if path in PAPER_CONFIGS and variant != "synthetic" and not os.path.isdir(c.encoder.hf_dir):
      # Without the paper's encoder: an error, until MiniLM is chosen explicitly.
      with pytest.raises(InputError, match="the paper's encoder .* is not in"):
        config_base.check_inputs(c)
      c.encoder.hf_dir = "all-MiniLM-L6-v2"
    config_base.validate(c)
    if path in PAPER_CONFIGS:
      assert c.data.dir.startswith("data/") and c.negatives.tau_s == c.negatives.tau_r == 5
      assert c.train.batch_size % (c.train.grad_accum_steps * c.mesh.data * c.mesh.model) == 0
      assert c.data.synthetic.enabled == (variant == "synthetic")


@pytest.mark.parametrize("path", sorted(PAPER_CONFIGS))
def test_staged_variant_adds_the_real_data_stages_and_nothing_else(path):
  plain, staged = load_config(path), load_config(path, "staged")
  changed = {k for k, _, _ in run_config.config_diff(plain.to_dict(), staged.to_dict())}
  assert changed == {
    "warmstart.epochs",
    "warmstart.batch_size",
    "warmstart.lr",
    "classifier.init",
    "scoring.label_text_weight",
  }
  assert staged.warmstart.epochs > 0 and staged.classifier.init == "label_text"
  assert 0 < staged.scoring.label_text_weight < 1
  # The paper's row is untouched, Renee's momentum included.
  assert staged.optim.classifier_momentum == plain.optim.classifier_momentum == 0.9
  with pytest.raises(ValueError, match="'staged'"):
    load_config(path, "staged,2")


def test_paper_table_translation():
  c = load_config("experiments/lf_amazontitles_131k.py")
  assert (c.train.batch_size, c.negatives.k_h, c.negatives.k_r) == (512, 800, 6400)
  # k_p: every positive of >= 99.9% of rows, |P| geometric with mean 2.3:
  # ceil(ln(0.001) / ln(1 - 1/2.3)) = ceil(12.09) = 13; the table's 7 is kept as paper.k_p.
  assert (c.negatives.k_p, c.paper.k_p) == (13, 7)
  # Renee's encoder Adam: eps 1e-6, decoupled decay 0.01 (0.001 for Amazon-670K / -3M).
  assert (c.optim.encoder_adam_eps, c.optim.encoder_weight_decay) == (1e-6, 1e-2)
  assert load_config("experiments/amazon_3m.py").optim.encoder_weight_decay == 1e-3
  assert c.optim.classifier_lr == pytest.approx(0.05 * 512)
  # torch SGD on a batch-summed loss adds wd W to the gradient (0.05 x 1e-4 here): ours on
  # the batch mean with lr x B and wd / B is the same step, momentum included
  lr_wd = lambda c: c.optim.classifier_lr * c.optim.classifier_weight_decay
  assert lr_wd(c) == pytest.approx(0.05 * 1e-4)
  assert c.optim.classifier_momentum == 0.9  # Renée's SGD momentum
  assert (c.data.max_len, c.data.propensity_A, c.data.propensity_B) == (32, 0.6, 2.6)
  c.mesh.model = 4  # per-shard negatives keep the per-query totals
  assert (c.negatives.k_h, c.negatives.k_r) == (200, 1600)
  c.train.batch_size = 128  # the classifier's per-example step is kept
  assert c.optim.classifier_lr == pytest.approx(0.05 * 128)
  assert lr_wd(c) == pytest.approx(0.05 * 1e-4)
  c.encoder.hf_dir = "/elsewhere"  # the tokenizer follows the encoder
  assert c.data.tokenizer_dir == "/elsewhere"
  w = load_config("experiments/lf_wikipedia_500k.py")
  assert (w.data.max_len, w.data.propensity_A, w.data.propensity_B) == (256, 0.5, 0.4)
  assert w.data.use_content
  s = load_config("experiments/ss20m.py")
  assert (s.encoder.bottleneck_dim, s.mesh.model, s.train.grad_accum_steps) == (64, 2, 2)
  assert (s.data.propensity_A, s.data.propensity_B) == (0.55, 1.5)
  # Stand-ins: the paper's share of the labels as negatives, at least 64, at most L/2.
  for path, scale, k in (
    ("lf_amazontitles_131k.py", 0.01, (8, 64)),  # 1% of 800 + 6,400
    ("lf_amazon_131k.py", 0.01, (8, 56)),  # 1% of 240 + 1,600: 18 -> 64
    ("ss20m.py", 2e-5, (8, 56)),  # 240 + 1,600 (one CPU device)
    ("amazon_670k.py", 1e-3, (7, 57)),
  ):  # 800 + 6,400: 7.2 -> 64
    sc = load_config(f"experiments/{path}", f"synthetic,{scale}")
    assert (sc.negatives.k_h, sc.negatives.k_r) == k, path
    assert sc.optim.classifier_momentum == 0.0 and sc.paper.classifier_momentum == 0.9
  with pytest.raises(ValueError, match="use a scale of at least"):
    load_config("experiments/ss20m.py", "synthetic,1e-6")
  with pytest.raises(ValueError, match="ss20m.py:synthetic,abc: the scale must be a number"):
    load_config("experiments/ss20m.py", "synthetic,abc")
  with pytest.raises(ValueError, match="variants are"):
    load_config("experiments/ss20m.py", "tiny")


def test_ss20m_without_its_data_stops_with_one_line(tmp_path):
  missing = tmp_path / "SS-20M"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "astra_jax.main",
      "--config=experiments/ss20m.py",
      f"--config.data.dir={missing}",
      f"--workdir={tmp_path / 'wd'}",
      "--config.encoder.hf_dir=all-MiniLM-L6-v2",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode != 0
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, r.stderr
  msg = lines[0]
  assert msg.startswith("error: no dataset found in") and str(missing) in msg
  for name in (
    "trn_X_Y.txt",
    "tst_X_Y.txt",
    "trn_X.txt",
    "trn.json.gz",
    "python -m astra_jax.main --config=experiments/ss20m.py:synthetic",
  ):
    assert name in msg, name


@pytest.mark.e2e
def test_ss20m_synthetic_stand_in_trains_end_to_end(tmp_path):
  from astra_jax.training import train

  c = load_config("experiments/ss20m.py", "synthetic,2e-5")
  assert (c.data.synthetic.num_labels, c.data.synthetic.num_train) == (381, 2924)
  assert c.data.synthetic.mean_labels == 26.0 and c.encoder.bottleneck_dim == 64
  c.data.dir = str(tmp_path / "data")
  # Smaller than the variant allows at SS-20M's batch of 2,048, to stay fast: 1,200 queries
  # + 381 label texts in 6 steps of 256 per epoch.
  c.data.synthetic.num_train, c.train.batch_size = 1200, 256
  c.train.epochs, c.train.profile_steps, c.train.eval_every_epochs = 2, 0, 0
  c.negatives.tau_s = c.negatives.tau_r = 1  # one refresh, so hard negatives are used
  r = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert (r["num_labels"], r["num_train"], r["num_train_with_label_texts"]) == (381, 1200, 1581)
  assert [e["hard"] for e in r["negatives"]["per_epoch"]] == [0, c.negatives.k_h]
  assert r["steps"] == 2 * 6 and np.isfinite(r["P@1"]) and r["P@1"] > 0
  # Stand-in rows have at most max_labels positives: k_p keeps all of them.
  assert c.negatives.k_p == c.data.synthetic.max_labels == 48
  assert (
    r["encoder"]["name"] == "bert, randomly initialised" and r["encoder"]["weights_sha256"] is None
  )
  assert r["encoder"]["parameters"] > 0


DISTILBERT = {
  "model_type": "distilbert",
  "dim": 768,
  "n_layers": 6,
  "n_heads": 12,
  "hidden_dim": 3072,
  "vocab_size": 30522,
  "max_position_embeddings": 512,
}


@pytest.mark.parametrize("path", sorted(PAPER_CONFIGS))
def test_paper_configs_leave_a_quarter_of_a_v100_free(path, tmp_path, monkeypatch):
  """docs/datasets.md's rule for each paper config's accumulation, with the paper's DistilBERT:
  the smallest A that leaves 8 GiB of a V100-32GB free, on the config's own mesh."""
  (tmp_path / "msmarco-distilbert-base-v4").mkdir()
  (tmp_path / "msmarco-distilbert-base-v4" / "config.json").write_text(json.dumps(DISTILBERT))
  monkeypatch.setenv("ASTRA_MODELS_DIR", str(tmp_path))
  c = load_config(path)
  assert c.encoder.paper_encoder.endswith("msmarco-distilbert-base-v4")

  def free(accum):
    c2 = copy.deepcopy(c)
    c2.train.grad_accum_steps = accum
    p = plan.plan_config(c2, "v100-32gb", num_gpus=c.mesh.data * c.mesh.model)
    return p.usable - p.device_total

  a = c.train.grad_accum_steps
  assert free(a) >= 8 * 2**30
  if a > 1:
    assert free(a // 2) < 8 * 2**30


def test_full_label_stand_in_keeps_the_datasets_label_count(load_config):
  c = load_config("experiments/ss20m.py", "full_labels,200000")
  config_base.validate(c)
  s = c.data.synthetic
  assert s.enabled and s.num_labels == catalog.DATASETS["SS-20M"].num_labels == 19_049_952
  assert (s.num_train, s.num_test, c.data.num_train) == (200_000, 10_000, 200_000)
  assert s.mean_labels == 26.0  # the dataset's statistics, as :synthetic
  assert c.encoder.arch == "ngram_bag"
  assert (c.encoder.hidden_size, c.encoder.bottleneck_dim) == (64, 0)
  assert not c.data.augment_label_text  # 19M label rows would swamp 2e5 queries
  assert (c.negatives.k_h, c.negatives.k_r, c.negatives.index.kind) == (32, 224, "scann")
  assert c.negatives.index.rows_per_query > 0  # a refresh at a fixed cost per query
  assert c.negatives.index.leaf_rows == 2000 and c.classifier.init == "label_text"
  assert (c.negatives.index.leaf_shrink, c.negatives.index.group_rows) == (0.5, 80_000)
  assert c.negatives.index.num_leaves == 0  # a leaf size, so that every shard has its share
  # The serving index's partitioner; unigrams for bag-of-words queries; topics of whole groups.
  assert (c.negatives.index.avq, c.negatives.index.soar_lambda) == (1.0, 1.5)
  from astra_jax.ann import index as index_lib

  params = index_lib.scann_defaults(
    10_000_000, 32, **IndexKnobs.from_config(c.negatives.index).scann_knobs()
  )
  # Leaves of 2,000 x (10^6 / 10^7)^0.5 = 632 rows: 10^7 // 632 = 15,822, built in groups of
  # 80,000 rows; each searched leaf worth twice its rows with SOAR's copies.
  assert (params.num_leaves, params.avq, params.soar_lambda) == (15_822, 1.0, 1.5)
  assert (params.group_rows, params.reorder) == (80_000, 100)
  assert params.num_leaves_to_search == math.ceil(256_000 / (2 * 10_000_000 / 15_822))
  # On a 1 x 2 mesh each shard of SS-20M's W holds 9,524,976 rows: leaves of
  # round(2,000 x (10^6 / 9,524,976)^0.5) = 648 rows, 9,524,976 // 648 = 14,699 of them,
  # each shard's own leaf size as if it were the whole index.
  half = index_lib.scann_defaults(
    19_049_952 // 2, 32, **IndexKnobs.from_config(c.negatives.index).scann_knobs()
  )
  assert half.num_leaves == 14_699
  assert half.num_leaves_to_search == math.ceil(256_000 / (2 * 9_524_976 / 14_699))
  demo = load_config("experiments/demo.py")
  assert IndexKnobs.from_config(demo.negatives.index).scann_knobs()["avq"] is None
  assert c.encoder.ngram.orders == 1
  assert s.topic_size % s.group_size == 0 and s.topic_words >= 3  # a group takes 3 words
  assert (c.mesh.data, c.mesh.model) == (1, 1)
  # SS-20M's 5,000 warmup steps of 146M queries: the same share of 200,000.
  assert c.optim.warmup_steps == round(5000 * 200_000 / 146_193_053)
  assert c.data.dir != load_config("experiments/ss20m.py", "synthetic").data.dir
  assert load_config("experiments/ss20m.py", "full_labels").data.synthetic.num_train == 1_000_000
  with pytest.raises(ValueError, match="full_labels,abc: NUM_TRAIN must be a number"):
    load_config("experiments/ss20m.py", "full_labels,abc")
  with pytest.raises(ValueError, match="fewer queries than the batch size 2048"):
    load_config("experiments/ss20m.py", "full_labels,1000")


def test_an_ngram_bag_encoder_is_planned_without_transformer_fields():
  # The architecture has no layers or heads: the report leaves them out instead of failing.
  c = load_config("experiments/ss20m.py", "full_labels")
  p = plan.plan_config(c, "v100-32gb", num_gpus=2, gpus_per_node=2)
  assert p.encoder["model_type"] == "ngram_bag" and p.encoder["layers"] is None
  text = plan.format_plan(p)
  assert "ngram_bag, " in text and "layers x" not in text.split("\n")[3]


def test_refresh_hours_equal_hand_counts_at_ss20m(load_config):
  """SS-20M on two V100s: 146,193,053 queries + 19,049,952 label texts, two W shards of
  9,524,976 rows, d = 64, DistilBERT at 32 tokens; the index's default rule (2 sqrt(R)
  leaves, a third of them searched)."""
  c = load_config("experiments/ss20m.py")
  p = plan.plan_config(c, "v100-32gb")
  r = p.refresh
  rows, shard = 146_193_053 + 19_049_952, 9_524_976
  leaves = int(2 * math.sqrt(shard))  # 6,172
  searched = leaves // 3  # 2,057
  scored = round(searched * shard / leaves) + leaves
  assert r["rows_scored_per_query"] == scored
  # Host: both shards' searches and builds in one node's 2 x 5 cores, at the measured
  # per-row rates: 24.1 s per 10^5 queries on one core at 272,000 rows of 64 scored per
  # query; a build of 320 s on 2 cores for 10^7 rows of 64.
  search = rows * scored * 64 * (24.1 / 1e5 / 272_000 / 64)
  build = shard * 64 * (640 / 1e7 / 64)
  assert r["host_s"] == pytest.approx(2 * (search + build) / 10, rel=1e-9)
  # Device: every query against its shard on each device, at half of 15.7 TFLOP/s.
  assert r["device_s"] == pytest.approx(2 * rows * shard * 64 / 7.85e12, rel=1e-9)
  # The epoch: 128 queries per 49.1 ms per V100 (the paper's SS-20M iteration), 2 GPUs.
  assert r["epoch_s"] == pytest.approx(rows / (2 * 128 / 49.1e-3), rel=1e-3)
  assert r["host_wait_s"] == pytest.approx(r["host_s"] - r["epoch_s"])
  assert r["device_wait_s"] == r["device_s"]  # between epochs: all of it is waited for
  text = plan.format_plan(p)
  assert "host backend: training waits" in text and "not measured" in text


def test_refresh_hours_read_the_given_rates_and_price_no_tpu(load_config):
  c = load_config("experiments/ss20m.py")
  p = plan.plan_config(c, "h100-80gb", host_cores_per_node=1000, train_queries_per_s=1e4)
  r = p.refresh
  assert r["host_cores_per_node"] == 1000 and not r["step_speed_estimated"]
  assert r["epoch_s"] == pytest.approx((146_193_053 + 19_049_952) / 2e4)
  assert r["device_s"] == pytest.approx(r["device_flops"] / (495e12 / 2))
  # 14 host cores per H100 by default: fewer cores, proportionally longer.
  default = plan.plan_config(c, "h100-80gb").refresh
  assert default["host_s"] == pytest.approx(r["host_s"] * 1000 / 28)
  assert plan.plan_config(c, "tpu-v4-32gb", mesh="1x2").refresh == {}


def test_the_score_beyond_w_is_priced_by_hand(monkeypatch):
  c = small_config(labels=1000, model=4)
  c.data.synthetic.mean_labels = 3.0
  p = plan.plan_config(c, "v100-32gb", mesh="2x4")
  assert p.score_items == [] and p.vote_search is None  # W alone: nothing after training
  assert "score beyond W" not in plan.format_plan(p)
  c.scoring.label_text_weight_choices = (0.0, 0.5)
  c.scoring.neighbour_weight = 0.5
  c.data.validation_fraction = 0.1
  p = plan.plan_config(c, "v100-32gb", mesh="2x4")
  # d = 64; 5,000 original rows vote, 3 labels each; 1,000 label texts.
  assert by_name(p.score_items, "label-text embeddings") == 1000 * 64 * 4
  # The keys stay on the 8 GPUs, 625 rows each with their int32 row ids; the labels on
  # every process; the export writes both.
  assert not any(i.name.startswith("vote memory: unit") for i in p.score_items)
  assert by_name(p.score_device_items, "vote memory: its 625 keys") == 625 * (64 * 4 + 4)
  # The memory's labels are views of the training data's: no bytes after training. The
  # validation split keeps the 4,500 kept rows' ids (int64) and copies the 500 held-out
  # rows' labels (3 each) in the training process; the refresh worker maps the ids from an
  # .npy its process writes, one per process on disk.
  assert not [i for i in p.score_items if i.name.startswith("vote memory: their labels")]
  assert by_name(p.trainer_items, "validation split: the kept rows' ids") == 4500 * 8
  assert by_name(p.trainer_items, "validation split: the held-out rows' labels") == (
    501 * 8 + 1500 * 4
  )
  assert by_name(p.worker_items, "validation split: the kept rows' ids") == 4500 * 8
  assert by_name(p.disk_items, "validation split: the kept rows' ids") == 8 * 4500 * 8
  assert by_name(p.disk_items, "export: vote_memory_keys.npy") == 5000 * 64 * 4
  assert by_name(p.disk_items, "export: vote_memory.npz") == 5001 * 8 + 15000 * 4
  # 500 validation rows (10% of 5,000), 256 voted labels each, an int32 id and a float32
  # vote; each of the 8 processes (one a GPU) keeps those of the 63 it ranks.
  assert p.node["processes_per_node"] == 8
  assert by_name(p.score_items, "its validation rows' votes") == 63 * 256 * 8
  # ... in the process's vote_cache/, memory-mapped: on disk until the run ends.
  assert [i.paged for i in p.score_items if i.name.startswith("its validation rows' votes")] == [
    True
  ]
  assert by_name(p.disk_items, "vote_cache/ of the 8 process(es)") == 8 * 63 * 256 * 8
  from astra_jax.plan import refresh_time
  from astra_jax.plan.records import VoteSearchCost
  from astra_jax.plan.score_extras import VOTE_SLOTS
  from astra_jax.xc.neighbour_vote import MAX_VOTES

  assert VOTE_SLOTS == MAX_VOTES == 256
  test = c.data.synthetic.num_test
  assert p.vote_search == VoteSearchCost(
    False, 5000, 2.0 * (test + 500) * 5000 * 64, 0.0, 5000, test, 500, True
  )
  assert "the vote's exact search" in plan.format_plan(p)

  # Its seconds: 8 processes on one node (one a GPU) with 40 host cores, 100 training
  # queries/s a GPU given; the memory encoded over all 8 GPUs at 3x that; the test and
  # validation rows searched against the memory split over the 8 V100s, each at half its
  # 15.7 TFLOP/s.
  def timed_plan():
    return timed_small_plan(c)

  p = timed_plan()
  t = p.vote_time
  assert t.encode_s == pytest.approx(5000 / (3 * 100.0 * 8))
  assert t.search_s == pytest.approx(2.0 * (test + 500) * 5000 * 64 / (8 * 15.7e12 * 0.5))
  assert t.build_s == 0 and t.search_on == "all 8 GPUs"
  # A memory with no room on the GPUs (or scoring.neighbour_memory=hosts) is split over the
  # 8 processes' hosts, 625 rows of 64 float32 and an int64 row id each, and each process
  # searches its rows for every test and validation row on one of its GPUs.
  with monkeypatch.context() as m:
    m.setattr(memory_search, "DEVICE_ROOM_FRACTION", 0.0)
    no_room = timed_plan()
  c.scoring.neighbour_memory = "hosts"
  forced = timed_plan()
  c.scoring.neighbour_memory = "auto"
  for p in (no_room, forced):
    assert p.score_device_items == [] and not p.vote_search.on_devices
    assert by_name(p.score_items, "vote memory: the process's") == 625 * (64 * 4 + 8)
    assert not [x for x in p.score_items if x.name.startswith("vote memory: unit")]
    # ... the 625 keys crossing a V100's host link (12 GB/s) once: fewer queries than 2^16.
    search_s = 2.0 * (test + 500) * 625 * 64 / (15.7e12 * 0.5) + 625 * 64 * 4 / 12e9
    assert p.vote_time.search_s == pytest.approx(search_s)
    assert p.vote_time.search_on == "one GPU of each process"
  # On GPUs `auto` stays exact whatever the memory's rows.
  c.data.synthetic.num_train = 4_000_000
  p = plan.plan_config(c, "v100-32gb", mesh="2x4")
  assert not p.vote_search.scann and p.vote_search.rows_per_query == 4_000_000
  # With scann: ~2 sqrt(N) leaves of N / leaves rows, as many searched as hold
  # neighbour_search_rows, their rows and every leaf centre scored.
  c.scoring.neighbour_search = "scann"
  p = plan.plan_config(c, "v100-32gb", mesh="2x4")
  leaves = int(2 * 4_000_000**0.5)  # 4,000 leaves of 1,000 rows
  assert p.vote_search.scann and p.vote_search.rows_per_query == 50 * 1000 + leaves
  assert p.vote_search.search_flop == 2.0 * (test + 400_000) * (50_000 + leaves) * 64
  assert p.vote_search.build_flop == 2.0 * 4_000_000 * leaves * 64
  assert by_name(p.score_items, "vote memory: its ScaNN index") == 4_000_000 * (256 + 16 + 4)
  assert by_name(p.score_items, "vote memory: unit") == 4_000_000 * 64 * 4  # gathered
  assert p.score_device_items == [] and not p.vote_search.on_devices  # not also on the GPUs
  assert "the vote's ScaNN search" in plan.format_plan(p)
  # On the host: 40 cores a node over 8 processes, at the refresh index's measured rates.
  p = timed_plan()
  t, scored = p.vote_time, 50_000 + leaves
  queries = -(-test // 8) + 50_000
  assert t.search_on == "5 host cores"
  assert t.search_s == pytest.approx(queries * scored * 64 * refresh_time.HOST_SEARCH_CORE_S / 5)
  assert t.build_s == pytest.approx(2 * 4_000_000 * 64 * refresh_time.HOST_BUILD_CORE_S / 5)


def test_the_warm_start_is_priced_by_hand():
  """5,000 rows of 2.5 labels (the synthetic default) less a 10% validation split: 4,500
  rows, 11,250 pairs. A process holds the rows' pair offsets and an epoch's pair order; at
  1,000 training queries/s a GPU, a pair (two encoder passes) takes 1/500 s of a GPU, and the
  batch splits over the 8 GPUs when they divide it."""
  c = small_config(labels=1000, model=4)
  assert plan.plan_config(c, "v100-32gb", mesh="2x4").warm_start is None
  c.warmstart.epochs, c.warmstart.batch_size = 3, 64
  c.data.validation_fraction = 0.1
  p = plan.plan_config(c, "v100-32gb", mesh="2x4", train_queries_per_s=1000.0)
  w = p.warm_start
  assert (w.pairs, w.pairs_per_epoch, w.gpus) == (11_250, 11_250, 8)
  assert [i.bytes for i in w.items] == [4501 * 8, 11_250 * 8]
  assert w.epoch_s == pytest.approx(11_250 / (500 * 8)) and not w.estimated
  assert "11,250 (query, label) pairs" in plan.format_plan(p)
  c.warmstart.pairs_per_epoch, c.warmstart.batch_size = 2_000, 60  # 8 do not divide 60
  w = plan.plan_config(c, "v100-32gb", mesh="2x4", train_queries_per_s=1000.0).warm_start
  assert (w.pairs_per_epoch, w.gpus) == (2_000, 1)
  assert [i.bytes for i in w.items] == [4501 * 8, 2_000 * 8]
  assert w.epoch_s == pytest.approx(2_000 / 500)
