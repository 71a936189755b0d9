"""A deadline for a process whose main thread may block for ever, e.g. a torchrun worker waiting in a
collective for a peer that was stopped (SIGSTOP) or froze: such a wait cannot be interrupted from
Python, so a daemon thread prints one line on stderr and ends the whole process with `os._exit`
once the deadline passes, unless the watchdog was disarmed first.

    with Watchdog(20.0, "ghpsim worker rank 0: error: --timeout 20 s passed ..."):
        ...  # the guarded work; leaving the block disarms the watchdog

Importable without torch.
"""

from __future__ import annotations

import os
import threading
import time

from simulator.errors import one_line

EXIT_CODE = 2
"""Exit code of a process the watchdog ends (the product's code for a failed run)."""


class Watchdog:
    """Ends the process with `exit_code` after printing `message` (one line) once `timeout_s` seconds
    have passed since `start` or the last `kick` (a sign of progress, e.g. a finished step), unless
    `disarm` was called before. Disarming is final: after `disarm` returns the watchdog never fires
    (a deadline reached during the call waits for it, then stands down)."""

    def __init__(self, timeout_s: float, message: str, exit_code: int = EXIT_CODE):
        self.timeout_s = timeout_s
        self.message = one_line(message)
        self.exit_code = exit_code
        self._deadline = time.monotonic() + timeout_s
        self._disarmed = threading.Event()
        self._lock = threading.Lock()  # disarm and fire exclude each other
        self._thread = threading.Thread(target=self._watch, name="ghpsim-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._deadline = time.monotonic() + self.timeout_s
        self._thread.start()
        return self

    def kick(self) -> None:
        """Progress: the deadline moves to `timeout_s` from now."""
        self._deadline = time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        with self._lock:
            self._disarmed.set()

    @property
    def armed(self) -> bool:
        return self._thread.is_alive() and not self._disarmed.is_set()

    def _watch(self) -> None:
        while (left := self._deadline - time.monotonic()) > 0:
            if self._disarmed.wait(left):
                return
        with self._lock:
            if self._disarmed.is_set():
                return
            # straight to the file descriptor: sys.stderr's buffer lock may be held by the blocked thread
            try:
                os.write(2, (self.message + "\n").encode("utf-8", "replace"))
            except OSError:
                pass
            os._exit(self.exit_code)

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.disarm()
