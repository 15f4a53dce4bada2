"""Imports a script of benchmarks/ as a module, for tests of its functions: the folder is
on the path only while it imports, as the scripts import their siblings (`jsonl`) by name."""

import importlib
import os
import sys
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def benchmark_module(name: str) -> ModuleType:
  """benchmarks/`name`.py, imported."""
  sys.path.insert(0, BENCHMARKS)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.pop(0)
