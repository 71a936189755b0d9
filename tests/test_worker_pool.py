"""Pools of `rank` and `validate --rank`: workers leave Ctrl-C to the parent, and an aborted pool
ends its workers instead of waiting for the simulations in flight."""

from __future__ import annotations

import signal
import time

from simulator.worker_pool import quiet_pool, stop_pool


def _sigint_handler():
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_workers_ignore_sigint():
    pool = quiet_pool(1)
    try:
        assert pool.submit(_sigint_handler).result(timeout=60) is True
    finally:
        stop_pool(pool, abort=False)


def test_an_aborted_pool_ends_its_busy_workers_at_once():
    pool = quiet_pool(2)
    futures = [pool.submit(_sleep, 600) for _ in range(3)]
    while not any(future.running() for future in futures):
        time.sleep(0.05)
    processes = list(pool._processes.values())
    started = time.perf_counter()
    stop_pool(pool, abort=True)
    assert time.perf_counter() - started < 30  # not the 600 s a worker was asleep for
    assert processes and all(not process.is_alive() for process in processes)
    assert futures[-1].cancelled() or futures[-1].done()


def test_a_finished_pool_waits_for_its_results():
    pool = quiet_pool(1)
    future = pool.submit(_sleep, 0.2)
    stop_pool(pool, abort=False)
    assert future.result() == 0.2
