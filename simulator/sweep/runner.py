"""Run a sweep: simulate the points not yet in the store, in parallel, committing each as it ends.

Executors: in-process (one worker), a local process pool (concurrent.futures; forked workers
inherit the imported simulator), or an existing dask.distributed cluster (`--scheduler`). Pool
workers die with the sweep, however it ends (SIGKILL included): on Linux the kernel kills them
(PR_SET_PDEATHSIG); elsewhere a watchdog thread in each worker exits when the parent is gone.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from simulator.errors import ScenarioError, SimulationError
from simulator.progress import stderr_progress
from simulator.scenario import Scenario
from simulator.simulate import simulate
from simulator.sweep.export import CSV_NAME, PARQUET_NAME, export_frame, results_frame, summary_figures
from simulator.sweep.spec import Sweep, canonical_json
from simulator.sweep.store import STORE_NAME, SweepStore
from simulator.output import check_output_file, check_output_folder
from simulator.worker_pool import check_most_workers, quiet_pool, stop_pool


def evaluate(scenario: Scenario) -> dict:
    """Simulate one point (runs in a worker). User-level failures are results, not exceptions. The
    summary is serialised here, in the worker, to keep the committing process light."""
    started = time.perf_counter()
    outcome = {"status": "ok", "error": None, "summary_json": None, "figures": None}
    try:
        summary = simulate(scenario).summary
        outcome.update(summary_json=json.dumps(summary, separators=(",", ":")), figures=summary_figures(summary))
    except (ScenarioError, SimulationError) as error:
        outcome.update(status="failed", error=" ".join(str(error).split()))
    except Exception as error:  # a bug must not end the sweep; stored as `error` and retried on re-run
        outcome.update(status="error", error=f"{type(error).__name__}: {' '.join(str(error).split())}")
    outcome["wall_s"] = time.perf_counter() - started
    return outcome


@dataclass
class SweepReport:
    name: str
    out_dir: Path
    frame: pd.DataFrame
    computed: int
    skipped: int
    wall_s: float
    files: dict[str, str | None] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        counts = self.frame["status"].value_counts()
        return {status: int(counts.get(status, 0)) for status in ("ok", "failed", "error", "invalid", "pending")}

    def to_dict(self) -> dict:
        bad = self.frame[self.frame["status"] != "ok"]
        return {"sweep": self.name, "points": len(self.frame), **self.counts(), "computed": self.computed,
                "skipped": self.skipped, "wall_s": self.wall_s,
                "points_per_s": self.computed / self.wall_s if self.wall_s > 0 else None,
                "files": self.files,
                "problems": [{"point": int(row.point), "status": row.status,
                              "error": None if pd.isna(row.error) else row.error}  # strict JSON: no NaN
                             for row in bad.head(20).itertuples()]}


def run_sweep(sweep: Sweep, out_dir: str | Path, workers: int | None = None, scheduler: str | None = None,
              progress: bool = True) -> SweepReport:
    """Simulate every point of `sweep` not already in DIR's store, then export the results."""
    if workers is not None and workers < 1:
        raise ScenarioError(f"--workers: {workers} (expected at least 1)")
    check_most_workers(workers)
    if scheduler is not None:
        check_scheduler_address(scheduler)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"--out {out}: exists and is not a folder")
    check_output_folder(out, "--out")  # a folder that cannot be made or written is refused by name
    for name in (CSV_NAME, PARQUET_NAME, STORE_NAME):  # a results file the run could not write: before any work
        if (out / name).exists() and not (out / name).is_file():
            raise ScenarioError(f"--out {out}: its {name} exists and is not a file")
    check_output_file(out / CSV_NAME, "--out")
    points = sweep.points()  # every point built (a bad axis value is refused) before anything is written
    created, stored = not out.exists(), 0
    out.mkdir(parents=True, exist_ok=True)
    try:
        with SweepStore(out / STORE_NAME) as store:
            done = store.done_keys()
            tasks = {point.key: point.scenario for point in points if point.key and point.key not in done}
            skipped = len({point.key for point in points if point.key and point.key in done})
            started = time.perf_counter()
            if tasks:
                results = start_executor(list(tasks.items()), workers, scheduler)
                try:
                    with _progress_bar(len(tasks), sweep.spec.name, progress) as advance:
                        for key, outcome in results:
                            store.put(key, canonical_json(tasks[key]), outcome)
                            stored += 1
                            advance()
                finally:
                    results.close()  # stops the pool or the Dask client at once, also on Ctrl-C
            wall_s = time.perf_counter() - started
            rows = store.rows()
    except BaseException:
        if created and stored == 0:  # nothing to resume: leave no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    frame = results_frame(sweep, points, rows)
    files = export_frame(frame, out)
    return SweepReport(sweep.spec.name, out, frame, len(tasks), skipped, wall_s,
                       {"store": str(out / STORE_NAME), **files})


def start_executor(tasks: list[tuple[str, Scenario]], workers: int | None, scheduler: str | None):
    """Submit every task now (before any progress thread starts) and return an iterator of
    (key, outcome) in completion order."""
    if scheduler is not None:
        return _run_dask(tasks, scheduler)
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(tasks) == 1:
        return ((key, evaluate(scenario)) for key, scenario in tasks)
    return _run_pool(tasks, min(workers, len(tasks)))


def _run_pool(tasks, workers: int):
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool = quiet_pool(workers, mp_context=context)
    futures = {pool.submit(evaluate, scenario): key for key, scenario in tasks}
    return _drain_pool(pool, futures)


def _drain_pool(pool: ProcessPoolExecutor, futures: dict):
    try:
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except BrokenProcessPool:
                raise SimulationError("sweep: a worker process died (out of memory?); finished points are "
                                      "in the store, re-run to resume") from None
            yield futures[future], outcome
    finally:
        stop_pool(pool, abort=False)  # points are short: the running ones finish into the store


_SCHEDULER_ADDRESS = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})")
"""tcp://HOST:PORT, HOST a name, an IPv4 address or a bracketed IPv6 address (what the docs promise)."""
_INPROC_ADDRESS = re.compile(r"inproc://[^/\s]+/([0-9]{1,10})/[0-9]+")
"""An in-process scheduler's address (ip/pid/n): `run_sweep` callers' LocalCluster(processes=False)."""


def check_scheduler_address(address: str) -> None:
    """Refuse a --scheduler that is not tcp://HOST:PORT (port 1-65535) before anything connects:
    dask's Client, given a malformed address, fails late and leaves a traceback at exit. An
    inproc:// address of this very process (a scheduler the caller started in it) is accepted too."""
    if not address.strip():
        raise ScenarioError(f"--scheduler {address!r}: empty address (expected tcp://HOST:PORT, e.g. "
                            "tcp://host:8786; leave --scheduler out to run locally)")
    in_process = _INPROC_ADDRESS.fullmatch(address)
    if in_process is not None and int(in_process[1]) == os.getpid():
        return
    match = _SCHEDULER_ADDRESS.fullmatch(address)
    if match is None or not 1 <= int(match[2]) <= 65535:
        raise ScenarioError(f"--scheduler {address!r}: not a scheduler address (expected tcp://HOST:PORT with "
                            "a port 1-65535, e.g. tcp://host:8786)")


def _run_dask(tasks, address: str):
    try:
        from distributed import Client
    except ImportError:
        raise ScenarioError("--scheduler: dask.distributed is not installed "
                            "(pip install 'dask[distributed]')") from None
    check_scheduler_address(address)
    try:
        client = Client(address, timeout=10, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise ScenarioError(f"--scheduler {address}: cannot connect ({' '.join(str(error).split())})") from None
    try:
        keys = [key for key, _ in tasks]
        futures = client.map(evaluate, [scenario for _, scenario in tasks],
                             key=[f"ghpsim-sweep-{key}" for key in keys])
        return _DaskResults(client, futures, {future.key: key for future, key in zip(futures, keys)})
    except BaseException:
        client.close()
        raise


class _DaskResults:
    """(key, outcome) pairs as the Dask futures finish; `close()` closes the client even when the
    iteration never started (a generator's `finally` would not run then)."""

    def __init__(self, client, futures: list, keys: dict):
        self.client = client
        self.results = _drain_dask(client, futures, keys)

    def __iter__(self):
        return self.results

    def close(self) -> None:
        """Stop iterating and close the client (closing twice is harmless)."""
        try:
            self.results.close()
        finally:
            self.client.close()


def _drain_dask(client, futures: list, keys: dict):
    from distributed import as_completed as dask_completed
    try:
        for future in dask_completed(futures, loop=client.loop):
            try:
                outcome = future.result()
            except Exception as error:  # a lost worker (KilledWorker) or a cancelled task: retried on re-run
                outcome = {"status": "error", "error": f"{type(error).__name__}: {' '.join(str(error).split())}",
                           "wall_s": None}
            future.release()
            yield keys[future.key], outcome
    finally:
        client.close()


class _progress_bar:
    """A rich progress bar with ETA on stderr; `advance()` per finished point."""

    def __init__(self, total: int, name: str, enabled: bool):
        self.progress = stderr_progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                        enabled=enabled, transient=False)
        self.task = self.progress.add_task(name, total=total)

    def __enter__(self):
        self.progress.start()
        return lambda: self.progress.advance(self.task)

    def __exit__(self, *exc):
        self.progress.stop()
