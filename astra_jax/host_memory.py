"""Keep freed host memory in the process, so XLA:CPU steps stop page-faulting.

XLA:CPU allocates a step's temporaries (2.7 GB for a MiniLM step at batch 256 x 32) with
malloc on every execution and frees them after. glibc serves such blocks with mmap (or from
per-thread arenas it trims), so each step faults every page in again and the kernel zeroes
it: 660k minor faults, about 1 s of system time and 15-20% of the step on the 2-core
machine (benchmarks/train_step.py). With one arena, no mmap and no trimming, freed blocks
are reused and the faults drop to zero. The cost: the process keeps its peak heap (RSS does
not shrink after a large temporary is freed), which a training process wants anyway.

Call `keep_freed_memory()` before jax (or anything that starts threads) is imported: arenas
already attached to threads are not changed. `main.py` and the benchmarks do; set
ASTRA_JAX_SYSTEM_MALLOC=1 to leave glibc's defaults alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_done = False


def keep_freed_memory() -> bool:
  """Sets glibc's malloc to keep freed memory (one arena, no mmap, no trim). Returns whether
  it did (False on other C libraries, when opted out, or when mallopt refuses)."""
  global _done
  if _done:
    return True
  if os.environ.get("ASTRA_JAX_SYSTEM_MALLOC") or platform.libc_ver()[0] != "glibc":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  except OSError:
    return False
  # M_TRIM_THRESHOLD takes an int but is stored as size_t: -1 means "never trim" (a positive
  # int tops out at 2 GiB, below one step's temporaries).
  ok = all(libc.mallopt(opt, value) == 1 for opt, value in
           ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
  _done = ok
  return ok
