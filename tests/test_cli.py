"""The command-line tools as users call them: each tool's --help lists exactly its own flags
(run as `python -m astra_jax.<tool>` and as its console_scripts entry point), every flag a
documented command uses exists, and a stray flag is an error, not silently accepted."""

import configparser
import glob
import importlib
import logging
import os
import re
import subprocess
import sys

import pytest

from astra_jax.runtime import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = {"third_party_logs"}  # cli.run gives every tool this one
# Each tool's flags, as its documentation describes them.
TOOL_FLAGS = {
  "main": {"config", "workdir"},
  "evaluate": {"pred", "truth", "train", "filter", "A", "B", "out", "k"},
  "predict": {"workdir", "input", "output", "k", "exact", "batch_size", "rebuild_index"},
  "prepare": {"config", "src", "out", "tokenizer", "max_len", "use_content"},
  "extend": {"workdir", "labels", "retire", "out", "train_data", "epochs", "update"},
  "plan": {
    "config",
    "mesh",
    "gpu",
    "num_gpus",
    "gpus_per_node",
    "processes_per_node",
    "host_cores_per_node",
    "train_queries_per_s",
    "json",
    "check",
  },
  "reproduce": {"table", "workdir", "scale", "epochs", "out", "seeds", "data", "jobs"},
  "baselines": {
    "data",
    "layout",
    "use_content",
    "split",
    "validation_fraction",
    "validation_seed",
    "validation_max_rows",
    "filter_self",
    "methods",
    "peers_python",
    "propensity_A",
    "propensity_B",
    "output",
  },
}
# Where users read the commands: the README, docs/, the launchers, the experiment configs and
# the tools' own docstrings.
DOCUMENTED = ["README.md", "docs/*.md", "launch/*", "experiments/*.py", "astra_jax/**/*.py"]


def _run(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
  )


def _listed_flags(help_text: str) -> set[str]:
  """The flag names absl's --help lists (`  --name: ...`, `  --[no]name: ...`)."""
  return set(re.findall(r"^  --(?:\[no\])?([A-Za-z_][\w]*):", help_text, re.M))


def _entry_points() -> dict[str, str]:
  """setup.cfg's console_scripts: script name -> 'module:function'."""
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(REPO, "setup.cfg"))
  lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
  return dict((part.strip() for part in line.split("=")) for line in lines)


@pytest.mark.parametrize("tool", sorted(TOOL_FLAGS))
def test_help_lists_exactly_the_tools_own_flags(tool):
  r = _run(["-m", f"astra_jax.{tool}", "--help"])  # absl's help exits with status 1
  assert _listed_flags(r.stdout) == TOOL_FLAGS[tool] | SHARED, r.stdout


def test_training_defines_no_other_tools_flags():
  # --helpfull lists every flag the process defined, the libraries' included: none of the
  # evaluator's (main.py once imported evaluate.py, whose flags came along).
  r = _run(["-m", "astra_jax.main", "--helpfull"])
  assert "--workdir" in r.stdout, r.stderr[-2000:]
  for flag in ("pred", "truth", "out", "k", "A", "filter"):
    assert f"  --{flag}:" not in r.stdout, flag


def test_a_stray_flag_is_an_error(tmp_path):
  r = _run(
    [
      "-m",
      "astra_jax.main",
      "--config=experiments/demo.py",
      f"--workdir={tmp_path}",
      "--out=results.json",
    ]
  )
  lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("[transformers]")]
  assert r.returncode == 1 and lines == ["error: Unknown command line flag 'out'"], r.stderr
  assert not os.listdir(tmp_path)  # nothing ran


def test_a_stray_argument_is_an_error():
  r = _run(["-m", "astra_jax.plan", "--config=experiments/ss20m.py", "extra"])
  assert r.returncode == 1 and r.stderr.strip() == "error: unexpected arguments: ['extra']"


def test_console_scripts_are_the_tools():
  scripts = _entry_points()
  modules = {target.split(":")[0] for target in scripts.values()}
  assert modules == {
    "astra_jax.main",
    "astra_jax.evaluate",
    "astra_jax.predict",
    "astra_jax.extend",
    "astra_jax.prepare",
    "astra_jax.plan.__main__",
    "astra_jax.reproduce.__main__",
    "astra_jax.baselines",
  }
  for target in scripts.values():
    module, function = target.split(":")
    assert callable(getattr(importlib.import_module(module), function)), target


@pytest.mark.parametrize("script, tool", [("astra-plan", "plan"), ("astra-evaluate", "evaluate")])
def test_console_script_help_lists_the_tools_flags(script, tool):
  # What pip's generated wrapper does: a __main__ without a docstring, argv[0] the script.
  module, function = _entry_points()[script].split(":")
  code = (
    f"import sys; sys.argv = [{script!r}, '--help']\n"
    f"from {module} import {function}\nsys.exit({function}())"
  )
  r = _run(["-c", code])
  assert _listed_flags(r.stdout) == TOOL_FLAGS[tool] | SHARED, r.stdout
  assert f"python -m astra_jax.{tool}" in r.stdout  # the tool's usage text


def _documented_commands() -> list[tuple[str, str, str]]:
  """(file, tool, command text) for every `-m astra_jax.<tool>` in the documentation; the
  text runs to the end of its line (continued by a trailing backslash), a closing backquote
  or a comment."""
  found = []
  for pattern in DOCUMENTED:
    for path in sorted(glob.glob(os.path.join(REPO, pattern), recursive=True)):
      if not os.path.isfile(path):
        continue
      with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
      for m in re.finditer(r"-m astra_jax\.([a-z_]+)([^\n`#]*)", text):
        if m.group(1) in TOOL_FLAGS:
          found.append((os.path.relpath(path, REPO), m.group(1), m.group(2)))
  return found


def test_every_documented_command_uses_the_tools_flags():
  commands = _documented_commands()
  assert {tool for _, tool, _ in commands} == set(TOOL_FLAGS)
  for path, tool, command in commands:
    used = set(re.findall(r"--([A-Za-z_]\w*)", command))  # --config.a.b=v: "config"
    assert used <= TOOL_FLAGS[tool], (path, tool, command, used - TOOL_FLAGS[tool])


def _record(level: int, pathname: str) -> logging.LogRecord:
  return logging.LogRecord("absl", level, pathname, 1, "message", None, None)


def test_console_keeps_our_info_lines_and_every_warning():
  ours = os.path.join(REPO, "astra_jax", "training", "train.py")
  orbax = "/venv/lib/python3.11/site-packages/orbax/checkpoint/checkpoint_manager.py"
  keep = cli.OwnInfoOnly().filter
  assert keep(_record(logging.INFO, ours)) and keep(_record(logging.WARNING, ours))
  assert not keep(_record(logging.INFO, orbax)) and not keep(_record(logging.DEBUG, orbax))
  assert keep(_record(logging.WARNING, orbax)) and keep(_record(logging.ERROR, orbax))
  # A file named like one of ours elsewhere is not ours (orbax has a checkpoint.py too).
  assert not keep(_record(logging.INFO, "/site-packages/orbax/checkpoint/checkpoint.py"))


def test_third_party_info_lines_come_back_with_the_flag(tmp_path):
  # jax logs its TPU probe at INFO when the devices are first asked for, before the missing
  # data stops the run: hidden by default, printed with --third_party_logs.
  args = [
    "-m",
    "astra_jax.main",
    "--config=experiments/xc_text.py:tiny",
    f"--config.data.dir={tmp_path / 'none'}",
    f"--workdir={tmp_path / 'wd'}",
  ]
  quiet, verbose = _run(args), _run(args + ["--third_party_logs"])
  for r in (quiet, verbose):
    assert r.returncode == 1 and "error: no dataset found" in r.stderr, r.stderr[-2000:]
  assert "xla_bridge.py" not in quiet.stdout and "xla_bridge.py" in verbose.stdout  # the log
