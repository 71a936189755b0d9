"""`ghpsim sweep` polish: a finished or failed sweep leaves no lock file (a killed one's is taken
over), and integer fields are integer columns (4, not 4.0) in the CSV and the frame."""

from __future__ import annotations

import csv
import os

import pandas as pd
import pytest
import yaml

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.sweep import load_sweep, run_sweep
from simulator.sweep import store as store_module
from simulator.sweep.export import CSV_NAME, INTEGER_FIGURES
from simulator.sweep.spec import integer_field
from simulator.sweep.store import STORE_NAME, SweepStore, take_lock

BASE = {"name": "polish", "cluster": {"num_nodes": 2, "gpus_per_node": 2, "inter_node_link": "10gbe"},
        "model": {"name": "mlp", "params": {"num_hidden_layers": 4}},
        "strategy": {"kind": "ghp", "num_groups": 2}, "training": {"global_batch_size": 8}}


def _sweep_file(tmp_path, axes: dict):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "polish", "base": BASE, "axes": axes}, sort_keys=False))
    return path


def _lock(out):
    return out / f"{STORE_NAME}.lock"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_finished_sweep_leaves_no_lock(tmp_path, capsys, workers):
    sweep = _sweep_file(tmp_path, {"training.global_batch_size": [8, 16, 32]})
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", workers, "--no-progress"]) == 0
    assert sorted(path.name for path in out.iterdir()) == sorted([STORE_NAME, CSV_NAME] + (
        ["results.parquet"] if (out / "results.parquet").exists() else []))
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", workers, "--no-progress"]) == 0  # a re-run
    assert not _lock(out).exists()
    assert "3 already in the store" in capsys.readouterr().out


def test_a_sweep_refusing_its_store_leaves_no_lock(tmp_path, capsys):
    sweep = _sweep_file(tmp_path, {"training.global_batch_size": [8]})
    out = tmp_path / "out"
    out.mkdir()
    (out / STORE_NAME).write_bytes(b"not a database")
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a SQLite database" in err and "Traceback" not in err
    assert sorted(path.name for path in out.iterdir()) == [STORE_NAME]
    assert (out / STORE_NAME).read_bytes() == b"not a database"


def test_a_store_failing_to_open_releases_and_removes_its_lock(tmp_path):
    path = tmp_path / STORE_NAME
    path.write_bytes(b"")
    with pytest.raises(ScenarioError, match="empty file"):
        SweepStore(path)
    assert not _lock(tmp_path).exists()
    path.unlink()
    with SweepStore(path):  # not held by the failed attempt
        assert _lock(tmp_path).read_text() == str(os.getpid())
    assert not _lock(tmp_path).exists()


def test_a_killed_sweeps_lock_file_is_taken_over(tmp_path):
    sweep = _sweep_file(tmp_path, {"training.global_batch_size": [8, 16]})
    out = tmp_path / "out"
    out.mkdir()
    _lock(out).write_text("999999")  # left by a sweep killed with SIGKILL: no process holds it
    report = run_sweep(load_sweep(sweep), out, workers=1, progress=False)
    assert report.counts()["ok"] == 2
    assert not _lock(out).exists()


def test_a_held_lock_still_refuses_and_close_is_idempotent(tmp_path):
    path = tmp_path / STORE_NAME
    lock = take_lock(path)
    with pytest.raises(ScenarioError, match=f"in use by another ghpsim sweep \\(process {os.getpid()}\\)"):
        take_lock(path)
    assert _lock(tmp_path).exists()  # a refused attempt does not remove the holder's file
    lock.close()
    lock.close()
    assert not _lock(tmp_path).exists()


def test_a_lock_file_removed_by_its_holder_is_taken_again(tmp_path, monkeypatch):
    """Opened just before its holder removed it: the lock taken on the removed file is dropped and
    the file now at the path is locked instead."""
    path = tmp_path / STORE_NAME
    opened = store_module._open_locked
    calls = []

    def open_then_lose_race(lock_path, store_path):
        handle = opened(lock_path, store_path)
        calls.append(lock_path)
        if len(calls) == 1:
            lock_path.unlink()  # the holder released it between our open and our lock
        return handle

    monkeypatch.setattr(store_module, "_open_locked", open_then_lose_race)
    lock = take_lock(path)
    assert len(calls) == 2 and _lock(tmp_path).read_text() == str(os.getpid())
    monkeypatch.undo()
    with pytest.raises(ScenarioError, match="in use by another ghpsim sweep"):
        take_lock(path)  # the file at the path is the one held
    lock.close()


def test_an_unopenable_lock_file_is_one_line(tmp_path, capsys):
    sweep = _sweep_file(tmp_path, {"training.global_batch_size": [8]})
    out = tmp_path / "out"
    _lock(out).mkdir(parents=True)
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lock file" in err and "--out" in err and "Traceback" not in err
    assert not (out / CSV_NAME).exists()


def test_integer_fields_given_as_floats_are_integer_columns(tmp_path):
    sweep = _sweep_file(tmp_path, {"strategy.num_groups": {"start": 1.0, "stop": 4, "factor": 2},
                                   "cluster.num_nodes": [2, 4.0],
                                   "training.allocator_fragmentation": [0.0]})
    out = tmp_path / "out"
    report = run_sweep(load_sweep(sweep), out, workers=1, progress=False)
    frame = report.frame
    for column in ("strategy.num_groups", "cluster.num_nodes", *INTEGER_FIGURES):
        assert str(frame[column].dtype) == "Int64", column
    assert list(frame["strategy.num_groups"]) == [1, 1, 2, 2, 4, 4]
    with (out / CSV_NAME).open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert [row["strategy.num_groups"] for row in rows] == ["1", "1", "2", "2", "4", "4"]
    assert [row["cluster.num_nodes"] for row in rows] == ["2", "4"] * 3
    ran = [row for row in rows if row["status"] == "ok"]
    assert len(ran) >= 4 and {row["num_gpus"] for row in ran} == {"4", "8"}
    assert {row["num_groups"] for row in ran} <= {"1", "2", "4"}
    assert {row["training.allocator_fragmentation"] for row in rows} == {"0.0"}  # a real-valued field stays
    assert all("." in row["step_time_s"] for row in ran)
    read = pd.read_csv(out / CSV_NAME)
    assert read["strategy.num_groups"].dtype.kind == "i" and read["cluster.num_nodes"].dtype.kind == "i"


def test_count_columns_are_integers_when_no_point_ran(tmp_path):
    sweep = _sweep_file(tmp_path, {"strategy.num_groups": [3.0, 5.0]})  # neither divides 4 GPUs: invalid
    out = tmp_path / "out"
    report = run_sweep(load_sweep(sweep), out, workers=1, progress=False)
    assert report.counts()["invalid"] == 2
    for column in ("strategy.num_groups", *INTEGER_FIGURES):
        assert str(report.frame[column].dtype) == "Int64", column
    assert list(report.frame["strategy.num_groups"]) == [3, 5]
    assert "3.0" not in (out / CSV_NAME).read_text()


@pytest.mark.parametrize(("dotted", "expected"), [
    ("strategy.num_groups", True), ("cluster.num_nodes", True), ("training.global_batch_size", True),
    ("training.allocator_fragmentation", False), ("strategy.kind", False), ("cluster.inter_node_link", False),
    ("model.params.num_hidden_layers", False), ("cluster.nope", False)])
def test_integer_field_follows_the_schema(dotted, expected):
    assert integer_field(dotted) is expected
