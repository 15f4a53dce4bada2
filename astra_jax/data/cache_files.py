"""What the data caches share: unique temporary names, one builder per cache, streamed .npy
files, and the source stamp that tells a cache is stale.

Temporary names carry host, pid and a random tag, so processes on several nodes writing
into one shared directory never collide; a finished file appears by rename only. A cache
is built under an exclusive lock on `<stem>.lock` (fcntl): the first process of a node
builds it, the others wait on the lock and then open what it built.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import time
from collections.abc import Iterator

import numpy as np
from absl import logging

from astra_jax.runtime import tmpnames

NPY_HEADER_BYTES = 128  # a version-1.0 header padded to 128 bytes: room for any 1-D shape


def unique_tag() -> str:
  """host-pid-random: unique across the nodes sharing a directory (tmpnames)."""
  return tmpnames.unique_suffix()


def temporary_name(path: str) -> str:
  """A name beside `path` that no other process uses; ends like `path` (so .npy stays)."""
  head, ext = os.path.splitext(path)
  return f"{head}.tmp-{unique_tag()}{ext}"


def remove_stale_temporaries(path: str) -> None:
  """Removes temporaries of `path` that a killed builder left (call holding its lock)."""
  head, ext = os.path.splitext(path)
  for stale in glob.glob(glob.escape(head) + ".tmp-*" + ext):
    with contextlib.suppress(OSError):
      os.remove(stale)


def source_stamp(path: str) -> dict:
  """What identifies a source file's version: path, size, modification time."""
  st = os.stat(path)
  return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@contextlib.contextmanager
def build_lock(stem: str) -> Iterator[None]:
  """Holds `<stem>.lock` exclusively: one builder per cache at a time (per host; across
  hosts as far as the file system honours fcntl locks: training's leader builds first)."""
  with open(stem + ".lock", "a") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info("waiting for another process building %s", stem)
      t0 = time.time()
      fcntl.flock(f, fcntl.LOCK_EX)
      logging.info("%s: waited %.1fs for its builder", stem, time.time() - t0)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


class NpyStreamWriter:
  """A 1-D .npy file written block by block, its length unknown until the end: the header
  is reserved and written on `finish`, then the file is renamed onto `path`."""

  def __init__(self, path: str, dtype):
    self.path, self.dtype = path, np.dtype(dtype)
    self.tmp = temporary_name(path)
    self.file = open(self.tmp, "wb")
    self.file.write(b"\0" * NPY_HEADER_BYTES)
    self.length = 0

  def append(self, block: np.ndarray) -> None:
    block = np.ascontiguousarray(block, self.dtype)
    self.file.write(block.data)
    self.length += len(block)

  def finish(self) -> None:
    header = {
      "descr": np.lib.format.dtype_to_descr(self.dtype),
      "fortran_order": False,
      "shape": (self.length,),
    }
    text = repr(header).encode("latin1")
    room = NPY_HEADER_BYTES - 10  # magic (6), version (2), header length (2)
    self.file.seek(0)
    self.file.write(
      b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + text.ljust(room - 1) + b"\n"
    )
    self.file.flush()
    os.fsync(self.file.fileno())
    self.file.close()
    os.replace(self.tmp, self.path)

  def abort(self) -> None:
    self.file.close()
    with contextlib.suppress(OSError):
      os.remove(self.tmp)
