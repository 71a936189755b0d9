"""Pooling calibrations taken at different times (`simulator.profile_merge`, `ghpsim merge-profiles`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.profile import profile_from_dict
from simulator.profile_merge import merge_profile_files, merge_profiles

PROFILE = Path(__file__).resolve().parent.parent / "reports" / "profiles" / "mlp_cpu_ws2.json"


@pytest.fixture
def profile() -> dict:
    return json.loads(PROFILE.read_text())


def _scaled(profile: dict, factor: float) -> dict:
    """The profile as if the machine had been `factor` times slower at compute and communication."""
    slower = copy.deepcopy(profile)
    for layer in slower["layers"]:
        for direction in ("forward", "backward"):
            layer[direction] = {key: value * factor for key, value in layer[direction].items()}
        layer["forward_medians_s"] = [t * factor for t in layer["forward_medians_s"]]
    slower["p2p"]["latency_s"] *= factor
    slower["p2p"]["bandwidth_bytes_per_s"] /= factor
    slower["created_utc"] = "2026-01-01T00:10:00+00:00"
    return slower


def test_pooling_a_profile_with_itself_changes_nothing_but_the_record(profile):
    pooled = merge_profiles([profile, copy.deepcopy(profile)])
    assert pooled.pop("merged_from") == [profile["created_utc"]] * 2
    assert pooled == profile


def test_numbers_are_averaged_and_integers_that_agree_stay_integers(profile):
    slower = _scaled(profile, 3.0)
    pooled = merge_profiles([profile, slower])
    first, pooled_layer = profile["layers"][0], pooled["layers"][0]
    assert pooled_layer["forward"]["intercept_s"] == pytest.approx(2.0 * first["forward"]["intercept_s"])
    assert pooled_layer["forward_medians_s"] == pytest.approx([2.0 * t for t in first["forward_medians_s"]])
    assert pooled["p2p"]["latency_s"] == pytest.approx(2.0 * profile["p2p"]["latency_s"])
    assert pooled_layer["batch_sizes"] == first["batch_sizes"]
    assert all(isinstance(size, int) for size in pooled_layer["batch_sizes"])
    assert pooled["world_size"] == 2 and isinstance(pooled["world_size"], int)
    assert pooled["merged_from"] == [profile["created_utc"], "2026-01-01T00:10:00+00:00"]


def test_pass_jitter_rows_are_pooled_by_halves_not_averaged(profile):
    levels = profile["pass_jitter"]["levels"]["2"]
    later = copy.deepcopy(profile)
    later["pass_jitter"]["levels"]["2"] = [[2.0 * t for t in row] for row in levels]
    later["pass_jitter"]["start_offsets_s"]["2"] = [[o + 1.0 for o in row]
                                                    for row in profile["pass_jitter"]["start_offsets_s"]["2"]]
    pooled = merge_profiles([profile, later])
    rows = pooled["pass_jitter"]["levels"]["2"]
    half = len(levels) // 2
    assert len(rows) == 2 * len(levels)
    assert rows[:half] == levels[:half]
    assert rows[half:2 * half] == later["pass_jitter"]["levels"]["2"][:half]
    # a row and the row half the pooled rows further on (the exit draw's pairing) come from one calibration
    offsets = pooled["pass_jitter"]["start_offsets_s"]["2"]
    for i in range(len(offsets) // 2):
        first_later = min(offsets[i]) >= 1.0
        assert (min(offsets[i + len(offsets) // 2]) >= 1.0) == first_later
    jitter = profile_from_dict(pooled).pass_jitter
    assert jitter is not None and len(jitter.levels[2]) == 2 * len(levels)


def test_profiles_of_different_runs_cannot_be_pooled(profile):
    other = copy.deepcopy(profile)
    other["world_size"] = 4
    with pytest.raises(ScenarioError, match=r"b\.json: world_size: 4 differs from a\.json's 2"):
        merge_profiles([profile, other], ["a.json", "b.json"])
    shorter = copy.deepcopy(profile)
    shorter["p2p"]["sizes_bytes"] = shorter["p2p"]["sizes_bytes"][:-1]
    shorter["p2p"]["medians_s"] = shorter["p2p"]["medians_s"][:-1]
    with pytest.raises(ScenarioError, match=r"p2p\.sizes_bytes"):
        merge_profiles([profile, shorter], ["a.json", "b.json"])


def test_pooled_prediction_lies_between_the_parts(profile, tmp_path):
    from simulator.model_source import resolve_workload
    from simulator.profile_costs import profile_costs
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    slower_path, fast_path = tmp_path / "slow.json", tmp_path / "fast.json"
    fast_path.write_text(json.dumps(profile))
    slower_path.write_text(json.dumps(_scaled(profile, 2.0)))
    merge_profile_files([fast_path, slower_path], tmp_path / "pooled.json")
    scenario = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "mlp_cpu.yaml",
                             ["cluster.gpus_per_node=2"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    steps = {name: simulate(scenario, costs=profile_costs(str(tmp_path / f"{name}.json"), workload),
                            workload=workload).step_time_s for name in ("fast", "pooled", "slow")}
    assert steps["fast"] < steps["pooled"] < steps["slow"]


def test_cli_writes_the_pooled_profile_and_rejects_bad_input(profile, tmp_path, capsys):
    first, second, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "pooled.json"
    first.write_text(json.dumps(profile))
    second.write_text(json.dumps(_scaled(profile, 3.0)))
    assert main(["merge-profiles", str(first), str(second), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["merged_from"][1] == "2026-01-01T00:10:00+00:00"

    bad_out = tmp_path / "bad.json"
    second.write_text(json.dumps({**profile, "format": "something-else"}))
    assert main(["merge-profiles", str(first), str(second), "--out", str(bad_out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "format: 'something-else'" in error
    assert not bad_out.exists()
    assert main(["merge-profiles", str(first), "--out", str(bad_out)]) == 2
    assert "pooling needs at least two" in capsys.readouterr().err


def test_calibrations_measured_differently_keep_each_method_and_pool_their_figures(profile):
    one_sweep = _scaled(profile, 3.0)
    one_sweep["method"]["layer_passes"]["relative_totals"] = [1.0]  # one sweep instead of three
    one_sweep["method"]["settings"]["layer_passes"] = 1
    pooled = merge_profiles([profile, one_sweep])
    assert pooled["method"]["parts"] == [profile["method"], one_sweep["method"]]
    assert "pooled" in pooled["method"]
    assert pooled["p2p"]["latency_s"] == pytest.approx(2.0 * profile["p2p"]["latency_s"])
    assert merge_profiles([profile, _scaled(profile, 3.0)])["method"] == profile["method"]  # same method: kept
