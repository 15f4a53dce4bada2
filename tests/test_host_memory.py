"""host_memory.keep_freed_memory: a large block freed and allocated again is not faulted in
again (glibc only; in a fresh process, as the setting must precede any threads)."""
import os
import platform
import subprocess
import sys

import pytest

_PROBE = r"""
import resource, sys
from astra_jax import host_memory
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
  out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                       text=True, check=True).stdout.split()
  applied, faults = out[0] == "True", int(out[1])
  # glibc's defaults: each 64 MiB block is mapped and faulted in afresh (the kernel may
  # fault several pages at once: at least one fault per MiB); kept: nothing to fault.
  if opt_out:
    assert not applied and faults >= 64
  else:
    assert applied and faults < 16
