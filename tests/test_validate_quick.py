"""End to end on this machine: calibrate from microbenchmarks, then validate real dp and mp runs
against the prediction. A quick version with a loose bound (CI machines are noisy); the real
figures come from benchmarks/bench_validation.py and are quoted in the README."""

import json

import pandas as pd
import pytest

pytest.importorskip("torch")

from simulator.compare import with_strategy  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.profile import FORMAT, profile_from_dict  # noqa: E402
from simulator.profile_costs import profile_costs  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from validator.measure import RunOptions  # noqa: E402
from validator.report import (error_summary, summary_line, write_plot, write_rows_csv, write_step_spans,  # noqa: E402
                              write_traces)
from validator.validate import at_profile_world_size, predictions, validate  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

SCENARIO = "scenarios/validation/mlp_cpu.yaml"  # a cluster of 4 ranks: validated at the profile's 2
SMALL = ["model.params.hidden_dim=256", "model.params.num_hidden_layers=3"]


def test_calibrate_then_validate_reports_errors_within_a_loose_bound(tmp_path):
    from validator.calibrate import calibrate

    scenario = load_scenario(SCENARIO, SMALL)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    profile = tmp_path / "profile.json"

    def calibrate_profile() -> None:
        calibrate(workload, dict(scenario.model.params), profile, world_size=2, batch_sizes=(8, 32), repeats=5,
                  layer_passes=2, verbose=False)

    calibrate_profile()
    out = tmp_path / "validation"
    said, rows_by_label = [], {}

    def on_case(row, measured_spans, simulated):
        rows_by_label[row["strategy"]] = row  # a later round replaces the strategy's row
        write_rows_csv(list(rows_by_label.values()), out / "mlp_cpu.csv")
        write_traces(row["strategy"], measured_spans, simulated.spans, out / "traces")

    def run() -> list[dict]:
        validate(scenario, str(profile), [("dp", None), ("mp", None)], RunOptions(steps=4, warmup=2,
                 keep_step_spans=True), on_case=on_case, progress=said.append, repeats=2,
                 on_step_spans=lambda label, table: write_step_spans(label, table, out / "traces"))
        return list(rows_by_label.values())

    rows = run()
    if not all(_within_loose_bound(row) for row in rows):
        # a slow spell of the shared 2-core host (during the calibration or the runs): calibrate and
        # measure once more; a slip in units or accounting misses the bound both times
        calibrate_profile()
        rows = run()
    # the scenario's 4 ranks run at the profile's world size, and the validation says so
    assert any("profile's world size 2" in message and "4 ranks" in message for message in said)
    assert [(row["kind"], row["world_size"]) for row in rows] == [("dp", 2), ("mp", 2)]
    for row in rows:
        assert row["measured_s"] > 0 and row["predicted_s"] > 0
        assert _within_loose_bound(row), row
        # the prediction is the plain simulation with the profile's costs
        assert row["predicted_s"] == pytest.approx(_simulated_s(scenario, profile, row["kind"]), rel=1e-12)
        assert row["error_pct"] == pytest.approx(100 * (row["predicted_s"] - row["measured_s"]) / row["measured_s"])
        # two launches pooled: the median of all 8 steps lies between the launches' own medians
        assert row["launches"] == 2
        assert row["launch_median_min_s"] <= row["measured_s"] <= row["launch_median_max_s"]
        assert row["launch_noise_pct"] == pytest.approx(row["launch_spread_pct"] / 2)
    summary = error_summary(rows)
    assert summary["cases"] == 2 and summary["worst_pct"] >= summary["mape_pct"] >= abs(summary["mean_signed_pct"])
    assert summary_line(summary).startswith("cases 2 | MAPE ")
    assert predictions(scenario, str(profile), [("mp", None)]) == {"mp (G=1 x M=2)": rows[1]["predicted_s"]}
    table = pd.read_csv(out / "mlp_cpu.csv")  # one row per strategy, the later round replacing the first
    assert list(table["kind"]) == ["dp", "mp"] and list(table["launches"]) == [2, 2]
    assert write_plot(table, out / "mlp_cpu.png", "mlp_cpu").is_file()
    assert len(list((out / "traces").glob("*.trace.json"))) == 4
    _check_step_spans(out / "traces")


def _within_loose_bound(row: dict) -> bool:
    """A few-millisecond step on a shared 2-core box: a calibration or a run taken while other
    processes hold the cores is off by a factor (measured here with a concurrent test run: 0.38x),
    so the figure only has to be within a factor of 5 (a unit or accounting slip is off by far more);
    the benchmarks measure the accuracy."""
    return 0.2 < row["predicted_s"] / row["measured_s"] < 5


def _simulated_s(scenario, profile, kind: str) -> float:
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = profile_costs(str(profile), workload)
    resized = at_profile_world_size(scenario, costs.profile)
    return simulate(with_strategy(resized, kind, None), costs=costs, workload=workload).step_time_s


def _check_step_spans(folder) -> None:
    """Every measured step (2 launches x 4 steps) of both ranks, and the trace's median step among
    them, span for span."""
    for stem, message_stream in (("dp_G2xM1", "comm"), ("mp_G1xM2", "send")):
        steps = pd.read_csv(folder / f"{stem}.steps.csv")
        assert sorted(steps.groupby(["launch", "rank"])["step"].nunique().items()) == [
            ((launch, rank), 4) for launch in (0, 1) for rank in (0, 1)]
        assert (steps["duration_s"] >= 0).all() and (steps["end_s"] > steps["start_s"] - 1e-12).all()
        events = json.loads((folder / f"{stem}.measured.trace.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        traced = sorted((e["pid"], e["name"]) for e in events if e.get("ph") == "X")
        per_step = {key: sorted(zip(group["rank"], group["name"])) for key, group in steps.groupby(["launch", "step"])}
        assert traced in per_step.values()  # the same passes and messages as every step
        first = steps[(steps["launch"] == 0) & (steps["step"] == 0)]
        assert {"compute", message_stream} <= set(first["stream"])
        # every compute span carries its main thread's CPU time, at most its wall time; no other span does
        compute = steps["stream"] == "compute"
        assert steps.loc[compute, "cpu_s"].notna().all() and steps.loc[~compute, "cpu_s"].isna().all()
        assert (steps.loc[compute, "cpu_s"] > 0).all()
        assert (steps.loc[compute, "cpu_s"] <= steps.loc[compute, "duration_s"] + 1e-3).all()


def _profile(world_size: int, scenario):
    """A synthetic CPU profile of `scenario`'s model calibrated at `world_size`."""
    workload = resolve_workload(scenario.model, scenario.base_dir)
    fit = {"latency_s": 1e-4, "bandwidth_bytes_per_s": 1e9}
    return profile_from_dict({
        "format": FORMAT, "device": {"kind": "cpu", "name": "test", "num_threads": 1}, "backend": "gloo",
        "world_size": world_size, "model": {"name": workload.name, "layer_names": [l.name for l in workload.layers]},
        "layers": [{"name": layer.name, "forward": {"intercept_s": 1e-4, "per_sample_s": 1e-5},
                    "backward": {"intercept_s": 1e-4, "per_sample_s": 2e-5}} for layer in workload.layers],
        "optimizer": {"name": "sgd", "intercept_s": 0.0, "per_param_s": 1e-9},
        "p2p": fit, "allreduce": {str(world_size): fit}}, "synthetic.json")


def test_a_scenario_is_validated_at_the_profiles_world_size_or_refused_in_one_line():
    scenario = load_scenario(SCENARIO, SMALL)  # one node of 4
    said = []
    assert at_profile_world_size(scenario, _profile(4, scenario), said.append) is scenario and not said
    resized = at_profile_world_size(scenario, _profile(2, scenario), said.append)
    assert (resized.cluster.num_nodes, resized.cluster.gpus_per_node) == (1, 2) and len(said) == 1
    assert with_strategy(resized, "mp").grid() == (1, 2)  # MP has as many stages as the profile's ranks
    three = load_scenario(SCENARIO, [*SMALL, "cluster.gpus_per_node=3"])
    with pytest.raises(ScenarioError) as error:
        at_profile_world_size(three, _profile(4, three))
    assert str(error.value) == ("synthetic.json: world_size: the profile was calibrated at world size 4, the "
                                "scenario's cluster has 3 ranks (1 x 3 GPUs per node); calibrate at world size 3")


def test_a_megatron_degree_is_refused_rather_than_dropped_by_the_resize():
    scenario = load_scenario(SCENARIO, [*SMALL, "strategy.kind=megatron", "strategy.tp_degree=2"])
    with pytest.raises(ScenarioError) as error:
        at_profile_world_size(scenario, _profile(2, scenario), kinds=("megatron",))
    assert str(error.value).startswith("strategy.tp_degree: 2; the validator runs megatron plans only with")
    resized = at_profile_world_size(scenario, _profile(2, scenario), kinds=("dp",))  # dp has no degrees to drop
    assert resized.num_gpus == 2


def test_validate_refuses_a_foreign_profile_and_bad_counts_in_one_line_before_running(tmp_path):
    scenario = load_scenario(SCENARIO, SMALL)
    profile = tmp_path / "other.json"
    profile.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ScenarioError) as error:
        validate(scenario, str(profile), [("dp", None)])
    assert len(str(error.value).splitlines()) == 1 and str(profile) in str(error.value)
    with pytest.raises(ScenarioError, match="repeats: 0 must be at least 1"):
        validate(scenario, str(profile), [("dp", None)], repeats=0)
