"""The benchmarks' output: one JSON object per line on stdout and appended to --out."""

from __future__ import annotations

import json


def emit(row: dict, out: str | None, digits: int | None = None) -> None:
  """Prints `row` as one JSON line and appends it to `out` (when given); floats rounded to
  `digits` decimals when given."""
  if digits is not None:
    row = {k: round(v, digits) if isinstance(v, float) else v for k, v in row.items()}
  line = json.dumps(row)
  print(line, flush=True)
  if out:
    with open(out, "a") as f:
      f.write(line + "\n")
