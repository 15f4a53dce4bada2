"""What the command-line tools share: one way to start a tool, absl flag parsing, the
--config flag, and a user's mistake (a mistyped override, a missing config file, a bad
variant, bad input) reported as one line `error: ...` instead of a traceback.

A tool module defines its flags in a `define_flags()` function (importing the module
defines none, so library code may import it), and starts with

  def cli_main() -> None:   # also its console_scripts entry point (setup.cfg)
    cli.run(main, define_flags, __doc__)

  if __name__ == "__main__":
    cli_main()

and in main:   config = cli.config_flag()
"""

from __future__ import annotations

import ast
import logging as py_logging
import os
import sys
from collections.abc import Callable

from absl import app, flags, logging

from astra_jax.runtime.errors import InputError

# What parsing or loading a config file and its overrides raises for a user's mistake.
_USER_ERRORS = (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError)
# The package directory (astra_jax/): every module under it counts as ours.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
THIRD_PARTY_LOGS = "third_party_logs"


def _message(e: BaseException) -> str:
  """The exception's message on one line. ml_collections re-raises a KeyError's repr (quoted,
  escaped newlines); a wrapped traceback ends with the line that matters."""
  text = str(e)
  try:
    text = ast.literal_eval(text) if text[:1] in "'\"" else text
  except (ValueError, SyntaxError):
    pass
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  if any(line.startswith("Traceback") for line in lines):
    return lines[-1]
  return " ".join(lines)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, with a flag mistake (unknown flag, bad value) as one `error:` line."""
  try:
    return flags.FLAGS(argv)
  except _USER_ERRORS as e:
    sys.exit(f"error: {_message(e)}")


def config_flag(name: str = "config"):
  """The parsed --config (loading the file and applying the overrides happens here)."""
  try:
    config = getattr(flags.FLAGS, name)
    if config is not None:
      config.keys()  # a file that failed to load is a placeholder that raises on first use
    return config
  except _USER_ERRORS as e:
    sys.exit(f"error: --{name}: {_message(e)}")


class OwnInfoOnly(py_logging.Filter):
  """Passes every warning and error, and INFO lines only from astra_jax's own modules.

  orbax (through absl.logging), jax (the TPU probe) and other libraries log hundreds of INFO
  lines per run around the few progress lines a person reads. Every absl.logging call goes
  to the one "absl" logger whatever library makes it, so the source file, not the logger's
  name, tells ours from theirs."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    return record.levelno >= py_logging.WARNING or os.path.abspath(record.pathname).startswith(
      _PACKAGE_DIR
    )


def _show_main_flags(names: set[str]) -> None:
  """Lists `names` under the running program in --help. absl's --help shows the flags of
  the module that sys.argv[0] names: the tool itself under `python -m`, but only a wrapper
  with no flags under a console_scripts entry point."""
  for name in names:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def run(
  main: Callable[[list[str]], int | None], define_flags: Callable[[], None], doc: str | None
) -> None:
  """Defines the tool's flags and runs `main` under absl (never returns).

  Args:
    main: the tool; gets argv without flags (only the program name is allowed), returns
      an exit status or None. An InputError it raises ends the run as one `error:` line.
    define_flags: defines the tool's flags (and marks the required ones).
    doc: the tool's usage text (its module docstring), printed by --help.
  """
  before = set(flags.FLAGS)
  define_flags()
  flags.DEFINE_bool(
    THIRD_PARTY_LOGS,
    False,
    "also print other libraries' INFO log lines "
    "(orbax, jax, ...); their warnings and errors are always printed",
  )
  _show_main_flags(set(flags.FLAGS) - before)
  main_module = sys.modules["__main__"]
  if not main_module.__doc__ and doc:  # a console_scripts wrapper has none; --help prints it
    main_module.__doc__ = doc

  def tool(argv: list[str]) -> int | None:
    if len(argv) > 1:
      sys.exit(f"error: unexpected arguments: {argv[1:]}")
    if not flags.FLAGS[THIRD_PARTY_LOGS].value:
      logging.get_absl_handler().addFilter(OwnInfoOnly())
    try:
      return main(argv)
    except InputError as e:
      sys.exit(f"error: {e}")

  app.run(tool, flags_parser=parse_flags)
