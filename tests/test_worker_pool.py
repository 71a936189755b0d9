"""Pools of `rank` and `validate --rank`: workers leave Ctrl-C to the parent, and an aborted pool
ends its workers instead of waiting for the simulations in flight."""

from __future__ import annotations

import os
import signal
import time

import pytest

from simulator.worker_pool import quiet_pool, stop_pool


def _sigint_handler():
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _ended(pid: int, within_s: float = 30.0) -> bool:
    """Whether process `pid` has ended (gone, or a zombie not reaped yet) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_workers_ignore_sigint():
    pool = quiet_pool(1)
    try:
        assert pool.submit(_sigint_handler).result(timeout=60) is True
    finally:
        stop_pool(pool, abort=False)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_an_aborted_pool_ends_its_busy_workers_at_once():
    pool = quiet_pool(2)
    futures = [pool.submit(_sleep, 600) for _ in range(3)]
    while not any(future.running() for future in futures):
        time.sleep(0.05)
    processes = list(pool._processes.values())
    started = time.perf_counter()
    stop_pool(pool, abort=True)
    assert time.perf_counter() - started < 30  # not the 600 s a worker was asleep for
    assert processes and all(_ended(process.pid) for process in processes)


def test_a_finished_pool_waits_for_its_results():
    pool = quiet_pool(1)
    future = pool.submit(_sleep, 0.2)
    stop_pool(pool, abort=False)
    assert future.result() == 0.2
