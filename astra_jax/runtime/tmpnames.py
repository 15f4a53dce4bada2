"""Names for temporary files and directories that no other process can pick.

A workdir, a dataset's token cache or a model directory may sit on a file system that
several nodes share; process ids repeat across nodes (and across a container's restarts),
so a name made from the PID alone can be another process's half-written file.
"""

from __future__ import annotations

import os
import secrets
import socket


def unique_suffix() -> str:
  """host-pid-random: unique across the nodes of a shared file system (random: 8 hex)."""
  host = socket.gethostname().split(".")[0] or "host"
  return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"
