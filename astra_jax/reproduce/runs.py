"""The runs behind the reproduced tables: each training run (a stand-in config, variant and
overrides) or classifier benchmark as a `Run`, where its results live, and reusing a
finished run's results.json or running it.

The training, config and benchmark modules are imported inside the functions that run or
compare a Run, not at the top: the tables' scheduler (parallel.py) and the command's
--help then start without jax, and only a process that runs a Run loads it. The layering
test counts these imports like any other (tests/test_layout.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable

from astra_jax.reproduce.paper import PAPER_RATIO

STAND_IN = "experiments/lf_amazontitles_131k.py"
TAU_STAND_IN = "experiments/lf_amazon_131k.py"
BENCH_LABELS = (10_000, 100_000, 1_000_000)
ABLATION = (
  "random",
  "e_hard",
  "random+e_hard",
  "curriculum+e_hard",
  "w_hard",
  "curriculum",
  "random+w_hard",
)


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run (config file + variant + overrides) or one classifier benchmark."""

  name: str
  config_file: str = ""
  variant: str = ""
  overrides: tuple[tuple[str, object], ...] = ()
  bench: tuple[str, int] | None = None  # (method, L)
  group: str = ""  # sub-directory: runs at another scale or epoch count never collide
  # A run of the same group and seed whose finished warm-start stage (WORKDIR/warmstart)
  # this one starts from instead of training its own: the stage reads neither the strategy
  # nor anything else the runs differ in, so the copy is what it would compute.
  warmstart_from: str = ""

  @property
  def seed(self) -> int:
    """train.seed from the overrides; runs with seeds > 0 live in group/seedN/."""
    return int(dict(self.overrides).get("train.seed", 0))

  @property
  def key(self) -> str:
    """The run's name in a table's results: NAME for seed 0, NAME#seedN otherwise."""
    return self.name if self.seed == 0 else f"{self.name}#seed{self.seed}"

  def at(self, root: str) -> Run:
    """The run with WORKDIR_PLACEHOLDER in its override values replaced by the table's
    workdir root (runs that read another run's output name it through the placeholder)."""
    sub = lambda v: v.replace(WORKDIR_PLACEHOLDER, root) if isinstance(v, str) else v
    return dataclasses.replace(self, overrides=tuple((k, sub(v)) for k, v in self.overrides))

  def execute(self, workdir: str) -> dict:
    if self.bench is not None:
      from astra_jax.reproduce import classifier_bench

      return classifier_bench.measure(*self.bench)
    from astra_jax.training import train

    return train.train_and_evaluate(self.config(), workdir)

  def config(self):
    from astra_jax.config import base as config_base

    c = config_base.load_config(self.config_file, self.variant or None)
    return config_base.with_overrides(c, dict(self.overrides))


WORKDIR_PLACEHOLDER = "{workdir}"


def run_dir(root: str, run: Run) -> str:
  return os.path.join(
    root, run.group, f"seed{run.seed}" if run.seed else "", run.name.replace("+", "_")
  )


def stand_in_group(scale: float, epochs: int) -> str:
  return f"scale{scale:g}_epochs{epochs}"


def stale(run: Run, cached: dict) -> str:
  """Why a cached result does not answer `run` now ("" if it does): a training run made
  with another config (the config records the synthetic generator's version; other code
  changes are not detected: delete the run to re-measure), or a benchmark made by other
  classifier-step code."""
  if run.bench is not None:
    from astra_jax.reproduce import classifier_bench

    same = cached.get("code") == classifier_bench.code_fingerprint()
    return "" if same else "measured with other classifier-step code"
  from astra_jax.training import run_config

  # data.tokenizer_dir is filled in when the run starts
  diff = [
    k
    for k, _, _ in run_config.config_diff(
      cached.get("config", {}), json.loads(run.config().to_json())
    )
    if k != "data.tokenizer_dir"
  ]
  return f"its config differs in {', '.join(diff[:5])}" if diff else ""


def load_or_run(run: Run, root: str, log: Callable[[str], None] = print) -> dict:
  """results.json of a finished run with this run's config (and, for benchmarks, code),
  else runs it (and writes results.json)."""
  wd = run_dir(root, run)
  path = os.path.join(wd, "results.json")
  if os.path.exists(path):
    with open(path) as f:
      cached = json.load(f)
    why = stale(run, cached)
    if not why:
      log(f"{run.name}: reusing {path}")
      return cached
    # The workdir's checkpoints belong to that other run: resuming from them (or refusing
    # the changed config) would not answer this one.
    log(f"{run.name}: {path} is stale ({why}); removing {wd} and running again")
    shutil.rmtree(wd)
  log(f"{run.name}: running in {wd}")
  os.makedirs(wd, exist_ok=True)
  share_warmstart(run, root, wd, log)
  result = run.execute(wd)
  if run.bench is None:  # the trainer wrote its own results.json
    discard_training_state(run, wd, log)
  else:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(result, f, indent=1)
    os.replace(tmp, path)
  return result


def share_warmstart(run: Run, root: str, wd: str, log: Callable[[str], None] = print) -> None:
  """Copies `run.warmstart_from`'s WORKDIR/warmstart into `wd` (the warm start restores a
  finished stage, or resumes an unfinished one) unless `wd` has its own or there is none."""
  if not run.warmstart_from:
    return
  donor_run = dataclasses.replace(run, name=run.warmstart_from)
  donor = os.path.join(run_dir(root, donor_run), "warmstart")
  mine = os.path.join(wd, "warmstart")
  if os.path.isdir(donor) and not os.path.exists(mine):
    log(f"{run.name}: starting from {run.warmstart_from}'s warm start ({donor})")
    shutil.copytree(donor, mine)


def discard_training_state(run: Run, wd: str, log: Callable[[str], None] = print) -> None:
  """Removes a finished run's training checkpoints (and a warm start copied from another
  run): they serve only resuming, which a run with results.json never does, and a table's
  runs would otherwise keep them all (gigabytes a run: docs/results/paper_tables.md). Its
  results, metrics and exported model stay."""
  gone = [os.path.join(wd, "checkpoints")]
  if run.warmstart_from:
    gone.append(os.path.join(wd, "warmstart"))
  for path in gone:
    if os.path.isdir(path):
      shutil.rmtree(path)
  log(f"{run.name}: finished; removed its training checkpoints")


def _train_overrides(epochs: int, **extra) -> tuple:
  # Same data for every run and seed 0 unless given; per-epoch evaluations feed the
  # P@1-vs-time plot.
  base = {
    "train.epochs": epochs,
    "train.batch_size": 128,
    "train.grad_accum_steps": 1,
    "train.eval_every_epochs": 1,
    "train.seed": 0,
  }
  return tuple(sorted({**base, **extra}.items()))


def ablation_runs(scale: float, epochs: int, seeds: int = 1) -> list[Run]:
  """Every strategy with training seeds 0 .. seeds-1 (the data is the same for all)."""
  v = f"synthetic,{scale}"
  return [
    Run(
      s,
      STAND_IN,
      v,
      _train_overrides(epochs, **{"negatives.strategy": s, "train.seed": k}),
      group=stand_in_group(scale, epochs),
    )
    for k in range(seeds)
    for s in ABLATION
  ]


REAL_DATA_CONFIG = "experiments/xc_text.py"
REAL_DATA_VARIANT = "ngram"
# ASTRA first: it trains each seed's warm start, which the other strategies copy.
REAL_ABLATION = ("random+w_hard",) + tuple(s for s in ABLATION if s != "random+w_hard") + ("full",)


def real_ablation_runs(data_dir: str, seeds: int = 1) -> list[Run]:
  """The ablation's strategies and full-L on a real dataset in the XC layout, trained by
  `xc_text.py:ngram` as it is (its epochs, tau_s, tau_r, k_h + k_r negatives per query),
  evaluated after every epoch by the fused score and by W alone, with training seeds
  0 .. seeds-1. The warm start depends only on the seed, so each seed trains it once."""
  data_dir = os.path.abspath(data_dir)
  group = "real_" + os.path.basename(data_dir.rstrip("/"))
  return [
    Run(
      s,
      REAL_DATA_CONFIG,
      REAL_DATA_VARIANT,
      tuple(
        sorted(
          {
            "data.dir": data_dir,
            "negatives.strategy": s,
            "train.seed": k,
            "train.eval_every_epochs": 1,
            "eval.classifier_alone": True,
          }.items()
        )
      ),
      group=group,
      warmstart_from="" if s == REAL_ABLATION[0] else REAL_ABLATION[0],
    )
    for k in range(seeds)
    for s in REAL_ABLATION
  ]


def paper_refreshes_tau(epochs: int) -> int:
  """τ_s = τ_r that gives the stand-in's `epochs` the paper's number of refreshes (it trains
  LF-AmazonTitles-131K for 75 epochs with τ = 5: 14 refreshes)."""
  from astra_jax.config import base as config_base

  paper_epochs = config_base.load_config(STAND_IN).train.epochs
  return max(1, round(5 * epochs / paper_epochs))


def paper_refreshes_runs(scale: float, epochs: int, seeds: int = 1) -> list[Run]:
  """The ablation with τ_s = τ_r = paper_refreshes_tau(epochs) (1 at 15 epochs)."""
  tau = paper_refreshes_tau(epochs)
  taus = {"negatives.tau_s": tau, "negatives.tau_r": tau}
  return [
    Run(
      r.name,
      r.config_file,
      r.variant,
      tuple(sorted({**dict(r.overrides), **taus}.items())),
      group=os.path.join(r.group, f"tau{tau}"),
    )
    for r in ablation_runs(scale, epochs, seeds)
  ]


def plot_runs(scale: float, epochs: int) -> list[Run]:
  by_name = {r.name: r for r in ablation_runs(scale, epochs)}
  full = Run(
    "full",
    STAND_IN,
    f"synthetic,{scale}",
    _train_overrides(epochs, **{"negatives.strategy": "full"}),
    group=stand_in_group(scale, epochs),
  )
  return [by_name["random+w_hard"], full, by_name["random"]]


# Training queries of the full-label-count ttvsperf (`full_label_plot_runs`).
FULL_LABEL_TTVSPERF_QUERIES = 100_000


def full_label_plot_runs(epochs: int, num_train: int = FULL_LABEL_TTVSPERF_QUERIES) -> list[Run]:
  """ASTRA, full-L and random on the stand-in at LF-AmazonTitles-131K's full 131,073 labels
  (`full_labels,num_train`: the hashed n-gram encoder, d = 64, the variant's batch), with
  the paper's number of refreshes scaled to `epochs` as rq3_paper_refreshes does."""
  tau = paper_refreshes_tau(epochs)
  return [
    Run(
      s,
      STAND_IN,
      f"full_labels,{num_train}",
      tuple(
        sorted(
          {
            "train.epochs": epochs,
            "train.eval_every_epochs": 1,
            "train.seed": 0,
            "negatives.strategy": s,
            "negatives.tau_s": tau,
            "negatives.tau_r": tau,
          }.items()
        )
      ),
      group=f"full_labels{num_train}_epochs{epochs}",
    )
    for s in ("random+w_hard", "full", "random")
  ]


def tau_runs(key: str, scale: float, epochs: int) -> list[Run]:
  """The paper's τ values as they are (it trains 100 epochs): a τ_s at or past `epochs`
  leaves no refresh at all (all random), and with τ_s = 5 a τ_r past epochs - 1 refreshes
  once, at τ_s (schedule.py: refreshes at τ_s and at every t >= τ_s with t mod τ_r = 0)."""
  return [
    Run(
      tau_run_name(key, t),
      TAU_STAND_IN,
      f"synthetic,{scale}",
      _train_overrides(epochs, **({} if t == 5 else {f"negatives.{key}": t})),
      group=stand_in_group(scale, epochs),
    )
    for t in (5, 10, 20)
  ]


def tau_run_name(key: str, t: int) -> str:
  # τ_s = τ_r = 5 is the config's own setting: one run serves both tables.
  return "tau_default" if t == 5 else f"{key}_{t}"


def ratio_runs(scale: float, epochs: int) -> list[Run]:
  """The paper's per-GPU k_h:k_r rows, scaled like the stand-in scales 50:400."""
  astra = {r.name: r for r in ablation_runs(scale, epochs)}["random+w_hard"]
  base = astra.config()
  kh0, kr0 = base.negatives.k_h, base.negatives.k_r
  return [
    astra
    if (kh, kr) == (50, 400)
    # the paper's own setting: the ablation's run
    else Run(
      ratio_run_name(kh, kr),
      STAND_IN,
      f"synthetic,{scale}",
      _train_overrides(
        epochs,
        **{
          "negatives.k_h": max(1, round(kh0 * kh / 50)),
          "negatives.k_r": max(1, round(kr0 * kr / 400)),
        },
      ),
      group=stand_in_group(scale, epochs),
    )
    for kh, kr in PAPER_RATIO
  ]


def ratio_run_name(kh: int, kr: int) -> str:
  return "random+w_hard" if (kh, kr) == (50, 400) else f"ratio_{kh}_{kr}"


# fig:motivation: the paper samples 1K labels of LF-AmazonTitles-131K and retrieves the 200
# hardest negatives per query. Our stand-in is MOTIVATION_SCALE_FACTOR x --scale (at 0.01:
# 5,243 labels, so that 1K is a sample, not nearly all of them).
MOTIVATION_LABELS = 1000
MOTIVATION_HARD = 200
MOTIVATION_SCALE_FACTOR = 4
MOTIVATION_TAU_R = 5  # the paper's ASTRA refresh interval
MOTIVATION_DATA_DIR = "data/motivation-stand-in"  # its own: other scales keep theirs
# run name -> (legend, strategy, k_h, k_r)
MOTIVATION_STRATEGIES = {
  "uptodate": ("up-to-date (oracle: 200 hardest, current W)", "uptodate", MOTIVATION_HARD, 0),
  "stale": ("stale (200 hardest, W of the last refresh)", "w_hard", MOTIVATION_HARD, 0),
  "astra": (
    "ASTRA (stale 200 hardest + 200 random)",
    "random+w_hard",
    MOTIVATION_HARD,
    MOTIVATION_HARD,
  ),
  # full-L ignores the sampled negatives (the sampler still draws them)
  "full": ("full-L (Renee)", "full", MOTIVATION_HARD, MOTIVATION_HARD),
}


def motivation_runs(scale: float, epochs: int) -> list[Run]:
  """fig:motivation: a pretraining run on the whole stand-in (its exported encoder starts
  the others), then the up-to-date oracle, the stale strategy, ASTRA and full-L on
  MOTIVATION_LABELS sampled labels and every query with a positive among them. Hard
  negatives from epoch 0 (τ_s = 0: the encoder is already trained), stale ones refreshed
  every MOTIVATION_TAU_R epochs."""
  s = MOTIVATION_SCALE_FACTOR * scale
  group = os.path.join("motivation", stand_in_group(s, epochs))
  v = f"synthetic,{s:g}"
  pretrain = Run(
    "pretrain_all_labels",
    STAND_IN,
    v,
    _train_overrides(epochs, **{"data.dir": MOTIVATION_DATA_DIR, "train.eval_every_epochs": 0}),
    group=group,
  )
  subset = {
    "data.dir": MOTIVATION_DATA_DIR,
    "data.label_subset": MOTIVATION_LABELS,
    "data.label_subset_seed": 0,
    "negatives.tau_s": 0,
    "negatives.tau_r": MOTIVATION_TAU_R,
    "encoder.init_from_workdir": run_dir(WORKDIR_PLACEHOLDER, pretrain),
  }
  return [pretrain] + [
    Run(
      name,
      STAND_IN,
      v,
      _train_overrides(
        epochs,
        **subset,
        **{"negatives.strategy": strategy, "negatives.k_h": k_h, "negatives.k_r": k_r},
      ),
      group=group,
    )
    for name, (_, strategy, k_h, k_r) in MOTIVATION_STRATEGIES.items()
  ]


def bench_runs() -> list[Run]:
  return [Run(f"bench_{m}_L{L}", bench=(m, L)) for L in BENCH_LABELS for m in ("full", "astra")]
