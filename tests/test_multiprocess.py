"""Four local CPU processes (jax.distributed over gloo, one device each, a 2 x 2 mesh)
train exactly like one process with the same 4 devices: the same batches, per-host token
reads, per-host mining of each host's W shard for its data group's queries only, the same
metrics (the final ones with the neighbour vote and the lexical terms, each process voting
for its own rows)."""

import json
import os
import socket
import subprocess

import numpy as np
import pytest
from child_env import REPO as ROOT, cpu_child_env, main_command

pytestmark = pytest.mark.slow


def _overrides(data_dir):
  return [
    f"--config.data.dir={data_dir}",
    "--config.data.synthetic.num_labels=300",
    "--config.data.synthetic.num_train=1500",
    "--config.data.synthetic.num_test=300",
    # Few large steps: over gloo on these 2 cores a step's cross-process all-reduce of
    # the encoder gradients takes ~1 s whatever the batch (8 steps per epoch here).
    "--config.train.epochs=3",
    "--config.train.batch_size=256",
    "--config.train.profile_steps=0",
    "--config.optim.warmup_steps=4",
    "--config.negatives.tau_s=2",
    "--config.negatives.tau_r=1",
    "--config.negatives.k_h=4",
    "--config.negatives.k_r=32",
    "--config.negatives.index.kind=exact",
    "--config.mesh.data=2",
    "--config.mesh.model=2",
    # The score votes too, its weight chosen on a validation split: each process votes for
    # the validation and test rows its devices rank, the validation rows' votes kept for
    # every candidate weight.
    "--config.data.validation_fraction=0.2",
    "--config.scoring.neighbour_weight_choices=(0.0,0.5,1.0)",
    # And the lexical terms after it: each process takes every row's terms and sets beside
    # its memory's votes those of the rows it ranks (g is 0.3 whatever is chosen, so the
    # test split is ranked with them too).
    "--config.scoring.lexical_label_text_weight_choices=(0.3,)",
    "--config.scoring.lexical_neighbour_weight_choices=(0.0,0.5)",
    # A warm start first, each step's 64 pairs split over the four devices (one process
    # with four, or four processes with one each): the classifier stage starts from the
    # same encoder in both.
    "--config.warmstart.epochs=1",
    "--config.warmstart.batch_size=64",
  ]


def _main(workdir, data_dir):
  return main_command("--config=experiments/demo.py", f"--workdir={workdir}", *_overrides(data_dir))


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r["loss"] for r in map(json.loads, f) if r["kind"] == "train"]


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


NUM_PROCESSES = 4


def _group(cmd):
  port = _free_port()
  return [
    (
      cmd,
      cpu_child_env(
        1,
        JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
        JAX_NUM_PROCESSES=str(NUM_PROCESSES),
        JAX_PROCESS_ID=str(i),
      ),
    )
    for i in range(NUM_PROCESSES)
  ]


def test_four_processes_train_like_one(tmp_path):
  # The one-process reference runs beside the group (its own copy of the same seeded data).
  runs = [(_main(tmp_path / "one", tmp_path / "data_one"), cpu_child_env(4))]
  runs += _group(_main(tmp_path / "two", tmp_path / "data_two"))
  procs = [
    subprocess.Popen(
      cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for cmd, env in runs
  ]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]

  a = json.load(open(tmp_path / "one" / "results.json"))
  b = json.load(open(tmp_path / "two" / "results.json"))
  assert b["num_processes"] == 4 and b["mesh"] == {"data": 2, "model": 2}
  assert all(x["ok"] for x in b["negatives"]["refreshes"]) and b["negatives"]["refreshes"]
  # Same computation; only the order of cross-process sums may differ.
  np.testing.assert_allclose(_losses(tmp_path / "two"), _losses(tmp_path / "one"), rtol=1e-3)
  for k in ("P@1", "P@5"):
    assert abs(a[k] - b[k]) <= 0.5, (k, a[k], b[k])
  candidates = [
    {x["neighbour_weight"]: x["P@1"] for x in r["score_choice"]["neighbour_candidates"]}
    for r in (a, b)
  ]
  assert candidates[0].keys() == candidates[1].keys() == {0.0, 0.5, 1.0}
  for w, p1 in candidates[0].items():
    assert abs(p1 - candidates[1][w]) <= 0.5, (w, candidates)
  lexical = [
    {(x["lexical_label_text_weight"], x["lexical_neighbour_weight"]): x["P@1"] for x in pairs}
    for pairs in (r["score_choice"]["lexical_pairs"] for r in (a, b))
  ]
  assert list(lexical[0]) == list(lexical[1]) == [(0.3, 0.0), (0.3, 0.5)]
  assert os.path.isdir(tmp_path / "two" / "model" / "lexical")
  for pair, p1 in lexical[0].items():
    assert abs(p1 - lexical[1][pair]) <= 0.5, (pair, lexical)
  # The vote's memory was split over the four processes' devices; each wrote its own rows
  # of the exported keys: the one process's keys, every row written (unit norm).
  keys = [np.load(tmp_path / run / "model" / "vote_memory_keys.npy") for run in ("one", "two")]
  assert keys[1].shape == (1500, 64)
  np.testing.assert_allclose(np.linalg.norm(keys[1], axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(keys[1], keys[0], atol=1e-4)
  # Each process mined only its own W shard (labels [0, 150) or [150, 300)) for its own
  # data group's training rows ([0, 750) or [750, 1500) of the 1,500: the 1,200 left by the
  # validation split, then the 300 label texts): the same negatives as the one process mined
  # there, and the four cover all of it.
  ref = np.load(tmp_path / "one" / "negatives" / "hard_epoch2.npy")
  assert ref.shape == (1500, 2 * 4)
  covered = set()
  for i in range(NUM_PROCESSES):
    hard = np.load(tmp_path / "two" / f"process{i}" / "negatives" / "hard_epoch2.npy")
    assert hard.shape == (750, 4)
    shard = int(hard.min() >= 150)
    assert hard.min() >= 150 * shard and hard.max() < 150 * (shard + 1)
    columns = ref[:, 4 * shard : 4 * (shard + 1)]
    group = [g for g in (0, 1) if np.array_equal(hard, columns[750 * g : 750 * (g + 1)])]
    assert len(group) == 1, i
    covered.add((group[0], shard))
  assert covered == {(0, 0), (0, 1), (1, 0), (1, 1)}

  # The same workdir with another config: every process stops with process 0's one line
  # (not one of them at a collective's timeout).
  procs = [
    subprocess.Popen(
      cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for cmd, env in _group(
      _main(tmp_path / "two", tmp_path / "data_two") + ["--config.negatives.k_r=16"]
    )
  ]
  for p in procs:
    err = p.communicate(timeout=120)[1]
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert p.returncode == 1 and len(lines) == 1 and "negatives.k_r: 32 -> 16" in lines[0], err


def test_four_processes_vote_from_their_shares_of_the_memory(tmp_path):
  """Four processes, each holding a quarter of the vote's memory on its host
  (ann/process_memory.py) or on its device (ann/mesh_memory.py): each one's votes for its
  rows of a query block are those of one dense search over all rows, and the keys they
  export are every unit row in order (tests/vote_memory_process.py)."""
  import sys

  from vote_memory_problem import problem, unit
  from vote_memory_process import QUERIES, VOTE

  from astra_jax.ann.vote_memory import Memory

  script = os.path.join(ROOT, "tests", "vote_memory_process.py")
  procs = [
    subprocess.Popen(
      [sys.executable, script, str(tmp_path)],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for _, env in _group([])
  ]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]

  _, _, labels, keys, rng = problem(seed=4, num_labels=12)
  queries = rng.normal(size=(QUERIES, 8)).astype(np.float32)
  dense = {
    rows: Memory(unit(keys[:rows]).astype(np.float32), labels.head(rows)).votes(queries, VOTE)
    for rows in (48, 37)
  }
  flipped = Memory(unit(keys).astype(np.float32), labels).votes(queries[::-1], VOTE)
  positions, host_rows = [], []
  for i in range(NUM_PROCESSES):
    got = np.load(tmp_path / f"process{i}.npz")
    positions.append(got["positions"])
    host_rows.append(got["host_rows"])
    for layout in ("hosts", "devices"):
      cases = (("all", dense[48]), ("head", dense[37]), ("pair0", dense[48]), ("pair1", flipped))
      for name, want in cases:
        mine = got["positions"]
        np.testing.assert_array_equal(got[f"{layout}_{name}_ids"], want.ids[mine])
        np.testing.assert_allclose(got[f"{layout}_{name}_values"], want.values[mine], atol=1e-5)
  # Each process ranked a quarter of the queries and held a quarter of the rows.
  assert sorted(np.concatenate(positions).tolist()) == list(range(QUERIES))
  assert sorted(np.concatenate(host_rows).tolist()) == list(range(48))
  assert max(len(r) for r in host_rows) <= 48 // 4 + 2
  for layout in ("hosts", "devices"):
    np.testing.assert_allclose(np.load(tmp_path / f"keys_{layout}.npy"), unit(keys), atol=1e-6)
