"""What the command-line tools share: absl flag parsing and the --config flag, with a user's
mistake (a mistyped override, a missing config file, a bad variant) reported as one line
`error: ...` instead of a traceback.

  app.run(main, flags_parser=cli.parse_flags)   and in main:   config = cli.config_flag()
"""
from __future__ import annotations

import ast
import sys

from absl import flags

# What parsing or loading a config file and its overrides raises for a user's mistake.
_USER_ERRORS = (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError)


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
