"""The reproduction tool: registry, tabulation from hand-made results, reuse, CLI errors."""

import json
import os
import subprocess
import sys

import pytest

from astra_jax import reproduce
from astra_jax.reproduce import runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _hand_made_results_are_current(request, monkeypatch):
  """The tabulation tests' results are written by hand, without the config or code
  fingerprint a real run records; the staleness tests check that part."""
  if "stale" not in request.node.name:
    monkeypatch.setattr(runs, "stale", lambda run, cached: "")


def _write(root, name, result, group=""):
  d = os.path.join(root, group, name.replace("+", "_"))
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(result, f)


def test_registry_covers_the_named_tables():
  for name in (
    "rq3",
    "rq3_paper_refreshes",
    "timebreakup",
    "memory",
    "tau_s_ablation",
    "tau_r_ablation",
    "ratio_ablation",
    "ttvsperf",
    "motivation",
  ):
    assert name in reproduce.TABLES
  labels = {t.paper_label for t in reproduce.TABLES.values()}
  assert {
    "tab:rq3",
    "tab:timebreakup",
    "tab:memory",
    "tab:tau_s_ablation",
    "tab:tau_r_ablation",
    "tab:ratio_ablation",
    "fig:ttvsperf",
    "fig:motivation",
  } <= labels


def test_ablation_runs_differ_only_in_strategy():
  runs = reproduce.ablation_runs(0.01, 3)
  assert [r.name for r in runs] == list(reproduce.ABLATION)
  rest = {tuple(kv for kv in r.overrides if kv[0] != "negatives.strategy") for r in runs}
  assert len(rest) == 1 and len({r.variant for r in runs}) == 1
  configs = [r.config() for r in runs[:2]]
  for c in configs:
    assert c.train.epochs == 3 and c.train.seed == 0
  # same total negatives per query
  assert len({c.negatives.k_h + c.negatives.k_r for c in configs}) == 1


def test_paper_refreshes_runs_change_only_the_refresh_schedule():
  """The paper refreshes 14 times in 75 epochs (τ = 5); 15 stand-in epochs need τ = 1, 30
  need 2. Everything else is the ablation's run, in its own directory."""
  assert reproduce.paper_refreshes_tau(15) == 1 and reproduce.paper_refreshes_tau(30) == 2
  runs, base = reproduce.paper_refreshes_runs(0.01, 15, 2), reproduce.ablation_runs(0.01, 15, 2)
  assert [r.key for r in runs] == [r.key for r in base]
  for r, b in zip(runs, base):
    extra = set(r.overrides) - set(b.overrides)
    assert extra == {("negatives.tau_s", 1), ("negatives.tau_r", 1)}
    assert reproduce.run_dir("wd", r) != reproduce.run_dir("wd", b)
  c = runs[-1].config()
  assert (c.negatives.tau_s, c.negatives.tau_r, c.train.epochs) == (1, 1, 15)


def test_full_label_ttvsperf_runs_the_three_methods_at_131k_labels():
  """ASTRA, full-L and random on the full-label stand-in: the same data and schedule, the
  paper's refreshes scaled to the epochs (τ = 1 at 10), the dataset's 131,073 labels."""
  runs_ = runs.full_label_plot_runs(10)
  assert [r.name for r in runs_] == ["random+w_hard", "full", "random"]
  rest = {tuple(kv for kv in r.overrides if kv[0] != "negatives.strategy") for r in runs_}
  assert len(rest) == 1 and len({r.variant for r in runs_}) == 1
  c = runs_[0].config()
  assert c.data.synthetic.num_labels == 131_073 and c.data.num_train == 100_000
  assert (c.negatives.tau_s, c.negatives.tau_r, c.train.epochs) == (1, 1, 10)
  assert c.encoder.arch == "ngram_bag" and c.train.eval_every_epochs == 1
  assert reproduce.TABLES["ttvsperf_full_labels"].paper_label == "fig:ttvsperf"


def test_rq3_tabulation_from_fake_results(tmp_path):
  root = str(tmp_path / "wd")
  for i, s in enumerate(reproduce.ABLATION):
    ev = [{"P@1": float(e)} for e in range(1, 7)]  # last 5: 2..6, mean 4
    _write(
      root,
      s,
      {
        "P@1": 10.0 + i,
        "P@5": 5.125 + i,
        "train_time_s": 100.4 + i,
        "evaluations": ev if s == "random" else ev[:3],
      },
      "scale0.01_epochs3",
    )
  md = reproduce.reproduce("rq3", root, str(tmp_path / "out"), 0.01, 3, log=lambda m: None)
  # ASTRA is the 7th strategy: P@1 10 + 6, P@5 5.125 + 6, 106.4 s.
  assert "| random+w_hard | 46.20 | 21.95 | 16.00 | 11.12 |  | 106 | 16.00 |  |" in md
  assert "| random | 44.57 | 21.83 | 10.00 | 5.12 | 4.00 | 100 | 10.00 | +6.00 |" in md
  assert "| curriculum+e_hard | 45.84 | 21.75 | 13.00 | 8.12 |  | 103 | 13.00 | +3.00 |" in md
  assert "ASTRA (random+w_hard) ranks 1 of 7 by final P@1 here (the paper" in md
  assert "ASTRA minus random, final P@1: +6.00." in md
  with open(tmp_path / "out" / "rq3.csv") as f:
    lines = f.read().splitlines()
  assert lines[0] == (
    "strategy,paper P@1,paper P@5,ours P@1,ours P@5,"
    '"ours P@1, mean of last 5 epochs",ours train s,ours P@1 per seed,'
    '"ASTRA minus this, P@1 (mean ± s.e. over seeds)"'
  )
  assert lines[2] == "e_hard,41.98,19.07,11.00,6.12,,101,11.00,+5.00"
  assert len(lines) == 1 + len(reproduce.ABLATION)


def test_rq3_averages_training_seeds(tmp_path):
  runs = reproduce.ablation_runs(0.01, 3, seeds=2)
  assert len(runs) == 2 * len(reproduce.ABLATION)
  assert {r.config().train.seed for r in runs} == {0, 1}
  root = str(tmp_path / "wd")
  # random: 30, 20 (mean 25); ASTRA: 24, 28 (mean 26); curriculum: 40, 0 (mean 20);
  # w_hard: 27, 27 (mean 27, first); the rest lower.
  p1 = {
    "random": (30, 20),
    "random+w_hard": (24, 28),
    "curriculum": (40, 0),
    "w_hard": (27, 27),
    "e_hard": (1, 1),
    "random+e_hard": (5, 5),
    "curriculum+e_hard": (3, 3),
  }
  for r in runs:
    _write(
      root,
      r.name,
      {"P@1": float(p1[r.name][r.seed]), "P@5": 1.0, "train_time_s": 10.0},
      os.path.join(r.group, f"seed{r.seed}" if r.seed else ""),
    )
  md = reproduce.reproduce("rq3", root, str(tmp_path / "out"), 0.01, 3, log=lambda m: None, seeds=2)
  assert "| random+w_hard | 46.20 | 21.95 | 26.00 | 1.00 |  | 10 | 24.00 / 28.00 |  |" in md
  assert "| curriculum | 45.83 | 21.58 | 20.00 |" in md
  # paired differences ASTRA - this: random -6, +8; curriculum -16, +28; w_hard -3, +1
  # -> means +1, +6, -1; standard errors |d1 - d2| / 2 = 7, 22, 2
  assert "| 30.00 / 20.00 | +1.00 ± 7.00 |" in md
  assert "| 40.00 / 0.00 | +6.00 ± 22.00 |" in md
  assert "| 27.00 / 27.00 | -1.00 ± 2.00 |" in md
  assert "ranks 2 of 7 by final P@1 here, means over 2 training seeds (the paper" in md
  assert "ASTRA minus random, final P@1, per seed: -6.00 / +8.00." in md


def test_memory_and_timebreakup_from_fake_bench(tmp_path):
  root = str(tmp_path / "wd")
  mib = 2**20
  for L in reproduce.BENCH_LABELS:
    _write(
      root,
      f"bench_full_L{L}",
      {
        "clf_forward_ms": 10.0,
        "loss_ms": None,
        "backward_update_ms": 20.0,
        "step_ms": 30.0,
        "temp_bytes": 8 * mib,
        "dense_scores_temp_bytes": 64 * mib,
      },
    )
    _write(
      root,
      f"bench_astra_L{L}",
      {
        "clf_forward_ms": 1.0,
        "loss_ms": 0.5,
        "backward_update_ms": 2.0 if L < 10**6 else None,
        "step_ms": 3.5,
        "temp_bytes": 4 * mib,
      },
    )
  md = reproduce.reproduce("memory", root, str(tmp_path / "out"), 0.01, 3, log=lambda m: None)
  assert "| 10,000 | 64.00 | 8.00 | 4.00 | 16.0x |" in md
  assert "| LF-AmazonTitles-1.3M (L=1,305,265) | 2549.35 |  | 3.81 | 668.7x |" in md
  md = reproduce.reproduce("timebreakup", root, str(tmp_path / "out"), 0.01, 3, log=lambda m: None)
  # ours: 3 x (full, astra), then the paper's (Renee, ASTRA) for three datasets
  # paper 4-6: LFAT-131K Renee 0.6 + 20.4, ASTRA 1.3 + 0.3 + 21.9; LFAT-1.3M 5.4 + 39.6,
  # 1.4 + 0.3 + 31.6; SS-20M 76.8 + 183.3, 1.6 + 0.3 + 32.2
  assert (
    "| 4-6 together | 30.00 | 3.50 | 30.00 | 3.50 | 30.00 | 3.50 | 21.0 | 23.5 | 45.0 | "
    "33.3 | 260.1 | 34.1 |"
  ) in md
  assert "| 5. loss | fused in 4 | 0.50 |" in md
  assert (
    "| 6. backward + update | 20.00 | 2.00 | 20.00 | 2.00 | 20.00 | n/a (4 + 5 apart > 4-6) |" in md
  )
  assert "| 5. loss |" in md and "| N/A | 0.3 |" in md


def test_finished_runs_are_reused_not_rerun(tmp_path, monkeypatch):
  root = str(tmp_path)
  run = reproduce.Run("random", "unused.py")
  _write(root, "random", {"P@1": 1.0})

  def boom(self, workdir):
    raise AssertionError("a finished run was executed again")

  monkeypatch.setattr(reproduce.Run, "execute", boom)
  assert reproduce.load_or_run(run, root, log=lambda m: None) == {"P@1": 1.0}


def test_stale_results_are_run_again(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(
    reproduce.Run, "execute", lambda self, wd: calls.append(self.name) or {"fresh": True}
  )
  run = reproduce.ablation_runs(0.01, 3)[0]
  config = json.loads(run.config().to_json())
  _write(str(tmp_path), run.name, {"P@1": 1.0, "config": config}, run.group)
  assert reproduce.load_or_run(run, str(tmp_path), log=lambda m: None)["P@1"] == 1.0
  config["negatives"]["k_r"] += 1  # made with another config
  _write(str(tmp_path), run.name, {"P@1": 1.0, "config": config}, run.group)
  logs = []
  assert reproduce.load_or_run(run, str(tmp_path), log=logs.append) == {"fresh": True}
  assert "its config differs in negatives.k_r" in logs[0]
  config["negatives"]["k_r"] -= 1
  del config["data"]["synthetic"]["generator"]  # trained on the first generator's data
  _write(str(tmp_path), run.name, {"P@1": 1.0, "config": config}, run.group)
  ckpt = os.path.join(reproduce.run_dir(str(tmp_path), run), "checkpoints", "3")
  os.makedirs(ckpt)  # the older run's checkpoint: must not be resumed
  logs = []
  assert reproduce.load_or_run(run, str(tmp_path), log=logs.append) == {"fresh": True}
  assert "differs in data.synthetic.generator" in logs[0] and not os.path.exists(ckpt)
  from astra_jax.reproduce import classifier_bench

  bench = reproduce.Run("bench_astra_L10", bench=("astra", 10))
  _write(str(tmp_path), bench.name, {"step_ms": 1.0, "code": classifier_bench.code_fingerprint()})
  assert reproduce.load_or_run(bench, str(tmp_path), log=lambda m: None) == {
    "step_ms": 1.0,
    "code": classifier_bench.code_fingerprint(),
  }
  _write(str(tmp_path), bench.name, {"step_ms": 1.0, "code": "older"})
  assert reproduce.load_or_run(bench, str(tmp_path), log=lambda m: None) == {"fresh": True}
  assert calls == [run.name, run.name, bench.name]


def test_other_scale_or_epochs_never_reuse_a_run():
  a = reproduce.ablation_runs(0.01, 3)[0]
  others = [reproduce.ablation_runs(0.02, 3)[0], reproduce.ablation_runs(0.01, 4)[0]]
  dirs = {reproduce.run_dir("w", r) for r in [a] + others}
  assert len(dirs) == 3 and reproduce.run_dir("w", a) == os.path.join(
    "w", "scale0.01_epochs3", "random"
  )


def test_unfinished_bench_run_executes_and_writes_results(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(
    reproduce.Run, "execute", lambda self, wd: calls.append(wd) or {"step_ms": 1.0}
  )
  run = reproduce.Run("bench_astra_L10", bench=("astra", 10))
  assert reproduce.load_or_run(run, str(tmp_path), log=lambda m: None) == {"step_ms": 1.0}
  assert reproduce.load_or_run(run, str(tmp_path), log=lambda m: None) == {"step_ms": 1.0}
  assert len(calls) == 1


def _reproduce_cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-m", "astra_jax.reproduce", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_cli_rejects_unknown_table():
  r = _reproduce_cli("--table=nope")
  assert r.returncode == 2
  assert r.stderr.count("\n") == 1 and "unknown table 'nope'" in r.stderr, r.stderr


def test_cli_names_gpu_only_tables():
  r = _reproduce_cli("--table=rq1")
  assert r.returncode == 2 and "needs the real datasets + GPUs" in r.stderr, r.stderr


def _fake_plot_results(root):
  for name, p1 in (("random+w_hard", 30.0), ("full", 40.0), ("random", 20.0)):
    ev = [{"epoch": e, "train_time_s": 10.0 * e, "P@1": p1 + e} for e in (1, 2)]
    _write(root, name, {"evaluations": ev}, "scale0.01_epochs2")


def test_ttvsperf_plot_and_index(tmp_path):
  pytest.importorskip("matplotlib")
  root, out = str(tmp_path / "wd"), str(tmp_path / "docs" / "results")
  _fake_plot_results(root)
  md = reproduce.reproduce("ttvsperf", root, out, 0.01, 2, log=lambda m: None)
  assert os.path.getsize(os.path.join(out, "ttvsperf.png")) > 1000
  assert "| full | 2 | 20.0 | 42.00 |" in md and "![ttvsperf](ttvsperf.png)" in md
  path = reproduce.write_index(out, [md], 0.01, 2, seeds=4)
  assert path == out + ".md"
  text = open(path).read()
  assert "![ttvsperf](results/ttvsperf.png)" in text
  assert f"--scale=0.01 \\\n    --epochs=2 --seeds=4 --out={out}" in text


def test_tau_tables_share_the_default_run_and_tabulate(tmp_path):
  s_runs = reproduce.tau_runs("tau_s", 0.01, 3)
  r_runs = reproduce.tau_runs("tau_r", 0.01, 3)
  assert s_runs[0] == r_runs[0]  # tau_s = tau_r = 5 is the config's default
  assert s_runs[0].config().negatives.tau_s == 5 and s_runs[2].config().negatives.tau_s == 20
  root = str(tmp_path / "wd")
  for run, p1 in zip(s_runs, (3.0, 2.0, 1.0)):
    _write(root, run.name, {"P@1": p1, "P@5": p1 / 2}, run.group)
  md = reproduce.reproduce(
    "tau_s_ablation", root, str(tmp_path / "out"), 0.01, 3, log=lambda m: None
  )
  assert "| 5 | 47.13 | 22.35 | 3.00 | 1.50 |" in md
  assert "| 20 | 46.24 | 21.97 | 1.00 | 0.50 |" in md


def test_real_ablation_runs_share_each_seeds_warm_start(tmp_path):
  table_runs = reproduce.real_ablation_runs(str(tmp_path / "debian"), seeds=2)
  assert [r.name for r in table_runs[:8]] == [
    "random+w_hard",
    *(s for s in reproduce.ABLATION if s != "random+w_hard"),
    "full",
  ]
  assert len(table_runs) == 16 and {r.seed for r in table_runs} == {0, 1}
  # Only the strategy and the seed differ; ASTRA trains the warm start the others copy.
  rest = {
    tuple(kv for kv in r.overrides if kv[0] not in ("negatives.strategy", "train.seed"))
    for r in table_runs
  }
  assert len(rest) == 1 and dict(next(iter(rest)))["data.dir"] == str(tmp_path / "debian")
  assert [r.warmstart_from for r in table_runs[:2]] == ["", "random+w_hard"]
  c = table_runs[1].config()
  assert c.warmstart.epochs > 0 and c.eval.classifier_alone and c.train.eval_every_epochs == 1
  root = str(tmp_path / "wd")
  donor = os.path.join(reproduce.run_dir(root, table_runs[8]), "warmstart", "20")
  os.makedirs(donor)  # seed 1's finished stage
  with open(os.path.join(donor, "params"), "w") as f:
    f.write("seed 1")
  logs = []
  for r in (table_runs[9], table_runs[1]):  # seed 1's random: copied; seed 0's: its donor has none
    wd = reproduce.run_dir(root, r)
    os.makedirs(wd)
    runs.share_warmstart(r, root, wd, logs.append)
  seed1 = os.path.join(reproduce.run_dir(root, table_runs[9]), "warmstart", "20", "params")
  assert open(seed1).read() == "seed 1"
  assert not os.path.exists(os.path.join(reproduce.run_dir(root, table_runs[1]), "warmstart"))
  assert len(logs) == 1 and "random+w_hard's warm start" in logs[0]


def test_rq3_real_tabulates_fused_and_w_alone_per_seed(tmp_path):
  data = str(tmp_path / "debian")
  table_runs = reproduce.real_ablation_runs(data, seeds=2)
  root = str(tmp_path / "wd")
  # P@1 by seed; W alone 10 below, except full's.
  p1 = dict.fromkeys(reproduce.REAL_ABLATION, (20.0, 22.0))
  p1["random+w_hard"] = (30.0, 34.0)
  p1["random"] = (25.0, 27.0)
  for r in table_runs:
    v = p1[r.name][r.seed]
    alone = v - 10 if r.name != "full" else v
    result = {"P@1": v, "P@5": 1.0, "W-alone P@1": alone, "W-alone P@5": 0.5}
    _write(
      root,
      r.name,
      {**result, "train_time_s": 60.0},
      os.path.join(r.group, f"seed{r.seed}" if r.seed else ""),
    )
  md = reproduce.reproduce(
    "rq3_real", root, str(tmp_path / "out"), 0.01, 3, log=lambda m: None, seeds=2, data_dir=data
  )
  # ASTRA 30 / 34, random 25 / 27: +5, +7 -> +6.00 ± 1.00 by both scores.
  assert (
    "| random+w_hard | 46.20 | 32.00 | 1.00 | 22.00 | 0.50 |  | 60 | 30.00 / 34.00 |  |  |" in md
  )
  assert (
    "| random | 44.57 | 26.00 | 1.00 | 16.00 | 0.50 |  | 60 | 25.00 / 27.00 | +6.00 ± 1.00 | +6.00 ± 1.00 |"
    in md
  )
  # full-L: no paper column; ASTRA 30 / 34 minus 20 / 22 fused, minus 20 / 22 alone.
  assert (
    "| full |  | 21.00 | 1.00 | 21.00 | 0.50 |  | 60 | 20.00 / 22.00 | +11.00 ± 1.00 | +1.00 ± 1.00 |"
    in md
  )
  assert "by the fused score ASTRA ranks 1 of 7 sampled strategies (means over 2 seeds)" in md
  assert "ASTRA minus random per seed +5.00 / +7.00" in md


def test_cli_rq3_real_needs_a_dataset():
  r = _reproduce_cli("--table=rq3_real")
  assert r.returncode == 2 and "give --data=DIR" in r.stderr, r.stderr


@pytest.mark.parametrize("copied_warmstart", [False, True])
def test_finished_training_run_keeps_results_and_model_not_checkpoints(
  tmp_path, monkeypatch, copied_warmstart
):
  def train(self, wd):
    for sub in ("checkpoints/10", "warmstart/20", "model"):
      os.makedirs(os.path.join(wd, sub))
    _write(wd, "", {"P@1": 1.0})
    return {"P@1": 1.0}

  monkeypatch.setattr(reproduce.Run, "execute", train)
  run = reproduce.Run("random", "unused.py", warmstart_from="random+w_hard" * copied_warmstart)
  assert reproduce.load_or_run(run, str(tmp_path), log=lambda m: None) == {"P@1": 1.0}
  left = sorted(os.listdir(reproduce.run_dir(str(tmp_path), run)))
  # A run that trained its own warm start keeps it: the seed's other runs copy it.
  assert left == ["model", "results.json"] + ([] if copied_warmstart else ["warmstart"])
