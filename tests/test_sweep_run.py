"""Running sweeps: results equal simulate() point by point, re-runs skip finished points, the
process pool and a Dask LocalCluster give the same rows, retries of `error` rows, the CSV export
and the command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from ghpsim.cli import main
from simulator import simulate
from simulator.sweep import load_sweep, run_sweep
from simulator.sweep import runner as runner_module
from simulator.sweep.export import CSV_NAME, PARQUET_NAME, parquet_engine
from simulator.sweep.store import STORE_NAME, SweepStore

BASE = {
    "name": "tiny",
    "cluster": {"num_nodes": 2, "gpus_per_node": 2, "gpu": "V100", "inter_node_link": "10gbe"},
    "model": {"name": "mlp", "params": {"num_hidden_layers": 4}},
    "strategy": {"kind": "ghp", "num_groups": 2},
    "training": {"global_batch_size": 64},
}
AXES = {  # 3 x 2 = 6 points: G = 3 is invalid, batch 6 with G = 4 fails in the simulator
    "strategy.num_groups": [2, 3, 4],
    "training.global_batch_size": [64, 6],
}


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny_sweep", "base": BASE, "axes": AXES}, sort_keys=False))
    return path


def _expected(sweep):
    """(status, step_time_s) per point, from simulate() directly."""
    expected = []
    for point in sweep.points():
        if point.scenario is None:
            expected.append(("invalid", None))
            continue
        try:
            expected.append(("ok", simulate(point.scenario).summary["step_time_s"]))
        except Exception:
            expected.append(("failed", None))
    return expected


def _observed(frame):
    return [(row.status, None if pd.isna(row.step_time_s) else row.step_time_s) for row in frame.itertuples()]


def assert_same_points(observed, expected):
    """The same status per point, and the same step time where there is one (to rounding)."""
    assert [status for status, _ in observed] == [status for status, _ in expected]
    for (_, observed_s), (_, expected_s) in zip(observed, expected):
        assert observed_s == (None if expected_s is None else pytest.approx(expected_s))


def test_inline_run_matches_simulate_and_rerun_skips(sweep_file, tmp_path):
    sweep = load_sweep(sweep_file)
    report = run_sweep(sweep, tmp_path / "out", workers=1, progress=False)
    expected = _expected(sweep)
    assert [status for status, _ in expected] == ["ok", "ok", "invalid", "invalid", "ok", "failed"]
    assert_same_points(_observed(report.frame), expected)
    assert (report.computed, report.skipped) == (4, 0)
    assert report.counts() == {"ok": 3, "failed": 1, "error": 0, "invalid": 2, "pending": 0}
    failed = report.frame.iloc[5]
    assert failed.error.startswith("point 5: ") and "\n" not in failed.error
    with SweepStore(tmp_path / "out" / STORE_NAME) as store:
        before = store.rows()
    again = run_sweep(load_sweep(sweep_file), tmp_path / "out", workers=1, progress=False)
    assert (again.computed, again.skipped) == (0, 4)
    with SweepStore(tmp_path / "out" / STORE_NAME) as store:
        assert store.rows() == before  # nothing recomputed: same finished_at and run_id
    pd.testing.assert_frame_equal(again.frame, report.frame)


def test_csv_columns_and_values(sweep_file, tmp_path):
    report = run_sweep(load_sweep(sweep_file), tmp_path / "out", workers=1, progress=False)
    frame = pd.read_csv(tmp_path / "out" / CSV_NAME)
    assert list(frame.columns) == [
        "point", "strategy.num_groups", "training.global_batch_size", "status", "error", "key",
        "scenario", "model", "strategy", "num_gpus", "num_groups", "workers_per_group", "global_batch_size",
        "step_time_s", "throughput_samples_per_s", "speedup", "single_device_step_s", "intra_node_bytes",
        "inter_node_bytes", "peak_memory_bytes", "fits_in_memory", "sim_wall_s"]
    assert len(frame) == 6 and list(frame["point"]) == list(range(6))
    ok = frame[frame["status"] == "ok"]
    assert list(ok["num_groups"]) == list(ok["strategy.num_groups"])
    assert list(ok["workers_per_group"]) == [4 // g for g in ok["num_groups"]]
    assert list(ok["throughput_samples_per_s"]) == pytest.approx(list(ok["global_batch_size"] / ok["step_time_s"]))
    first = load_sweep(sweep_file).points()[0]
    summary = simulate(first.scenario).summary
    row = frame.iloc[0]
    assert row["key"] == first.key
    assert row["intra_node_bytes"] == pytest.approx(summary["bytes_per_tier"]["intra"])
    assert row["inter_node_bytes"] == pytest.approx(summary["bytes_per_tier"]["inter"])
    if "fits_in_memory" in summary:
        assert bool(row["fits_in_memory"]) == summary["fits_in_memory"]
    with SweepStore(tmp_path / "out" / STORE_NAME) as store:  # the full summary is stored too
        stored = store.summary(first.key)
    assert stored["step_time_s"] == summary["step_time_s"] and len(stored["devices"]) == 4
    assert report.files["csv"] == str(tmp_path / "out" / CSV_NAME)
    assert (report.files["parquet"] is None) == (parquet_engine() is None)
    assert (tmp_path / "out" / PARQUET_NAME).exists() == (parquet_engine() is not None)


def test_duplicate_points_share_one_store_row(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump({"base": BASE, "axes": {"strategy.bucket_size_bytes": ["1 MiB", 1048576]}}))
    report = run_sweep(load_sweep(path), tmp_path / "out", workers=1, progress=False)
    assert report.computed == 1 and len(report.frame) == 2
    assert report.frame["key"].nunique() == 1 and report.frame["step_time_s"].nunique() == 1
    with SweepStore(tmp_path / "out" / STORE_NAME) as store:
        assert len(store.rows()) == 1


def test_process_pool_gives_the_same_rows(sweep_file, tmp_path):
    inline = run_sweep(load_sweep(sweep_file), tmp_path / "a", workers=1, progress=False).frame
    pooled = run_sweep(load_sweep(sweep_file), tmp_path / "b", workers=2, progress=False).frame
    columns = ["point", "status", "error", "key", "step_time_s", "inter_node_bytes"]
    pd.testing.assert_frame_equal(pooled[columns], inline[columns])


def test_dask_local_cluster_gives_the_same_rows(sweep_file, tmp_path):
    distributed = pytest.importorskip("distributed")
    inline = run_sweep(load_sweep(sweep_file), tmp_path / "a", workers=1, progress=False).frame
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        report = run_sweep(load_sweep(sweep_file), tmp_path / "b", scheduler=cluster.scheduler_address,
                           progress=False)
    columns = ["point", "status", "error", "key", "step_time_s", "inter_node_bytes"]
    pd.testing.assert_frame_equal(report.frame[columns], inline[columns])
    assert report.computed == 4


def test_unexpected_errors_are_recorded_and_retried(sweep_file, tmp_path, monkeypatch, capsys):
    real = runner_module.simulate

    def flaky(scenario):
        if scenario.strategy.num_groups == 4:
            raise RuntimeError("boom\nsecond line")
        return real(scenario)

    monkeypatch.setattr(runner_module, "simulate", flaky)
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--workers", "1", "--json",
                 "--no-progress"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert (document["ok"], document["error"], document["computed"]) == (2, 2, 4)
    assert {p["error"] for p in document["problems"] if p["status"] == "error"} == {"RuntimeError: boom second line"}
    monkeypatch.setattr(runner_module, "simulate", real)
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--workers", "1", "--json",
                 "--no-progress"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["ok"], document["failed"], document["error"]) == (3, 1, 0)
    assert (document["computed"], document["skipped"]) == (2, 2)


def test_cli_human_output_and_json(sweep_file, tmp_path, capsys):
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "sweep tiny_sweep: 6 points: 3 ok, 1 failed, 2 invalid; computed 4" in captured.out
    assert "does not divide the 4 GPUs" in captured.out
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["points"] == 6 and document["skipped"] == 4 and document["computed"] == 0
    assert document["files"]["csv"].endswith(CSV_NAME)


def test_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "clash" / CSV_NAME).mkdir(parents=True)  # refused before any point runs: no store left
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"base": BASE, "axes": {"cluster.nodes": [1]}}))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"base": BASE, "axes": {"cluster.num_nodes": [1]}}))
    for argv, message in [
        (["sweep", str(bad), "--out", str(tmp_path / "o")], "'cluster.nodes' is not a scenario field"),
        (["sweep", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")], "file not found"),
        (["sweep", str(good), "--out", str(tmp_path / "file")], "exists and is not a folder"),
        (["sweep", str(good), "--out", str(tmp_path / "clash")], "its results.csv exists and is not a file"),
        (["sweep", str(good), "--out", str(tmp_path / "o"), "--workers", "0"], "--workers: 0"),
        (["sweep", str(good), "--out", str(tmp_path / "o"), "--scheduler", "nonsense://x"], "not a scheduler address"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert sorted(path.name for path in (tmp_path / "clash").iterdir()) == [CSV_NAME]
