"""Sweep files: axes (lists, ranges, geometric ranges, linked fields), product and zip, invalid
points, one-line errors, and the scenario key (sha256 of version + canonical resolved JSON)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from simulator import __version__
from simulator.errors import ScenarioError
from simulator.sweep import spec as spec_module
from simulator.sweep.export import summary_figures
from simulator.sweep.spec import GeometricAxis, RangeAxis, load_sweep, scenario_key

BASE = {
    "name": "tiny",
    "cluster": {"num_nodes": 2, "gpus_per_node": 2, "gpu": "V100", "inter_node_link": "10gbe"},
    "model": {"name": "mlp", "params": {"num_hidden_layers": 4}},
    "strategy": {"kind": "dp"},
    "training": {"global_batch_size": 64},
}


def write_sweep(folder, **document):
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": BASE, **document}, sort_keys=False))
    return path


@pytest.mark.parametrize("axis, values", [
    ({"start": 1, "stop": 16, "step": 5}, [1, 6, 11, 16]),
    ({"start": 1, "stop": 15, "step": 5}, [1, 6, 11]),
    ({"start": 0.1, "stop": 0.5, "step": 0.1}, [0.1, 0.2, 0.3, 0.4, 0.5]),
    ({"start": 3, "stop": 3, "step": 1}, [3]),
])
def test_arithmetic_range_includes_stop_when_hit(axis, values):
    assert RangeAxis(**axis).values() == values


@pytest.mark.parametrize("axis, values", [
    ({"start": 1, "stop": 16, "factor": 2}, [1, 2, 4, 8, 16]),
    ({"start": 1, "stop": 20, "factor": 3}, [1, 3, 9]),
    ({"start": 32, "stop": 256, "factor": 2}, [32, 64, 128, 256]),
    ({"start": 0.001, "stop": 1, "factor": 10}, [0.001, 0.01, 0.1, 1.0]),
])
def test_geometric_range(axis, values):
    assert GeometricAxis(**axis).values() == pytest.approx(values)
    if all(isinstance(value, int) for value in axis.values()):
        assert all(isinstance(value, int) for value in GeometricAxis(**axis).values())


def test_product_is_cartesian_in_axis_order(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, axes={
        "cluster.num_nodes": [1, 2], "cluster.inter_node_link": ["10gbe", "ib-hdr", "25gbe"]}))
    points = sweep.points()
    assert [tuple(point.values.values()) for point in points] == [
        (1, "10gbe"), (1, "ib-hdr"), (1, "25gbe"), (2, "10gbe"), (2, "ib-hdr"), (2, "25gbe")]
    assert [point.index for point in points] == list(range(6))
    assert points[4].scenario.cluster.num_nodes == 2
    assert points[4].scenario.cluster.inter_node_link.name == "ib-hdr"
    assert sweep.columns() == ["cluster.num_nodes", "cluster.inter_node_link"]


def test_zip_pairs_axes_and_linked_fields_move_together(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, mode="zip", axes={
        "cluster.num_nodes": {"start": 1, "stop": 4, "factor": 2},
        "strategy.kind,strategy.num_groups": [["dp", None], ["ghp", 2], ["ghp", 4]]}))
    points = sweep.points()
    assert [(p.scenario.num_gpus, p.scenario.strategy.kind, p.scenario.grid()) for p in points] == [
        (2, "dp", (2, 1)), (4, "ghp", (2, 2)), (8, "ghp", (4, 2))]
    assert sweep.columns() == ["cluster.num_nodes", "strategy.kind", "strategy.num_groups"]


def test_invalid_points_keep_their_one_line_error(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, axes={
        "strategy.kind": ["ghp"], "strategy.num_groups": [2, 3, 4]}))
    points = sweep.points()
    assert [point.error is None for point in points] == [True, False, True]
    bad = points[1]
    assert bad.scenario is None and bad.key is None
    assert bad.error.startswith("point 1: strategy.num_groups: 3 does not divide the 4 GPUs")
    assert "\n" not in bad.error


def test_model_params_and_inline_sections_are_sweepable(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, axes={"model.params.hidden_dim": [256, 512],
                                                   "costs.model": ["analytic"], "costs.efficiency.linear": [0.25]}))
    points = sweep.points()
    assert [p.scenario.model.params["hidden_dim"] for p in points] == [256, 512]
    assert points[0].scenario.costs.efficiency["linear"] == 0.25


@pytest.mark.parametrize("document, message", [
    ({"axes": {"cluster.num_nodez": [1]}}, "'cluster.num_nodez' is not a scenario field"),
    ({"axes": {"strategy.kind.x": [1]}}, "'strategy.kind.x' is not a scenario field"),
    ({"axes": {"base_dir": ["/"]}}, "'base_dir' is not a scenario field"),
    ({"axes": {"cluster.num_nodes": {"start": 1, "stop": 4, "step": 0}}}, "axes.cluster.num_nodes.range.step"),
    ({"axes": {"cluster.num_nodes": {"start": 4, "stop": 1, "step": 1}}}, "axes.cluster.num_nodes: stop 1 is below start 4"),
    ({"axes": {"cluster.num_nodes": {"start": 1, "stop": 8, "factor": 1}}}, "axes.cluster.num_nodes.geometric.factor"),
    ({"axes": {"cluster.num_nodes": 4}}, "axes.cluster.num_nodes: expected a list of values"),
    ({"axes": {"cluster.num_nodes": []}}, "axes.cluster.num_nodes.list"),
    ({"axes": {}}, "axes: Dictionary should have at least 1 item"),
    ({"mode": "zip", "axes": {"cluster.num_nodes": [1, 2], "training.global_batch_size": [8]}},
     "mode: zip needs axes of equal length"),
    ({"axes": {"strategy.kind,strategy.num_groups": [["ghp", 2], "dp"]}}, "each value must be a list of 2"),
    ({"axes": {"cluster.num_nodes": [1], "cluster.num_nodes,strategy.kind": [[1, "dp"]]}}, "appears in two axes"),
    ({"axes": {"cluster.num_nodes": {"start": 1, "stop": 10**6, "step": 1}}}, "at most 100,000"),
    ({"axes": {"cluster.num_nodes": [1, 2], "training.global_batch_size": {"start": 1, "stop": 60000, "step": 1}}},
     "axes: 120,000 points (at most 100,000)"),
    ({"axes": {"cluster.num_nodes": [1]}, "colour": "red"}, "colour: unknown key"),
])
def test_bad_sweep_files_give_one_line_errors(tmp_path, document, message):
    path = write_sweep(tmp_path, **document)
    with pytest.raises(ScenarioError) as caught:
        load_sweep(path)
    text = str(caught.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text, text


def test_axis_through_a_preset_string_is_refused(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, axes={"cluster.gpu.memory_bytes": [1e9]}))
    with pytest.raises(ScenarioError, match=r"axes\.cluster\.gpu\.memory_bytes: the base scenario's cluster\.gpu is 'V100'"):
        sweep.points()


def test_base_file_is_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "s.yaml"
    path.write_text(yaml.safe_dump({"base": "../scenarios/base.yaml", "axes": {"training.global_batch_size": [32]}}))
    (point,) = load_sweep(path).points()
    assert point.scenario.training.global_batch_size == 32 and point.scenario.name == "tiny"
    path.write_text(yaml.safe_dump({"base": "missing.yaml", "axes": {"training.global_batch_size": [32]}}))
    with pytest.raises(ScenarioError, match="base: scenario file .*missing.yaml.* not found"):
        load_sweep(path)


def test_key_is_sha256_of_version_and_canonical_resolved_scenario(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, axes={"strategy.bucket_size_bytes": ["25 MiB", 26214400, "16 MiB"]}))
    first, same, other = sweep.points()
    document = {"ghpsim": __version__, "scenario": first.scenario.model_dump(mode="json")}
    expected = hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert first.key == expected
    assert same.key == first.key  # "25 MiB" and 26214400 resolve to the same scenario
    assert other.key != first.key


def test_key_changes_with_the_ghpsim_version(tmp_path, monkeypatch):
    (point,) = load_sweep(write_sweep(tmp_path, axes={"cluster.num_nodes": [2]})).points()
    monkeypatch.setattr(spec_module, "__version__", "99.0")
    assert scenario_key(point.scenario) != point.key


def test_summary_figures_reads_memory_from_top_level_or_memory_section():
    tiers = {"intra": 10.0, "inter": 2.0}
    top = summary_figures({"step_time_s": 0.5, "bytes_per_tier": tiers, "peak_memory_bytes": 5.0,
                           "fits_in_memory": False})
    assert (top["step_time_s"], top["peak_memory_bytes"], top["fits_in_memory"]) == (0.5, 5.0, False)
    figures = summary_figures({"bytes_per_tier": tiers, "fits_in_memory": True,
                               "memory": {"peak_memory_bytes": 7.0, "fits_in_memory": True}})
    assert (figures["intra_node_bytes"], figures["inter_node_bytes"]) == (10.0, 2.0)
    assert (figures["peak_memory_bytes"], figures["fits_in_memory"]) == (7.0, True)
    devices = summary_figures({"devices": [{"peak_memory_bytes": 3.0, "fits_in_memory": True},
                                           {"peak_memory_bytes": 9.0, "fits_in_memory": False}]})
    assert (devices["peak_memory_bytes"], devices["fits_in_memory"]) == (9.0, False)
    empty = summary_figures(None)
    assert empty["step_time_s"] is None and empty["peak_memory_bytes"] is None


@pytest.mark.parametrize("name, points, invalid", [
    ("resnet50_dp_vs_ghp_scaling.yaml", 30, 2),  # G = 16 does not divide the 8 GPUs of one node
    ("vgg16_groups_links_batch.yaml", 80, 0),
])
def test_example_sweeps_expand(name, points, invalid):
    sweep = load_sweep(Path(__file__).resolve().parent.parent / "scenarios" / "sweeps" / name)
    expanded = sweep.points()
    assert len(expanded) == points
    assert sum(point.scenario is None for point in expanded) == invalid


def test_a_misspelt_top_level_key_is_named_before_a_missing_one(tmp_path):
    path = write_sweep(tmp_path, axez={"cluster.num_nodes": [1, 2]})
    with pytest.raises(ScenarioError) as caught:
        load_sweep(path)
    assert str(caught.value) == (f"{path}: axez: unknown key (a sweep file has name, description, base, mode, axes)")


@pytest.mark.parametrize("text, message", [("", "the file is empty"), ("# nothing yet\n", "the file is empty")])
def test_an_empty_sweep_file_is_said_to_be_empty(tmp_path, text, message):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_sweep(path)
    assert str(caught.value) == f"{path}: {message}"


def test_a_scenario_given_as_a_sweep_is_named_as_one(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ScenarioError) as caught:
        load_sweep(path)
    assert str(caught.value).startswith(f"{path}: a scenario file, not a sweep (a sweep has base and axes)")
