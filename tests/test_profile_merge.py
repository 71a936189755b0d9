"""Pooling calibrations taken at different times (`simulator.profile_merge`, `ghpsim merge-profiles`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator.errors import ScenarioError
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
    slower["p2p"]["latency_s"] *= factor
    slower["p2p"]["bandwidth_bytes_per_s"] /= factor
    return slower


def test_pooling_a_profile_with_itself_changes_nothing_but_the_record(profile):
    pooled = merge_profiles([profile, copy.deepcopy(profile)], ["a.json", "b.json"])
    assert pooled.pop("provenance")["merged_from"] == ["a.json", "b.json"]
    profile.pop("provenance")
    assert pooled == profile


def test_numbers_are_averaged_and_integers_stay_integers(profile):
    pooled = merge_profiles([profile, _scaled(profile, 3.0)], ["a.json", "b.json"])
    first, pooled_layer = profile["layers"][0], pooled["layers"][0]
    assert pooled_layer["forward"]["intercept_s"] == pytest.approx(2.0 * first["forward"]["intercept_s"])
    assert pooled["p2p"]["latency_s"] == pytest.approx(2.0 * profile["p2p"]["latency_s"])
    assert pooled["world_size"] == 2 and isinstance(pooled["world_size"], int)


def test_profiles_of_different_runs_cannot_be_pooled(profile):
    other = copy.deepcopy(profile)
    other["world_size"] = 4
    with pytest.raises(ScenarioError, match=r"b\.json: world_size: 4 differs from a\.json's 2"):
        merge_profiles([profile, other], ["a.json", "b.json"])
    fewer = copy.deepcopy(profile)
    fewer.pop("allgather", None)
    fewer.pop("topk", None)
    fewer["allreduce"] = {}
    with pytest.raises(ScenarioError, match="lacks"):
        merge_profiles([profile, {**fewer, "allreduce": {"3": profile["allreduce"]["2"]}}], ["a.json", "b.json"])


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
    assert json.loads(out.read_text())["provenance"]["merged_from"] == [str(first), str(second)]
    capsys.readouterr()
    assert main(["merge-profiles", str(first), str(second), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(out), "profiles": [str(first), str(second)]}

    bad_out = tmp_path / "bad.json"
    second.write_text(json.dumps({**profile, "format": "ghpsim-profile/1"}))
    assert main(["merge-profiles", str(first), str(second), "--out", str(bad_out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "older profile format" in error
    assert not bad_out.exists()
    assert main(["merge-profiles", str(first), "--out", str(bad_out)]) == 2
    assert "pooling needs at least two" in capsys.readouterr().err
