"""host_memory.keep_freed_memory: a large block freed and allocated again is not faulted in
again (glibc only; in a fresh process, as the setting must precede any threads)."""

import os
import platform
import subprocess
import sys

import pytest

_PROBE = r"""
import resource, sys
from astra_jax.runtime import host_memory
print(host_memory.keep_freed_memory())
import numpy as np
faults = []
for _ in range(6):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  a = np.ones(64 << 20, np.uint8)  # 64 MiB: glibc would mmap it
  del a
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[2:]))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")
@pytest.mark.parametrize("opt_out", [False, True])
def test_freed_blocks_are_reused_without_page_faults(opt_out):
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  env.pop("ASTRA_JAX_SYSTEM_MALLOC", None)
  if opt_out:
    env["ASTRA_JAX_SYSTEM_MALLOC"] = "1"
  out = subprocess.run(
    [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
  ).stdout.split()
  applied, faults = out[0] == "True", int(out[1])
  # glibc's defaults: each 64 MiB block is mapped and faulted in afresh (the kernel may
  # fault several pages at once: at least one fault per MiB); kept: nothing to fault.
  if opt_out:
    assert not applied and faults >= 64
  else:
    assert applied and faults < 16


def _thp_mode() -> str:
  try:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      return f.read().split("[")[1].split("]")[0]
  except (OSError, IndexError):
    return "absent"


def _anon_huge_bytes(start: int, size: int) -> int:
  """AnonHugePages of the mappings that overlap [start, start + size), from the kernel's
  /proc/self/smaps (madvise splits a mapping at the advised range)."""
  inside, total = False, 0
  with open("/proc/self/smaps") as f:
    for line in f:
      head = line.split()[0]
      if "-" in head and not head.endswith(":"):
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo < start + size and start < hi
      elif inside and head == "AnonHugePages:":
        total += int(line.split()[1]) * 1024
  return total


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="no transparent huge pages")
def test_classifier_buffer_is_backed_by_huge_pages():
  import jax
  import jax.numpy as jnp

  from astra_jax.runtime import host_memory

  w = jax.block_until_ready(jnp.ones((1 << 20, 64), jnp.float32))  # 256 MiB on the CPU
  pointer = w.addressable_shards[0].data.unsafe_buffer_pointer()
  before = _anon_huge_bytes(pointer, w.nbytes)
  advised = host_memory.back_with_huge_pages(w)
  assert advised >= w.nbytes - (4 << 20)  # all but the partial huge pages at the ends
  after = _anon_huge_bytes(pointer, w.nbytes)
  assert after >= before + advised // 2, (before, advised, after)
  assert host_memory.back_with_huge_pages(w[:10]) == 0  # small buffers: left alone
  assert float(w.sum()) == w.size  # the data is unchanged


_PEAK_PROBE = r"""
import subprocess, sys
import numpy as np
from astra_jax.runtime import host_memory
held = np.ones(256 << 20, np.uint8)  # 256 MiB resident in this process
child = "from astra_jax.runtime import host_memory; print(host_memory.peak_resident_bytes())"
out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
print(host_memory.peak_resident_bytes(), int(out.stdout))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="VmHWM is Linux's")
def test_peak_resident_bytes_is_the_process_own_not_its_parents():
  # A child started from a process holding 256 MiB: getrusage's ru_maxrss would carry the
  # parent's peak over the fork and exec; VmHWM is the child's own, a small interpreter.
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  out = subprocess.run(
    [sys.executable, "-c", _PEAK_PROBE], capture_output=True, text=True, env=env, check=True
  )
  parent, child = (int(x) for x in out.stdout.split())
  assert parent >= 256 << 20
  assert child < 128 << 20
