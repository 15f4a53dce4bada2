"""Each table's rows (and figure) from its runs' results: the formatting of the paper's
tables, seeds averaged and paired differences where a table has seeds."""

from __future__ import annotations

from astra_jax.reproduce.paper import (
  PAPER_MEMORY,
  PAPER_RATIO,
  PAPER_RQ3,
  PAPER_TAU_R,
  PAPER_TAU_S,
  PAPER_TIME,
)
from astra_jax.reproduce.runs import (
  ABLATION,
  BENCH_LABELS,
  MOTIVATION_LABELS,
  MOTIVATION_STRATEGIES,
  REAL_ABLATION,
  ratio_run_name,
  tau_run_name,
)


def cell(x, nd: int = 2) -> str:
  """A number as a table cell with `nd` decimals; "" for None."""
  return "" if x is None else f"{x:.{nd}f}"


def last_mean(result: dict, key: str, n: int = 5) -> float | None:
  """Mean of `key` over the last n per-epoch evaluations: less noisy than the final one."""
  ev = result.get("evaluations", [])[-n:]
  return sum(e[key] for e in ev) / len(ev) if len(ev) == n else None


def seed_results(results: dict[str, dict], name: str) -> list[dict]:
  """A run's results for seeds 0, 1, ... (as many as `results` holds)."""
  out = [results[name]]
  while f"{name}#seed{len(out)}" in results:
    out.append(results[f"{name}#seed{len(out)}"])
  return out


def mean_or_none(xs: list) -> float | None:
  return None if not xs or any(x is None for x in xs) else sum(xs) / len(xs)


def paired_difference(xs: list[float], ys: list[float]) -> str:
  """Mean of x_k - y_k over seeds k, with its standard error when there are several seeds.
  Runs with one seed share their initialisation and batch order, which cancel in x_k - y_k."""
  d = [x - y for x, y in zip(xs, ys)]
  mean = sum(d) / len(d)
  if len(d) == 1:
    return f"{mean:+.2f}"
  se = (sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) ** 0.5
  return f"{mean:+.2f} ± {se:.2f}"


def tab_rq3(results: dict[str, dict]) -> list[list[str]]:
  rows = [
    [
      "strategy",
      "paper P@1",
      "paper P@5",
      "ours P@1",
      "ours P@5",
      "ours P@1, mean of last 5 epochs",
      "ours train s",
      "ours P@1 per seed",
      "ASTRA minus this, P@1 (mean ± s.e. over seeds)",
    ]
  ]
  astra = [r["P@1"] for r in seed_results(results, "random+w_hard")]
  for s in ABLATION:
    rs = seed_results(results, s)
    mean = lambda f, rs=rs: mean_or_none([f(r) for r in rs])
    p1, p5 = PAPER_RQ3[s]
    rows.append(
      [
        s,
        cell(p1),
        cell(p5),
        cell(mean(lambda r: r["P@1"])),
        cell(mean(lambda r: r["P@5"])),
        cell(mean(lambda r: last_mean(r, "P@1"))),
        cell(mean(lambda r: r["train_time_s"]), 0),
        " / ".join(cell(r["P@1"]) for r in rs),
        "" if s == "random+w_hard" else paired_difference(astra, [r["P@1"] for r in rs]),
      ]
    )
  return rows


def tab_rq3_real(results: dict[str, dict]) -> list[list[str]]:
  """The ablation on a real dataset: each strategy's final P@1 / P@5 by the config's fused
  score and by W alone (what the strategies change), means over seeds, and the per-seed
  differences to ASTRA by both; the paper's LF-AmazonTitles-131K column for the ordering."""
  rows = [
    [
      "strategy",
      "paper P@1 (LF-AmazonTitles-131K)",
      "ours P@1",
      "ours P@5",
      "ours P@1 by W alone",
      "ours P@5 by W alone",
      "ours P@1, mean of last 5 epochs",
      "ours train s",
      "ours P@1 per seed",
      "ASTRA minus this, P@1 (mean ± s.e. over seeds)",
      "ASTRA minus this, P@1 by W alone",
    ]
  ]
  astra = seed_results(results, REAL_ABLATION[0])
  for s in REAL_ABLATION:
    rs = seed_results(results, s)
    mean = lambda f, rs=rs: mean_or_none([f(r) for r in rs])
    alone = lambda r: r.get("W-alone P@1")
    differ = lambda f, rs=rs, s=s: (
      ""
      if s == REAL_ABLATION[0] or any(f(r) is None for r in astra + rs)
      else paired_difference([f(r) for r in astra], [f(r) for r in rs])
    )
    rows.append(
      [
        s,
        cell(PAPER_RQ3[s][0]) if s in PAPER_RQ3 else "",
        cell(mean(lambda r: r["P@1"])),
        cell(mean(lambda r: r["P@5"])),
        cell(mean(alone)),
        cell(mean(lambda r: r.get("W-alone P@5"))),
        cell(mean(lambda r: last_mean(r, "P@1"))),
        cell(mean(lambda r: r["train_time_s"]), 0),
        " / ".join(cell(r["P@1"]) for r in rs),
        differ(lambda r: r["P@1"]),
        differ(alone),
      ]
    )
  return rows


def tab_tau(results: dict[str, dict], key: str) -> list[list[str]]:
  paper = PAPER_TAU_S if key == "tau_s" else PAPER_TAU_R
  rows = [[key, "paper P@1", "paper P@5", "ours P@1", "ours P@5"]]
  for t, (p1, p5) in paper.items():
    r = results[tau_run_name(key, t)]
    rows.append([str(t), cell(p1), cell(p5), cell(r["P@1"]), cell(r["P@5"])])
  return rows


def tab_ratio(results: dict[str, dict]) -> list[list[str]]:
  rows = [
    ["k_h:k_r (paper, per GPU)", "ours k_h:k_r", "paper P@1", "paper P@5", "ours P@1", "ours P@5"]
  ]
  for (kh, kr), (p1, p5) in PAPER_RATIO.items():
    r = results[ratio_run_name(kh, kr)]
    n = r["config"]["negatives"]
    rows.append(
      [f"{kh}:{kr}", f"{n['k_h']}:{n['k_r']}", cell(p1), cell(p5), cell(r["P@1"]), cell(r["P@5"])]
    )
  return rows


# Ours: 6 = the fused step - 4 - 5 (n/a where 4 and 5, jitted apart, take longer than the
# fused step); "4-6" is the fused step as trained. Paper: 4 + 5 + 6.
_TIME_ROWS = (
  ("clf_forward", "4. classifier forward"),
  ("loss", "5. loss"),
  ("backward_update", "6. backward + update"),
  ("step", "4-6 together"),
)


def tab_timebreakup(results: dict[str, dict]) -> list[list[str]]:
  head = ["row"]
  for L in BENCH_LABELS:
    head += [f"ours full-L, L={L:.0e}", f"ours ASTRA, L={L:.0e}"]
  for ds, _ in PAPER_TIME:
    head += [f"paper Renee, {ds}", f"paper ASTRA, {ds}"]
  rows = [head]
  for key, label in _TIME_ROWS:
    row = [label]
    for L in BENCH_LABELS:
      for m in ("full", "astra"):
        r = results[f"bench_{m}_L{L}"]
        v = r.get(f"{key}_ms")
        if v is not None:
          row.append(cell(v))
        else:
          row.append("fused in 4" if key == "loss" else "n/a (4 + 5 apart > 4-6)")
    for paper in PAPER_TIME.values():
      if key == "step":
        cells = [
          sum(paper[k][i] or 0.0 for k in ("clf_forward", "loss", "backward_update"))
          for i in (0, 1)
        ]
      else:
        cells = paper[key]
      row += ["N/A" if v is None else cell(v, 1) for v in cells]
    rows.append(row)
  return rows


def tab_memory(results: dict[str, dict]) -> list[list[str]]:
  mb = 2.0**20
  rows = [
    [
      "L",
      "ours full-L, dense B x L scores (MB)",
      "ours full-L, label blocks (MB)",
      "ours ASTRA (MB)",
      "reduction vs dense",
    ]
  ]
  for L in BENCH_LABELS:
    full, astra = results[f"bench_full_L{L}"], results[f"bench_astra_L{L}"]
    dense = full["dense_scores_temp_bytes"]
    rows.append(
      [
        f"{L:,}",
        cell(dense / mb),
        cell(full["temp_bytes"] / mb),
        cell(astra["temp_bytes"] / mb),
        f"{dense / astra['temp_bytes']:.1f}x",
      ]
    )
  rows.append(["paper (GPU MB, Renee / ASTRA)", "", "", "", ""])
  for ds, (L, renee, ours, reduction) in PAPER_MEMORY.items():
    rows.append([f"{ds} (L={L:,})", cell(renee), "", cell(ours), f"{reduction:.1f}x"])
  return rows


def plot_ttvsperf(results: dict[str, dict], path: str) -> list[list[str]]:
  """P@1 against cumulative training seconds, one line per method; returns the points."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = [["method", "epoch", "train s", "P@1"]]
  fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
  for name, label in (
    ("random+w_hard", "ASTRA (random + w-hard)"),
    ("full", "full-L (Renee)"),
    ("random", "random"),
  ):
    ev = results[name]["evaluations"]
    xs, ys = [e["train_time_s"] for e in ev], [e["P@1"] for e in ev]
    ax.plot(xs, ys, marker=".", label=label)
    rows += [[name, str(e["epoch"]), cell(e["train_time_s"], 1), cell(e["P@1"])] for e in ev]
  ax.set_xlabel("training time (s, 2 CPU cores)")
  ax.set_ylabel("P@1")
  L = results["random+w_hard"].get("num_labels")
  ax.set_title(
    f"LF-AmazonTitles-131K stand-in, L = {L:,}" if L else "LF-AmazonTitles-131K synthetic stand-in"
  )
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return rows


def plot_motivation(results: dict[str, dict], path: str) -> list[list[str]]:
  """P@1 against epochs, one line per strategy of fig:motivation; returns the table: one
  row per epoch, one P@1 column per strategy."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(MOTIVATION_STRATEGIES)
  curves = {n: {e["epoch"]: e["P@1"] for e in results[n]["evaluations"]} for n in names}
  epochs = sorted(set().union(*curves.values()))
  rows = [["epoch"] + [f"{n} P@1" for n in names]]
  rows += [[str(e)] + [cell(curves[n].get(e)) for n in names] for e in epochs]
  rows.append(["final (test)"] + [cell(results[n]["P@1"]) for n in names])
  rows.append(["train s"] + [cell(results[n]["train_time_s"], 0) for n in names])
  fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
  for n in names:
    xs = sorted(curves[n])
    ax.plot(xs, [curves[n][e] for e in xs], marker=".", label=MOTIVATION_STRATEGIES[n][0])
  ax.set_xlabel("epoch")
  ax.set_ylabel("P@1")
  ax.set_title(f"{MOTIVATION_LABELS} labels of the LF-AmazonTitles-131K stand-in")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return rows
