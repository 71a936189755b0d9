"""Process pools whose workers leave Ctrl-C to the parent and die with it (`rank`, `sweep`,
`validate --rank`).

A worker that took SIGINT could be interrupted while holding its pool's call-queue lock, and the
parent's shutdown would then wait for it forever; so workers ignore SIGINT, the parent alone
handles it, and on an interrupt `stop_pool` kills the workers instead of waiting for simulations
in flight. A worker also ends when its parent ends (prctl PR_SET_PDEATHSIG on Linux, else a
watcher thread), so a killed parent leaves no orphans computing.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from simulator.errors import ScenarioError

MAX_WORKERS_PER_CPU = 4
"""`--workers` at most this many simulation processes a CPU: more only add memory (a search of eight
candidates with 3,000 workers started 3,001 processes and took 11 GB)."""


def check_most_workers(workers: int | None) -> None:
    """ScenarioError naming --workers when it asks for more than MAX_WORKERS_PER_CPU a CPU."""
    most = MAX_WORKERS_PER_CPU * (os.cpu_count() or 1)
    if workers is not None and workers > most:
        raise ScenarioError(f"--workers: {workers} processes on {os.cpu_count() or 1} CPUs (at most {most}: each "
                            "holds the simulator, ~0.1-0.5 GB)")


def quiet_pool(max_workers: int, mp_context=None) -> ProcessPoolExecutor:
    """A process pool whose workers ignore SIGINT and die with this process (module docstring)."""
    return ProcessPoolExecutor(max_workers, mp_context=mp_context, initializer=start_worker,
                               initargs=(os.getpid(),))


def stop_pool(pool: ProcessPoolExecutor, abort: bool) -> None:
    """Shut `pool` down: cancel what has not started; with `abort` (an interrupt or an error) also
    end the workers at once (a simulation in flight may take minutes) instead of waiting for them."""
    if not abort:
        pool.shutdown(wait=True, cancel_futures=True)
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())  # CPython's workers, to end them
    for process in processes:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=10)


def start_worker(parent_pid: int) -> None:
    """A pool worker's start: leave Ctrl-C to the parent, and die with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)


def die_with_parent(parent_pid: int) -> None:
    """End this process when the process `parent_pid` that started it ends."""
    if sys.platform.startswith("linux"):
        try:  # the kernel sends SIGKILL when the parent dies; 1 = PR_SET_PDEATHSIG
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="ghpsim-watch-parent", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    """Exit once the parent is gone: a POSIX orphan changes parent; a spawned worker (Windows)
    sees its parent's process handle signalled."""
    parent = multiprocessing.parent_process()
    while True:
        if os.name == "posix" and os.getppid() != parent_pid:
            os._exit(1)
        if parent is not None and os.name == "nt":
            if multiprocessing.connection.wait([parent.sentinel], timeout=0.5):
                os._exit(1)
        else:
            time.sleep(0.5)
