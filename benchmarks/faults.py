"""Fault injection on the demo-sized run of tests/test_checkpoint.py, through the CLI.

  python benchmarks/faults.py --out=/tmp/faults [--files=6] [--seed=0]

Each fault is applied to a copy of a workdir (finished, or stopped at a random step), the same
command is rerun, and the table row records: the warning / error lines it printed, its exit
status, whether a traceback appeared, and whether the final metrics equal the uninterrupted
run's. Every file of a checkpoint is tried by tests/test_faults.py's check of `damage`;
here `--files` random files of the latest checkpoint go through a whole resume.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from child_env import cpu_child_env, demo_command_line  # noqa: E402  (the tests' resume run)

from astra_jax.training import checkpoint  # noqa: E402


def run(workdir: str, data: str, *extra: str) -> tuple[int, str]:
  p = subprocess.run(
    demo_command_line(workdir, data) + list(extra),
    cwd=ROOT,
    env=cpu_child_env(1),
    text=True,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )
  return p.returncode, p.stdout


def latest_step(workdir: str) -> int:
  return max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def outcome(name: str, workdir: str, rc: int, out: str, want: dict | None) -> dict:
  lines = [
    l
    for l in out.splitlines()
    if re.match(r"^W\d{4} .*(damaged|negatives:|eval after)", l) or l.startswith("error:")
  ]
  resumed = re.search(r"resumed from .*/checkpoints/(\d+)", out)
  results = os.path.join(workdir, "results.json")
  metrics = json.load(open(results))["metrics"] if rc == 0 and os.path.exists(results) else None
  return {
    "fault": name,
    "exit": rc,
    "traceback": "Traceback" in out,
    "lines": [re.sub(r"^W\S+ \S+ \S+ ", "", l)[:160] for l in lines],
    "resumed_from": int(resumed.group(1)) if resumed else None,
    "metrics_equal": None if want is None or metrics is None else metrics == want,
  }


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--files", type=int, default=6)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()
  rng = random.Random(args.seed)
  os.makedirs(args.out, exist_ok=True)
  data, ref = os.path.join(args.out, "data"), os.path.join(args.out, "ref")
  if not os.path.exists(os.path.join(ref, "results.json")):
    rc, out = run(ref, data)
    assert rc == 0, out[-3000:]
  want = json.load(open(os.path.join(ref, "results.json")))["metrics"]
  rows = []

  def trial(name, source, damage, *extra, expect=want):
    wd = os.path.join(args.out, re.sub(r"\W+", "_", name))
    shutil.rmtree(wd, ignore_errors=True)
    shutil.copytree(source, wd)
    damage(wd)
    rc, out = run(wd, data, *extra)
    rows.append(outcome(name, wd, rc, out, expect))
    print(json.dumps(rows[-1]), flush=True)

  # A workdir stopped at a random step (as a crash leaves it), with its checkpoints. (A full
  # disk needs a mount: tests/test_faults.py.)
  mid = os.path.join(args.out, "mid")
  if not os.path.isdir(mid):
    stop = rng.randrange(30, 56)  # before epoch 2's refresh (28 steps an epoch)
    rc, out = run(mid, data, f"--config.train.stop_after_steps={stop}")
    assert rc == 75, out[-3000:]
  step_dir = lambda wd: os.path.join(wd, "checkpoints", str(latest_step(wd)))
  for source, where in ((ref, "finished"), (mid, "stopped")):
    files = sorted(f for f, size in checkpoint.step_files(step_dir(source)).items() if size)
    for rel in rng.sample(files, min(args.files, len(files))):

      def truncate(wd, rel=rel):
        path = os.path.join(step_dir(wd), rel)
        os.truncate(path, rng.randrange(os.path.getsize(path)))

      trial(f"{where}: {rel} truncated", source, truncate)
    trial(
      f"{where}: commit marker deleted",
      source,
      lambda wd: os.remove(os.path.join(step_dir(wd), checkpoint.COMMIT_MARKER)),
    )

  def every_checkpoint(wd):
    for d in os.listdir(os.path.join(wd, "checkpoints")):
      os.remove(os.path.join(wd, "checkpoints", d, "state", "_METADATA"))

  trial("finished: every checkpoint damaged", ref, every_checkpoint, expect=None)
  trial(
    "stopped: refresh fails (injected)",
    mid,
    lambda wd: None,
    "--config.negatives.inject_fault=raise",
    expect=None,
  )
  with open(os.path.join(args.out, "faults.json"), "w") as f:
    json.dump(rows, f, indent=1)
  print("| fault | exit | traceback | resumed from | metrics = uninterrupted | lines |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['fault']} | {r['exit']} | {r['traceback']} | {r['resumed_from']} | "
      f"{r['metrics_equal']} | {len(r['lines'])}: {'; '.join(r['lines'])[:120]} |"
    )


if __name__ == "__main__":
  main()
