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
    assert json.loads(capsys.readouterr().out) == {"out": str(out), "profiles": [str(first), str(second)],
                                                   "calibrations": 2}

    bad_out = tmp_path / "bad.json"
    second.write_text(json.dumps({**profile, "format": "ghpsim-profile/1"}))
    assert main(["merge-profiles", str(first), str(second), "--out", str(bad_out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "older profile format" in error
    assert not bad_out.exists()
    assert main(["merge-profiles", str(first), "--out", str(bad_out)]) == 2
    assert "pooling needs at least two" in capsys.readouterr().err


def _files(profile: dict, folder: Path, factors: tuple[float, ...]) -> list[Path]:
    """One calibration file per factor (`_scaled`), named c0.json, c1.json, ..."""
    paths = []
    for index, factor in enumerate(factors):
        path = folder / f"c{index}.json"
        path.write_text(json.dumps(_scaled(profile, factor)))
        paths.append(path)
    return paths


def test_a_pooled_profile_counts_as_the_calibrations_it_holds(profile, tmp_path):
    first, second, third = _files(profile, tmp_path, (1.0, 2.0, 6.0))
    pair = merge_profile_files([first, second], tmp_path / "pair.json")
    assert len(pair["provenance"]["calibrations"]) == 2
    pooled = merge_profile_files([tmp_path / "pair.json", third], tmp_path / "pooled.json")
    direct = merge_profile_files([first, second, third], tmp_path / "direct.json")
    base = profile["p2p"]["latency_s"]
    assert pooled["p2p"]["latency_s"] == pytest.approx(3.0 * base)  # (1 + 2 + 6) / 3, not ((1 + 2) / 2 + 6) / 2
    assert pooled["p2p"]["latency_s"] == pytest.approx(direct["p2p"]["latency_s"])
    assert pooled["provenance"]["calibrations"] == direct["provenance"]["calibrations"]


@pytest.mark.parametrize("order", ["file first", "pool first"])
def test_a_calibration_given_again_inside_a_pool_is_refused(profile, tmp_path, capsys, order):
    first, second = _files(profile, tmp_path, (1.0, 2.0))
    pool, out = tmp_path / "pool.json", tmp_path / "twice.json"
    merge_profile_files([first, second], pool)
    inputs = [first, pool] if order == "file first" else [pool, first]
    assert main(["merge-profiles", *map(str, inputs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    why = "which it pools" if order == "file first" else "which pools it"
    assert f"{inputs[1]} holds the same calibration as {inputs[0]} ({why})" in err
    assert "each calibration counts once" in err and not out.exists()


def test_a_pool_without_recorded_calibrations_counts_its_files_and_is_checked_by_name(profile, tmp_path, capsys):
    """A pool written before `provenance.calibrations`: its `merged_from` files."""
    first, second, third = _files(profile, tmp_path, (1.0, 2.0, 6.0))
    older = merge_profile_files([first, second], tmp_path / "older.json")
    del older["provenance"]["calibrations"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    pooled = merge_profile_files([tmp_path / "older.json", third], tmp_path / "pooled.json")
    assert pooled["p2p"]["latency_s"] == pytest.approx(3.0 * profile["p2p"]["latency_s"])
    assert main(["merge-profiles", str(first), str(tmp_path / "older.json"), "--out", str(tmp_path / "x.json")]) == 2
    assert "older.json holds the same calibration as" in capsys.readouterr().err
    assert main(["merge-profiles", str(tmp_path / "older.json"), str(third), "--out", str(tmp_path / "y.json")]) == 0
    assert capsys.readouterr().out == f"pooled 3 calibrations (from 2 profiles) into {tmp_path / 'y.json'}\n"
