"""Keep freed host memory in the process, so XLA:CPU steps stop page-faulting.

XLA:CPU allocates a step's temporaries (gigabytes for a MiniLM step) with malloc on every
execution and frees them after. glibc serves such blocks with mmap (or from per-thread
arenas it trims), so each step faults every page in again and the kernel zeroes it, a
sizeable share of the step (benchmarks/train_step.py; docs/results/implementation_notes.md).
With one arena, no mmap and no trimming, freed blocks are reused and the faults drop to
zero. The cost: the process keeps its peak heap (RSS does not shrink after a large
temporary is freed), which a training process wants anyway.

Call `keep_freed_memory()` before jax (or anything that starts threads) is imported: arenas
already attached to threads are not changed. `main.py` and the benchmarks do; set
ASTRA_JAX_SYSTEM_MALLOC=1 to leave glibc's defaults alone.

`release_freed_memory()` hands the pages of freed blocks back once, after a one-off peak
that later steps do not reuse: at 10^7 labels the set-up (W from the label texts: their
embeddings, a host W, its device copy) leaves most of the trainer's resident memory freed
but held, which beside a refresh worker runs a 24 GB machine out of memory
(benchmarks/scale_run.py; docs/results/scale_run.md).

`back_with_huge_pages(w)` puts a large host array (the classifier on the CPU backend) on 2 MiB
transparent huge pages. A step gathers and scatters ~15k random rows of W; at L = 1e7
nearly every row is also a TLB miss on 4 KiB pages, which huge pages mostly remove
(benchmarks/step_vs_labels.py; docs/results/implementation_notes.md). On GPU, nothing to
do; ASTRA_JAX_NO_HUGE_PAGES=1 turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_HUGE_PAGE = 2 << 20
_done = False


def keep_freed_memory() -> bool:
  """Sets glibc's malloc to keep freed memory (one arena, no mmap, no trim). Returns whether
  it did (False on other C libraries, when opted out, or when mallopt refuses)."""
  global _done
  if _done:
    return True
  if os.environ.get("ASTRA_JAX_SYSTEM_MALLOC") or platform.libc_ver()[0] != "glibc":
    return False
  libc = _libc()
  if libc is None:
    return False
  # M_TRIM_THRESHOLD takes an int but is stored as size_t: -1 means "never trim" (a positive
  # int tops out at 2 GiB, below one step's temporaries).
  ok = all(
    libc.mallopt(opt, value) == 1
    for opt, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  )
  _done = ok
  return ok


def release_freed_memory() -> int:
  """Returns the pages of freed heap memory to the system (glibc's malloc_trim(0), which
  also releases free pages inside the heap), whatever keep_freed_memory set. Returns the
  bytes of resident memory it gave back (0 where it could not: not glibc, or nothing
  freed)."""
  libc = _libc()
  if libc is None or platform.libc_ver()[0] != "glibc":
    return 0
  before = resident_bytes()
  libc.malloc_trim(0)
  return max(0, before - resident_bytes())


def _status_bytes(field: str) -> int:
  """A `/proc/self/status` size field (e.g. "VmRSS") in bytes, 0 where /proc does not say."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def resident_bytes() -> int:
  """This process's resident memory (VmRSS), 0 where /proc does not say."""
  return _status_bytes("VmRSS")


def peak_resident_bytes() -> int:
  """This process's peak resident memory since it last exec'd (VmHWM).

  Not getrusage's ru_maxrss: that survives fork and exec, so a refresh worker started from
  a trainer holding 13 GB would report 13 GB whatever it used itself. Where /proc does not
  say, ru_maxrss (kilobytes on Linux, bytes on macOS)."""
  peak = _status_bytes("VmHWM")
  if peak:
    return peak
  import resource

  maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return maxrss if sys.platform == "darwin" else maxrss * 1024


@functools.cache
def _libc():
  """The C library (None where it cannot be loaded), with madvise's argument types."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
  except OSError:
    return None
  libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  return libc


def back_with_huge_pages(x, min_bytes: int = 8 << 20) -> int:
  """Advises the kernel to back the host buffers of `x` (a jax.Array on CPU devices) with
  transparent huge pages, and collapses the pages already there (MADV_COLLAPSE, Linux 6.1+;
  about 1 s per GB, once). Returns the bytes advised: 0 on other platforms or devices,
  for buffers under `min_bytes`, or where the kernel refuses (THP set to "never").

  Buffers keep the advice while they live; a step that donates W writes its output into
  the same buffer, so one call after W is created or restored covers a run."""
  if platform.system() != "Linux" or os.environ.get("ASTRA_JAX_NO_HUGE_PAGES"):
    return 0
  advised = 0
  for shard in getattr(x, "addressable_shards", ()):
    if shard.device.platform != "cpu" or shard.data.nbytes < min_bytes:
      continue
    libc = _libc()
    if libc is None:
      return 0
    start = shard.data.unsafe_buffer_pointer()
    lo = -(-start // _HUGE_PAGE) * _HUGE_PAGE  # whole huge pages inside the buffer
    hi = (start + shard.data.nbytes) // _HUGE_PAGE * _HUGE_PAGE
    if hi <= lo or libc.madvise(lo, hi - lo, _MADV_HUGEPAGE) != 0:
      continue
    libc.madvise(lo, hi - lo, _MADV_COLLAPSE)  # best effort: khugepaged does it later if not
    advised += hi - lo
  return advised
