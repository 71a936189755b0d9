"""End to end on this machine: calibrate from microbenchmarks, then validate real dp and mp runs
against the prediction. A quick version with a loose bound (CI machines are noisy); the real
figures come from benchmarks/bench_validation.py and are quoted in the README."""

import json

import pandas as pd
import pytest

pytest.importorskip("torch")

from simulator.compare import with_strategy  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.profile_costs import profile_costs  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from validator.cli import main  # noqa: E402

SCENARIO = "scenarios/validation/mlp_cpu.yaml"
SMALL = ["--set", "cluster.gpus_per_node=2", "--set", "model.params.hidden_dim=256",
         "--set", "model.params.num_hidden_layers=3"]


def test_calibrate_then_validate_reports_errors_within_a_loose_bound(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    assert main(["calibrate", "--scenario", SCENARIO, *SMALL, "--world-size", "2", "--out", str(profile),
                 "--batch-sizes", "8,32", "--repeats", "5", "--layer-passes", "2",
                 "--jitter-passes", "3"]) == 0
    capsys.readouterr()
    out = tmp_path / "validation"

    def validate() -> dict:
        assert main(["validate", SCENARIO, *SMALL, "--profile", str(profile), "--strategies", "dp,mp",
                     "--steps", "4", "--warmup", "2", "--repeats", "2", "--speed-anchor", "2", "--out", str(out),
                     "--bracket", "--interleave", "2", "--step-spans", "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    report = validate()
    if not all(_within_loose_bound(row) for row in report["rows"]):
        # a slow spell of the shared 2-core host (CI, 2026-11-24: a measured step over 2.5x its
        # prediction, which neither the speed anchor nor the calibration after the runs saw):
        # measure once more; a slip in units or accounting misses the bound both times
        report = validate()
    assert [row["kind"] for row in report["rows"]] == ["dp", "mp"]
    for row in report["rows"]:
        assert row["measured_s"] > 0 and row["predicted_s"] > 0
        assert _within_loose_bound(row), row
        # the prediction under the profile's pass jitter: a median inside its own 10-90 % band,
        # set beside the measured steps' band
        assert row["predicted_p10_s"] <= row["predicted_jitter_s"] <= row["predicted_p90_s"]
        assert row["measured_p10_s"] <= row["measured_s"] <= row["measured_p90_s"]
        assert row["jitter_ranks_at_once"] == 2
        # two launches pooled: the median of all 8 steps lies between the launches' own medians
        assert row["launches"] == 2
        assert row["launch_median_min_s"] <= row["measured_s"] <= row["launch_median_max_s"]
        assert row["launch_spread_pct"] == pytest.approx(
            100 * (row["launch_median_max_s"] - row["launch_median_min_s"]) / row["measured_s"])
        # two launches: the standard error of their mean is half their difference
        assert row["launch_noise_pct"] == pytest.approx(row["launch_spread_pct"] / 2)
        # the speed anchor: a ratio per launch, the case's their median, and the plan re-simulated
        # with compute scaled by it
        assert 0.2 < row["speed_ratio_min"] <= row["speed_ratio"] <= row["speed_ratio_max"] < 5
        assert row["anchored_predicted_s"] == pytest.approx(_resimulated_s(profile, row["kind"], row["speed_ratio"]))
        assert row["anchored_error_pct"] == pytest.approx(
            100 * (row["anchored_predicted_s"] - row["measured_s"]) / row["measured_s"])
        # --bracket: a second calibration with the first's settings, pooled, predicts beside it
        assert row["bracketed_predicted_s"] == pytest.approx(_pooled_prediction_s(profile, row["kind"]))
        assert row["bracketed_error_pct"] == pytest.approx(
            100 * (row["bracketed_predicted_s"] - row["measured_s"]) / row["measured_s"])
        # --interleave 2: one one-sweep slice after the second round, pooled with the profile
        assert row["interleaved_predicted_s"] == pytest.approx(
            _pooled_prediction_s(profile, row["kind"], "profile_interleaved.json"))
        assert row["interleaved_jitter_error_pct"] == pytest.approx(
            100 * (row["interleaved_predicted_jitter_s"] - row["measured_s"]) / row["measured_s"])
    after = json.loads((tmp_path / "profile_after.json").read_text())
    assert after["method"]["settings"]["batch_sizes"] == [8, 32] and after["method"]["settings"]["repeats"] == 5
    assert json.loads((tmp_path / "profile_bracketed.json").read_text())["merged_from"] == [
        json.loads(profile.read_text())["created_utc"], after["created_utc"]]
    piece = json.loads((tmp_path / "profile_slice1.json").read_text())
    assert piece["method"]["settings"]["layer_passes"] == 1 and piece["method"]["settings"]["repeats"] == 5
    assert not (tmp_path / "profile_slice2.json").exists()
    assert json.loads((tmp_path / "profile_interleaved.json").read_text())["merged_from"] == [
        json.loads(profile.read_text())["created_utc"], piece["created_utc"]]
    assert (out / "mlp_cpu.png").is_file()
    table = pd.read_csv(out / "mlp_cpu.csv")  # one row per strategy, the later round replacing the first
    assert list(table["kind"]) == ["dp", "mp"] and list(table["launches"]) == [2, 2]
    assert len(list((out / "traces").glob("*.trace.json"))) == 4
    _check_step_spans(out / "traces")


def _within_loose_bound(row: dict) -> bool:
    """A few-millisecond step on a shared 2-core box: one calibration taken in a slow or fast moment
    is off by a factor (CI once saw +76 %), so the plain figure only has to be within a factor of 2.5
    (a unit or accounting slip is off by far more); the bracketed prediction, which pools a
    calibration before and after the runs, is held to the loose bound."""
    return 0.4 < row["predicted_s"] / row["measured_s"] < 2.5 and abs(row["bracketed_error_pct"]) < 75


def _check_step_spans(folder) -> None:
    """--step-spans: every measured step (2 launches x 4 steps) of both ranks, and the trace's median
    step among them, span for span."""
    for stem, message_stream in (("dp_G2xM1", "comm"), ("mp_G1xM2", "send")):
        steps = pd.read_csv(folder / f"{stem}.steps.csv")
        assert sorted(steps.groupby(["launch", "rank"])["step"].nunique().items()) == [
            ((launch, rank), 4) for launch in (0, 1) for rank in (0, 1)]
        assert (steps["duration_s"] >= 0).all() and (steps["end_s"] > steps["start_s"] - 1e-12).all()
        events = json.loads((folder / f"{stem}.measured.trace.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        traced = sorted((e["pid"], e["name"]) for e in events if e.get("ph") == "X")
        per_step = {key: sorted(zip(group["rank"], group["name"]))
                    for key, group in steps.groupby(["launch", "step"])}
        assert traced in per_step.values()  # the same passes and messages as every step
        first = steps[(steps["launch"] == 0) & (steps["step"] == 0)]
        assert {"compute", message_stream} <= set(first["stream"])
        # every compute span carries its main thread's CPU time, at most its wall time; no other span does
        compute = steps["stream"] == "compute"
        assert steps.loc[compute, "cpu_s"].notna().all() and steps.loc[~compute, "cpu_s"].isna().all()
        assert (steps.loc[compute, "cpu_s"] > 0).all()
        assert (steps.loc[compute, "cpu_s"] <= steps.loc[compute, "duration_s"] + 1e-3).all()


def _pooled_prediction_s(profile, kind: str, pooled: str = "profile_bracketed.json") -> float:
    scenario = load_scenario(SCENARIO, [item for item in SMALL if item != "--set"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = profile_costs(str(profile.with_name(pooled)), workload)
    return simulate(with_strategy(scenario, kind, None), costs=costs, workload=workload).step_time_s


def _resimulated_s(profile, kind: str, speed_factor: float) -> float:
    scenario = load_scenario(SCENARIO, [item for item in SMALL if item != "--set"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = profile_costs(str(profile), workload)
    costs.speed_factor = speed_factor
    return simulate(with_strategy(scenario, kind, None), costs=costs, workload=workload).step_time_s


def test_validate_with_a_profile_of_another_model_is_a_one_line_error(tmp_path, capsys):
    profile = tmp_path / "other.json"
    profile.write_text(json.dumps({"format": "something-else"}))
    code = main(["validate", SCENARIO, *SMALL, "--profile", str(profile)])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(profile) in error and "Traceback" not in error


@pytest.mark.parametrize("command, option, value, output", [
    ("calibrate", "--jitter-passes", "-1", "profile.json"),
    ("calibrate", "--layer-passes", "0", "profile.json"),
    ("validate", "--repeats", "0", "validation"),
    ("validate", "--speed-anchor", "-1", "validation"),
    ("validate", "--interleave", "-1", "validation"),
    ("validate", "--interleave", "2", "validation"),  # more rounds than --repeats (1)
])
def test_out_of_range_counts_are_one_line_errors_that_write_nothing(tmp_path, capsys, command, option, value, output):
    out = tmp_path / output
    arguments = (["calibrate", "--scenario", SCENARIO, *SMALL] if command == "calibrate" else
                 ["validate", SCENARIO, *SMALL, "--profile", "reports/profiles/mlp_cpu_ws2.json"])
    code = main([*arguments, "--out", str(out), option, value])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"{option}: {value}" in error
    assert not out.exists()


def test_a_speed_anchor_needs_the_profiles_whole_model_passes(tmp_path, capsys):
    document = json.loads(open("reports/profiles/mlp_cpu_ws2.json").read())
    del document["pass_jitter"]
    profile = tmp_path / "no_jitter.json"
    profile.write_text(json.dumps(document))
    out = tmp_path / "validation"
    code = main(["validate", "scenarios/validation/mlp_cpu.yaml", "--set", "cluster.gpus_per_node=2",
                 "--profile", str(profile), "--speed-anchor", "4", "--out", str(out)])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "pass_jitter" in error and str(profile) in error
    assert not out.exists()
