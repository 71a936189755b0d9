"""The example scenarios in scenarios/: each loads and simulates, and the documented winners win."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simulator import load_scenario, simulate
from simulator.compare import compare
from tests.helpers import simulated_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SCENARIO_FILES = sorted(SCENARIOS.glob("*.yaml"))
THREE_WAY = [("dp", None), ("mp", None), ("ghp", None)]

REQUIRED_EXAMPLES = ("demo.yaml", "resnet50_dp_a100.yaml", "resnet1001_ghp_10gbe.yaml",
                     "small_fast_dp_wins.yaml", "bert_large_ghp.yaml", "gpt2_mp_pcie.yaml",
                     "alexnet_param_server.yaml", "custom_layers.yaml")


def test_required_examples_exist():
    names = {path.name for path in SCENARIO_FILES}
    missing = [name for name in REQUIRED_EXAMPLES if name not in names]
    assert not missing, f"missing example scenarios: {missing}"
    assert (SCENARIOS / "layers" / "tiny_mlp.yaml").is_file()
    assert (SCENARIOS / "README.md").is_file()


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[path.name for path in SCENARIO_FILES])
def test_scenario_loads_and_simulates(path):
    scenario = load_scenario(path)
    result = simulated_scenario(path)
    step = result.summary["step_time_s"]
    assert math.isfinite(step) and step > 0
    assert result.summary["num_gpus"] == scenario.num_gpus
    assert result.summary["throughput_samples_per_s"] > 0
    if scenario.cluster.gpu.name != "cpu":  # an example a user copies should run where it says
        assert result.summary["fits_in_memory"], f"{path.name}: {result.summary['memory']['peak_memory_bytes']:.3g} bytes"


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[path.name for path in SCENARIO_FILES])
def test_scenario_starts_with_a_comment(path):
    lines = path.read_text().splitlines()
    assert len(lines) >= 2 and lines[0].startswith("#") and lines[1].startswith("#")


def _by_kind(results):
    best = {}
    for result in results:
        kind = result.summary["strategy"]
        best.setdefault(kind, result.step_time_s)
    return best


def test_small_fast_dp_wins():
    scenario = load_scenario(SCENARIOS / "small_fast_dp_wins.yaml")
    results = compare(scenario, THREE_WAY)
    assert results[0].summary["strategy"] == "dp"
    dp = next(r for r in results if r.summary["strategy"] == "dp").step_time_s
    assert all(dp < r.step_time_s for r in results if r.summary["strategy"] != "dp")
    # "every ghp": the bare ghp spec keeps only the fastest G, so check each G explicitly.
    groups = [g for g in range(2, scenario.num_gpus) if scenario.num_gpus % g == 0]
    assert groups
    for result in compare(scenario, [("ghp", g) for g in groups]):
        assert dp < result.step_time_s, result.summary["num_groups"]


def test_demo_ghp_beats_dp_and_mp():
    scenario = load_scenario(SCENARIOS / "demo.yaml")
    results = compare(scenario, THREE_WAY)
    assert [r.summary["strategy"] for r in results][0] == "ghp"
    times = _by_kind(results)
    assert times["ghp"] < times["dp"] and times["ghp"] < times["mp"]


def test_resnet1001_ghp_beats_dp_and_mp():
    results = compare(load_scenario(SCENARIOS / "resnet1001_ghp_10gbe.yaml"), THREE_WAY)
    assert results[0].summary["strategy"] == "ghp"


def test_custom_layers_reads_the_relative_table():
    result = simulate(load_scenario(SCENARIOS / "custom_layers.yaml"))
    assert result.workload.name == "tiny_mlp"
    assert [layer.name for layer in result.workload.layers] == ["fc1", "fc2", "fc3", "head"]
    fc1, fc3 = result.workload.layers[0], result.workload.layers[2]
    # defaults: backward = 2 x forward for a layer with parameters; saved = input elements
    assert fc1.backward_flops_per_sample == 2 * fc1.forward_flops_per_sample
    assert fc1.saved_elements_per_sample == fc1.input_elements_per_sample
    assert fc3.backward_flops_per_sample == 16777216


def test_custom_layers_works_from_another_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert simulate(load_scenario(SCENARIOS / "custom_layers.yaml")).step_time_s > 0


def test_readme_lists_every_example():
    readme = (SCENARIOS / "README.md").read_text()
    for path in SCENARIO_FILES:
        assert f"`{path.name}`" in readme, path.name


# ----------------------------------------------------------------------------- layer-table formats

ROW_A = {"name": "a", "forward_flops_per_sample": 1000, "num_params": 10,
         "input_elements_per_sample": 10, "output_elements_per_sample": 10}
ROW_B = {"name": "b", "kind": "elementwise", "forward_flops_per_sample": 500, "num_params": 0,
         "input_elements_per_sample": 10, "output_elements_per_sample": 5}


def _load(tmp_path, table_name):
    scenario_path = tmp_path / "scenario.yaml"
    scenario_path.write_text(f"model: {{file: {table_name}}}\ntraining: {{global_batch_size: 8}}\n")
    return simulate(load_scenario(scenario_path))


def test_csv_layer_table_with_optional_columns_left_out(tmp_path):
    (tmp_path / "t.csv").write_text(
        "name,kind,forward_flops_per_sample,num_params,input_elements_per_sample,output_elements_per_sample\n"
        "a,linear,1000,10,10,10\n"
        "b,elementwise,500,0,10,5\n")
    result = _load(tmp_path, "t.csv")
    a, b = result.workload.layers
    assert result.workload.name == "t"
    assert a.backward_flops_per_sample == 2000 and b.backward_flops_per_sample == 500
    assert a.saved_elements_per_sample == 10 and b.saved_elements_per_sample == 10
    assert result.step_time_s > 0


def test_inline_layer_table():
    scenario = load_scenario({"model": {"layers": [ROW_A, ROW_B]}, "training": {"global_batch_size": 8},
                              "cluster": {"gpus_per_node": 2}, "strategy": {"kind": "mp"}})
    result = simulate(scenario)
    assert result.workload.name == "inline" and result.step_time_s > 0


def test_csv_layer_table_blank_optional_cells_take_defaults(tmp_path):
    (tmp_path / "t.csv").write_text(
        "name,kind,forward_flops_per_sample,backward_flops_per_sample,num_params,"
        "input_elements_per_sample,output_elements_per_sample,saved_elements_per_sample\n"
        "a,linear,1000,,10,10,10,\n"
        "b,linear,1000,3000,10,10,10,5\n")
    a, b = _load(tmp_path, "t.csv").workload.layers
    assert a.backward_flops_per_sample == 2000 and a.saved_elements_per_sample == 10
    assert b.backward_flops_per_sample == 3000 and b.saved_elements_per_sample == 5


def test_yaml_layer_table_as_a_bare_list(tmp_path):
    import yaml
    (tmp_path / "rows.yaml").write_text(yaml.safe_dump([ROW_A, ROW_B]))
    assert _load(tmp_path, "rows.yaml").workload.num_layers == 2
