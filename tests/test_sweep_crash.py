"""A sweep killed with SIGKILL mid-run and run again loses nothing that had finished: every point
is present exactly once, and the rows committed before the kill are not recomputed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from simulator.errors import ScenarioError
from simulator.sweep import load_sweep, run_sweep
from simulator.sweep.export import CSV_NAME
from simulator.sweep.store import STORE_NAME, take_lock

ROOT = Path(__file__).resolve().parent.parent
NUM_POINTS = 120
BASE = {
    "name": "crash",
    "cluster": {"num_nodes": 2, "gpus_per_node": 2, "inter_node_link": "10gbe"},
    "model": {"name": "mlp", "params": {"num_hidden_layers": 4}},
    "strategy": {"kind": "ghp", "num_groups": 2},
    "training": {"global_batch_size": 8},
}


def _finished_rows(path: Path) -> dict[str, tuple]:
    if not path.is_file() or path.stat().st_size == 0:
        return {}
    connection = sqlite3.connect(path, timeout=10)
    try:
        return {key: (finished_at, run_id) for key, finished_at, run_id in
                connection.execute("SELECT key, finished_at, run_id FROM results")}
    except sqlite3.OperationalError:  # tables not created yet
        return {}
    finally:
        connection.close()


def _wait_for_lock(store_path: Path, timeout_s: float = 30.0) -> None:
    """Until the killed sweep's store lock is free: its pool workers hold the lock file's descriptor
    until they exit, a little after their parent on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            take_lock(store_path).close()
            return
        except ScenarioError:
            assert time.monotonic() < deadline, f"{store_path}: still locked {timeout_s:.0f} s after SIGKILL"
            time.sleep(0.02)


def test_sigkill_mid_run_then_rerun_loses_nothing(tmp_path):
    sweep_path = tmp_path / "sweep.yaml"
    sweep_path.write_text(yaml.safe_dump({"base": BASE, "axes": {
        "training.global_batch_size": {"start": 8, "stop": 8 * NUM_POINTS, "step": 8}}}))
    out = tmp_path / "out"
    store_path = out / STORE_NAME
    process = subprocess.Popen([sys.executable, "-m", "ghpsim", "sweep", str(sweep_path), "--out", str(out),
                                "--workers", "2", "--no-progress"], cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(_finished_rows(store_path)) < 3:
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no rows after 60 s"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the sweep and its pool workers (its own session)
        process.wait()
        _wait_for_lock(store_path)
    assert process.returncode == -signal.SIGKILL
    before = _finished_rows(store_path)
    assert 3 <= len(before) < NUM_POINTS, "the sweep must be killed mid-run"
    assert not (out / CSV_NAME).exists()

    report = run_sweep(load_sweep(sweep_path), out, workers=2, progress=False)
    assert (report.skipped, report.computed) == (len(before), NUM_POINTS - len(before))
    after = _finished_rows(store_path)
    assert len(after) == NUM_POINTS
    assert {key: after[key] for key in before} == before  # same finished_at and run_id: not recomputed
    frame = pd.read_csv(out / CSV_NAME)
    assert list(frame["point"]) == list(range(NUM_POINTS))
    assert frame["key"].is_unique and set(frame["key"]) == set(after)
    assert (frame["status"] == "ok").all()
    assert list(frame["training.global_batch_size"]) == list(range(8, 8 * NUM_POINTS + 1, 8))
