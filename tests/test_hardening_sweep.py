"""The sweep store and pool under abuse (issue 75, items 6 and 7): an empty, edited or bit-flipped
store is refused (never silently reused), a second sweep on the same folder refuses, and pool
workers die with a SIGKILLed sweep."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.sweep.store import STORE_NAME, SweepStore, row_checksum

ROOT = Path(__file__).resolve().parent.parent
OUTCOME = {"status": "ok", "error": None, "summary_json": '{"step_time_s":0.5,"devices":[]}',
           "figures": {"step_time_s": 0.5}, "wall_s": 0.01}
LINUX_PROC = Path("/proc/self/stat").is_file()


def _filled_store(path: Path, rows: int = 300) -> None:
    with SweepStore(path) as store:
        for index in range(rows):
            store.put(f"key{index:04d}", '{"point":%d}' % index, {**OUTCOME, "figures": {"step_time_s": index}})
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()


def _refused(path: Path, *needles: str) -> str:
    before = path.read_bytes()
    with pytest.raises(ScenarioError) as caught:
        SweepStore(path)
    text = str(caught.value)
    assert "\n" not in text and all(needle in text for needle in needles), text
    assert path.read_bytes() == before  # never overwritten
    return text


def test_zero_byte_store_is_refused(tmp_path):
    path = tmp_path / STORE_NAME
    path.write_bytes(b"")
    _refused(path, "empty file (0 bytes)")


def test_an_edited_row_fails_its_checksum(tmp_path):
    path = tmp_path / STORE_NAME
    _filled_store(path, rows=5)
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("UPDATE results SET figures_json = '{\"step_time_s\":99}' WHERE key = 'key0003'")
    connection.close()
    _refused(path, "1 row(s) do not match their checksum", "key0003")


@pytest.mark.parametrize("seed", range(5))
def test_random_byte_flips_are_detected(tmp_path, seed):
    path = tmp_path / STORE_NAME
    _filled_store(path)
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for offset in rng.sample(range(4096, len(data)), 20):  # past the first page (the schema)
        data[offset] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    _refused(path, "not a usable ghpsim sweep store")


def test_rows_are_stored_with_their_checksum(tmp_path):
    path = tmp_path / STORE_NAME
    _filled_store(path, rows=3)
    connection = sqlite3.connect(path)
    columns = ("key, status, error, scenario_json, summary_json, figures_json, sim_wall_s, finished_at, run_id")
    for row in connection.execute(f"SELECT {columns}, checksum FROM results"):
        assert row[-1] == row_checksum(row[:-1])
    connection.close()
    with SweepStore(path) as store:  # verified on reopening
        assert store.done_keys() == {"key0000", "key0001", "key0002"}


def test_a_store_from_before_checksums_is_upgraded(tmp_path):
    path = tmp_path / STORE_NAME
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("CREATE TABLE ghpsim_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        connection.execute("CREATE TABLE results (key TEXT PRIMARY KEY, status TEXT NOT NULL, error TEXT,"
                           " scenario_json TEXT NOT NULL, summary_json TEXT, figures_json TEXT, sim_wall_s REAL,"
                           " finished_at REAL NOT NULL, run_id TEXT NOT NULL)")
        connection.executemany("INSERT INTO ghpsim_meta VALUES (?, ?)",
                               [("schema", "ghpsim-sweep-store"), ("schema_version", "1")])
        connection.execute("INSERT INTO results VALUES ('old', 'ok', NULL, '{}', NULL, NULL, 0.1, 1.0, 'r')")
    connection.close()
    with SweepStore(path) as store:
        assert store.done_keys() == {"old"}
    with SweepStore(path) as store:  # the checksums written by the upgrade verify
        assert store.rows()["old"]["run_id"] == "r"


def test_a_second_store_on_the_same_file_refuses(tmp_path):
    path = tmp_path / STORE_NAME
    with SweepStore(path):
        with pytest.raises(ScenarioError, match=f"in use by another ghpsim sweep \\(process {os.getpid()}\\)"):
            SweepStore(path)
    with SweepStore(path):  # released on close
        pass


def test_a_second_sweep_on_the_same_out_exits_2(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: {model: {name: mlp}, training: {global_batch_size: 8}}\naxes: {cluster.gpus_per_node: [1]}\n")
    out = tmp_path / "out"
    out.mkdir()
    with SweepStore(out / STORE_NAME):  # the first sweep, still running
        assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in use by another ghpsim sweep" in err


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it has already died)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until_gone(pids: set[int], limit_s: float) -> set[int]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    return {pid for pid in pids if _alive(pid)}


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_sigkill_of_a_sweep_leaves_no_pool_worker(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    base = {"cluster": {"num_nodes": 2, "gpus_per_node": 2}, "model": {"name": "mlp"},
            "strategy": {"kind": "ghp", "num_groups": 2}, "training": {"global_batch_size": 8}}
    sweep.write_text(yaml.safe_dump({"base": base, "axes": {
        "training.global_batch_size": {"start": 8, "stop": 8 * 2000, "step": 8}}}))
    process = subprocess.Popen([sys.executable, "-m", "ghpsim", "sweep", str(sweep), "--out", str(tmp_path / "out"),
                                "--workers", "2", "--no-progress"], cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(process.pid)) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "no pool workers after 60 s"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)  # the sweep alone, not its process group
        process.wait()
        assert _wait_until_gone(workers, 10.0) == set()
    finally:
        if process.poll() is None:
            process.kill()
        for pid in filter(_alive, workers):  # a failed check must not leave them running
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_watchdog_ends_a_worker_without_the_linux_death_signal(tmp_path):
    """The portable path (no PR_SET_PDEATHSIG): the watchdog thread notices the parent is gone."""
    script = textwrap.dedent("""
        import multiprocessing, os, sys, time
        import simulator.worker_pool as worker_pool

        def child(parent_pid):
            sys.platform = "darwin"  # skip the Linux-only death signal
            worker_pool.die_with_parent(parent_pid)
            time.sleep(120)

        if __name__ == "__main__":
            worker = multiprocessing.get_context("fork").Process(target=child, args=(os.getpid(),))
            worker.start()
            print(worker.pid, flush=True)
            time.sleep(120)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    worker = int(process.stdout.readline())
    try:
        time.sleep(0.3)  # the watchdog thread is running
        assert _alive(worker)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert _wait_until_gone({worker}, 10.0) == set()
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)
