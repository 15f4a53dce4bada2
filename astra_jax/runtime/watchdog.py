"""A watchdog that turns a hung step into a clear error with every thread's stack.

Collectives have no timeout: when one rank of a multi-process run dies or stalls, the
others block inside an all-reduce until the job's time limit, printing nothing. The
trainer calls `kick()` after every step (and every block of the final evaluation); when
`timeout_s` passes without one, the watchdog prints one `error:` line naming the process
and what it was doing, then every thread's Python stack (faulthandler), and ends the
process with exit status 70, so that srun's --kill-on-bad-exit ends the job step.

Two layers, because a hang may hold the GIL: a Python thread that prints the message and
the stacks, and behind it `faulthandler.dump_traceback_later`, which needs no GIL and
dumps and exits a minute later if the Python thread could not run.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

HANG_EXIT_CODE = 70  # EX_SOFTWARE
_FALLBACK_GRACE_S = 60.0


class HangWatchdog:
  """Armed by kick(), which must then come again within `timeout_s` seconds or the process
  ends (module docstring); disarm() stops the clock until the next kick (work between
  steps whose length grows with the data: evaluations, refresh waits, checkpoints).
  timeout_s = 0: does nothing. A context manager: leaving it stops the watchdog."""

  def __init__(self, timeout_s: float, rank: int = 0, stream=None, exit_fn=os._exit):
    self.timeout_s, self.rank = timeout_s, rank
    self.stream = stream or sys.stderr
    self.exit_fn = exit_fn
    self.what = ""
    self.last = time.monotonic()
    self.armed = False
    self._fallback_armed = 0.0
    self._rearm_every = min(_FALLBACK_GRACE_S / 2, timeout_s / 4)
    self._wake = threading.Event()
    self._stopped = False
    self._thread = None
    if timeout_s > 0:
      self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
      self._thread.start()

  def __enter__(self) -> HangWatchdog:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def kick(self, what: str) -> None:
    """Progress: the clock starts again; `what` says what the process does next."""
    now = time.monotonic()
    self.last, self.what = now, what
    # Re-arming faulthandler starts a thread: done at most every half grace period, so
    # the fallback still fires at least half a grace period after the Python watchdog.
    if self._thread is not None and (
      not self.armed or now - self._fallback_armed >= self._rearm_every
    ):
      self._fallback_armed = now
      try:
        faulthandler.dump_traceback_later(
          self.timeout_s + _FALLBACK_GRACE_S, exit=True, file=self.stream
        )
      except (ValueError, OSError, AttributeError):  # a stream without a file descriptor
        pass
    self.armed = True

  def disarm(self) -> None:
    if self.armed and self._thread is not None:
      faulthandler.cancel_dump_traceback_later()
    self.armed = False

  def close(self) -> None:
    self.disarm()
    self._stopped = True
    self._wake.set()
    if self._thread is not None:
      self._thread.join()

  def _run(self) -> None:
    while not self._stopped:
      idle = time.monotonic() - self.last
      if self.armed and idle >= self.timeout_s:
        self._fire(idle)
        return
      left = self.timeout_s - idle if self.armed else self.timeout_s
      self._wake.wait(min(max(left, 0.01), 5.0))

  def _fire(self, idle: float) -> None:
    print(
      f"error: process {self.rank} made no progress for {idle:.0f} s while {self.what} "
      f"(train.hang_timeout_s={self.timeout_s:g}): a step or a collective is hung, e.g. "
      "another process died or stalls; every thread's stack follows",
      file=self.stream,
      flush=True,
    )
    try:
      faulthandler.dump_traceback(file=self.stream, all_threads=True)
    except (ValueError, OSError, AttributeError):
      import traceback

      for ident, frame in sys._current_frames().items():
        print(f"\nthread {ident}:", file=self.stream)
        traceback.print_stack(frame, file=self.stream)
    self.stream.flush()
    self.exit_fn(HANG_EXIT_CODE)
