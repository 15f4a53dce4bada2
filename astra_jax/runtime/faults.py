"""Writes that fail for lack of space or permission, reported in one line.

A run of days meets a full disk (ENOSPC, EDQUOT), a filesystem remounted read-only (EROFS) or
a directory it may no longer write (EACCES, EPERM). The trainer's large writes (checkpoints,
refresh inputs, the exported model, results) run inside `writing(path, nbytes)`, which turns
such an error into `DiskFull`: the path, the bytes the write needed (an estimate: the data's
uncompressed size) and the space left. `main` prints it as one `error:` line. Every such write
goes to a temporary name first and is renamed when complete (orbax's protocol for
checkpoints), so the last good checkpoint stays as it was and the same command resumes from it
once space is freed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil

from astra_jax.runtime import distributed

# The errors a write meets when the disk, not the program, is at fault.
DISK_ERRNOS = {
  errno.ENOSPC: "no space left on the device",
  errno.EDQUOT: "disk quota exceeded",
  errno.EROFS: "read-only file system",
  errno.EACCES: "permission denied",
  errno.EPERM: "operation not permitted",
}
# TensorStore (orbax's writer) and a refresh worker's log keep only the error's text.
_TEXTS = {os.strerror(code): code for code in DISK_ERRNOS}


class DiskFull(Exception):
  """A write that failed for lack of space or permission (see DISK_ERRNOS)."""

  def __init__(self, path: str, nbytes: int | None, code: int):
    self.path, self.nbytes, self.code = path, nbytes, code
    self.free = free_bytes(path)
    needed = (
      f"it needed about {human_bytes(nbytes)} (estimate)"
      if nbytes is not None
      else "it needed an unknown amount"
    )
    free = f", {human_bytes(self.free)} free there" if self.free is not None else ""
    action = "free space" if code in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
    super().__init__(
      f"{path}: cannot write ({DISK_ERRNOS[code]}): {needed}{free}; {action} "
      "and rerun the same command to resume from the last checkpoint"
    )


def human_bytes(n: int) -> str:
  for unit in ("bytes", "KB", "MB", "GB"):
    if n < 1000 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
    n /= 1000
  raise AssertionError  # unreachable


def free_bytes(path: str) -> int | None:
  """Bytes free on the filesystem holding `path` (its nearest existing parent)."""
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  try:
    return shutil.disk_usage(path).free
  except OSError:
    return None


def disk_error_code(e: BaseException) -> tuple[int, str | None] | None:
  """(errno, file name or None) when `e`, or an exception it was raised from, is a disk
  error; None otherwise. Wrapped errors (orbax re-raises TensorStore's, which carry only the
  text) are recognised by their text."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, DiskFull):
      return e.code, e.path
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
      return e.errno, e.filename
    code = disk_error_in_text(str(e))
    if code is not None:
      return code, None
    e = e.__cause__ or e.__context__
  return None


def disk_error_in_text(text: str) -> int | None:
  """The errno whose message ("No space left on device", ...) `text` contains, or None."""
  for message, code in _TEXTS.items():
    if message in text:
      return code
  return None


def require_space(path: str, nbytes: int) -> None:
  """Raises DiskFull unless `nbytes` are free where `path` goes, on every process (they
  agree: the write is collective, or memory-mapped, where a full disk is a SIGBUS, not an
  error). A large write checks first: the error in orbax's background threads would come
  with pages of their tracebacks, and a checkpoint half-written would take the space the
  results need."""
  free = free_bytes(path)
  if distributed.any_true([free is not None and free < nbytes])[0]:
    raise DiskFull(path, nbytes, errno.ENOSPC)


@contextlib.contextmanager
def writing(path: str, nbytes: int | None):
  """Runs a write of about `nbytes` into `path`; a disk error in it raises DiskFull."""
  try:
    yield
  except DiskFull:
    raise
  except Exception as e:
    found = disk_error_code(e)
    if found is None:
      raise
    code, filename = found
    raise DiskFull(os.fspath(filename or path), nbytes, code) from e
