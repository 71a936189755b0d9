"""Scenario input found by an audit: `strategy.zero_stage: null`, node and device names with a leading
zero, `cluster.node_gpus` errors named with the scenario file, and `strategy.dp_sync: parameter_server`
on kind megatron. Each mistake is one line on stderr naming the field and the value, exit code 2."""

from __future__ import annotations

import json

import pytest
import yaml

from simulator.errors import ScenarioError
from simulator.fabrics import build_topology
from simulator.scenario import ClusterConfig, load_scenario
from simulator.topology import degraded_links
from tests.test_bad_input import ROOT, assert_one_line_error, run_cli, write_scenario

DEMO = str(ROOT / "scenarios" / "demo.yaml")
MIXED = str(ROOT / "scenarios" / "straggler_vgg16_ghp.yaml")
CPU = str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml")
CPU_PROFILE = str(ROOT / "reports" / "profiles" / "mlp_cpu_ws4.json")
PARAMETER_SERVER = str(ROOT / "scenarios" / "alexnet_param_server.yaml")

TINY_MEGATRON = {
    "name": "tiny_megatron",
    "cluster": {"num_nodes": 2, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100",
                "inter_node_link": "ib-hdr"},
    "model": {"name": "transformer",
              "params": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32, "vocab_size": 128}},
    "strategy": {"kind": "megatron", "tp_degree": 2},
    "training": {"global_batch_size": 8, "dtype": "bf16"},
}


def tiny_megatron(tmp_path):
    """TINY_MEGATRON as a scenario file: 2 x 2 A100, tensor parallel 2, a two-layer transformer."""
    path = tmp_path / "tiny_megatron.yaml"
    path.write_text(yaml.safe_dump(TINY_MEGATRON, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- 1: zero_stage null

@pytest.mark.parametrize("extra", [(), ("--set", "strategy.fsdp_sharding=full_shard")])
@pytest.mark.parametrize("value", ["null", ""])
def test_a_null_zero_stage_names_the_field_and_the_stages(capsys, value, extra):
    line = assert_one_line_error(run_cli(capsys, "simulate", DEMO, "--set", f"strategy.zero_stage={value}", *extra),
                                 f"{DEMO}: strategy.zero_stage: null", "0, 1, 2 or 3")
    assert "None" not in line and "disagrees" not in line


def test_a_zero_stage_key_without_a_value_in_the_file(capsys, tmp_path):
    path = write_scenario(tmp_path, text="cluster: {num_nodes: 1, gpus_per_node: 2}\nmodel: {name: mlp}\n"
                                         "strategy:\n  kind: dp\n  zero_stage:\ntraining: {global_batch_size: 8}\n")
    assert_one_line_error(run_cli(capsys, "simulate", path), f"{path}: strategy.zero_stage: null", "0, 1, 2 or 3")


def test_a_zero_stage_left_out_takes_the_fsdp_stage():
    assert load_scenario(dict(TINY_MEGATRON, strategy={**TINY_MEGATRON["strategy"], "tp_degree": 1,
                                                       "fsdp_sharding": "full_shard"})).strategy.zero_stage == 3


# ----------------------------------------------------------------------------- 2: leading zeros in names

@pytest.mark.parametrize("name, written", [("node02", "node2"), ("node00", "node0"), ("gpu01", "gpu1")])
def test_a_degraded_link_name_with_a_leading_zero_is_refused(capsys, name, written):
    assert_one_line_error(run_cli(capsys, "simulate", DEMO, "--set", f"cluster.degraded_links={{{name}: 0.5}}"),
                          f"{DEMO}: cluster.degraded_links: {name!r}", f"write {written}")


@pytest.mark.parametrize("name", ["node0", "node2", "gpu0", "gpu15"])
def test_degraded_link_names_without_a_leading_zero_stay_valid(name):
    cluster = load_scenario(DEMO, [f"cluster.degraded_links={{{name}: 0.5}}"]).cluster
    assert degraded_links(build_topology(cluster), name)


def test_a_node_name_in_other_digits_names_no_link(capsys):
    """int() reads Unicode digits: "node\u0662" (Arabic-Indic two) is not node2."""
    assert_one_line_error(run_cli(capsys, "simulate", DEMO, "--set", "cluster.degraded_links={node\u0662: 0.5}"),
                          "cluster.degraded_links: 'node\u0662' names no link")


def test_the_topology_reads_no_leading_zero():
    topology = build_topology(ClusterConfig(num_nodes=4, gpus_per_node=2))
    assert degraded_links(topology, "node2")
    for name in ("node02", "gpu007"):
        with pytest.raises(ScenarioError, match=f"'{name}' names no link"):
            degraded_links(topology, name)


@pytest.mark.parametrize("assignment, field, written", [
    ('cluster.node_gpus={"02": A100-80GB}', "cluster.node_gpus.02", "write 2"),
    ("cluster.node_gpus={01: A100-80GB}", "cluster.node_gpus.01", "write 1"),
    ('cluster.stragglers={"00": 2}', "cluster.stragglers.00", "write 0"),
])
def test_an_index_key_with_a_leading_zero_is_refused(capsys, assignment, field, written):
    assert_one_line_error(run_cli(capsys, "simulate", DEMO, "--set", assignment), f"{DEMO}: {field}", written)


def test_index_keys_as_text_without_a_leading_zero_stay_valid():
    sets = ['cluster.node_gpus={"0": A100-80GB, "3": V100}', 'cluster.stragglers={"10": 2}']
    cluster = load_scenario(DEMO, sets).cluster
    assert set(cluster.node_gpus) == {0, 3} and cluster.stragglers == {10: 2.0}


# ----------------------------------------------------------------------------- 3: node_gpus errors name the file

NO_BF16 = ["--set", "cluster.gpu=A100-80GB", "--set", "cluster.node_gpus={3: V100}", "--set", "training.dtype=bf16"]


@pytest.mark.parametrize("command", [("simulate",), ("compare", "--strategies", "dp,mp"),
                                     ("rank", "--workers", "1", "--kinds", "dp")])
def test_a_node_gpu_without_a_figure_for_the_dtype_is_refused_on_load(capsys, command):
    line = assert_one_line_error(run_cli(capsys, command[0], MIXED, *command[1:], *NO_BF16),
                                 f"{MIXED}: cluster.node_gpus: GPU 'V100' has no figure for training.dtype 'bf16' "
                                 "(node 3)")
    assert "no candidate" not in line


def test_a_node_gpu_without_a_figure_for_the_dtype_fails_the_schema():
    with pytest.raises(ScenarioError, match=r"cluster.node_gpus: GPU 'V100' has no figure for .* 'bf16' \(node 3\)"):
        load_scenario(MIXED, NO_BF16[1::2])


@pytest.mark.parametrize("command", [
    ("simulate",),
    ("compare", "--strategies", "dp,mp"),
    ("simulate", "--set", "strategy.kind=gpipe", "--set", "strategy.partition=uniform",
     "--set", "strategy.num_microbatches=4"),  # the engine of a short play meets the node's GPU first
])
def test_a_node_gpu_with_a_calibration_profile_names_the_file(capsys, command):
    result = run_cli(capsys, command[0], CPU, *command[1:], "--profile", CPU_PROFILE,
                     "--set", "cluster.node_gpus={0: A100-80GB}")
    assert_one_line_error(result, f"ghpsim: error: {CPU}: cluster.node_gpus: cannot be priced from the calibration")


# ----------------------------------------------------------------------------- 4: dp_sync on megatron

def test_a_parameter_server_on_megatron_is_refused(capsys, tmp_path):
    path = tiny_megatron(tmp_path)
    assert_one_line_error(run_cli(capsys, "simulate", path, "--set", "strategy.dp_sync=parameter_server"),
                          f"{path}: strategy.dp_sync: parameter_server applies to kinds dp",
                          "megatron reduces gradients with allreduce")


def test_a_megatron_scenario_with_a_parameter_server_compares_as_written(capsys, tmp_path):
    """The scenario's own megatron layout is the item: refused, naming the item."""
    path = tiny_megatron(tmp_path)
    assert_one_line_error(run_cli(capsys, "compare", path, "--strategies", "dp,megatron",
                                  "--set", "strategy.dp_sync=parameter_server"),
                          "strategy.dp_sync: parameter_server", "(--strategies item megatron)")


def test_compare_turns_a_parameter_server_scenario_into_megatron_with_allreduce(capsys, tmp_path):
    path = tiny_megatron(tmp_path)
    code, out, err = run_cli(capsys, "compare", path, "--strategies", "dp,megatron", "--json",
                             "--set", "strategy.kind=dp", "--set", "strategy.dp_sync=parameter_server")
    assert code == 0 and err.splitlines() == [
        "ghpsim: note: strategy.dp_sync parameter_server: not used by the megatron item, which reduces dense "
        "gradients with allreduce and keeps each until the update"], err
    steps = {summary["strategy"]: summary["step_time_s"] for summary in json.loads(out)["summaries"]}
    code, out, _ = run_cli(capsys, "compare", path, "--strategies", "megatron", "--json")
    assert code == 0 and steps["megatron"] == json.loads(out)["summaries"][0]["step_time_s"]
    code, out, _ = run_cli(capsys, "compare", path, "--strategies", "dp", "--json", "--set", "strategy.kind=dp",
                           "--set", "strategy.dp_sync=parameter_server")
    assert code == 0 and steps["dp"] == json.loads(out)["summaries"][0]["step_time_s"]  # the server kept for dp


def test_compare_of_a_parameter_server_scenario_without_megatron_has_no_note(capsys):
    code, _out, err = run_cli(capsys, "compare", PARAMETER_SERVER, "--strategies", "dp", "--json")
    assert code == 0 and err == ""


def test_rank_plays_megatron_candidates_of_a_parameter_server_laysa_scenario_densely(capsys, tmp_path):
    path = tiny_megatron(tmp_path)
    code, out, err = run_cli(capsys, "rank", path, "--kinds", "dp,megatron", "--workers", "1", "--json",
                             "--set", "strategy.dp_sync=parameter_server", "--set", "training.memory_policy=laysa",
                             "--set", "strategy.gradient_compression=topk")
    assert code == 0, err
    ranking = json.loads(out)
    megatron = [row for row in ranking["rows"] if row["kind"] == "megatron"]
    assert megatron and "dp" in {row["kind"] for row in ranking["rows"]}
    assert not any(key in row["reason"] for row in ranking["skipped"] for key in ("dp_sync", "laysa", "topk"))

@pytest.mark.parametrize("setting, value, what", [
    ("strategy.gradient_compression", "topk", "megatron reduces dense gradients"),
    ("training.memory_policy", "laysa", "megatron keeps each gradient until the update")])
def test_gradient_settings_megatron_does_not_play_are_refused_not_ignored(capsys, tmp_path, setting, value, what):
    path = tiny_megatron(tmp_path)
    assert_one_line_error(run_cli(capsys, "simulate", path, "--set", f"{setting}={value}"),
                          f"{path}: {setting}: {value} applies to kinds dp, mp, ghp and the pipeline kinds; {what}")


def test_compare_plays_a_laysa_topk_scenario_as_dense_megatron_with_a_note(capsys, tmp_path):
    path = tiny_megatron(tmp_path)
    code, out, err = run_cli(capsys, "compare", path, "--strategies", "dp,megatron", "--json",
                             "--set", "strategy.kind=dp", "--set", "training.memory_policy=laysa",
                             "--set", "strategy.gradient_compression=topk")
    assert code == 0 and err.startswith("ghpsim: note: strategy.gradient_compression topk, training.memory_policy "
                                        "laysa: not used by the megatron item"), err
    steps = {summary["strategy"]: summary["step_time_s"] for summary in json.loads(out)["summaries"]}
    code, out, _ = run_cli(capsys, "compare", path, "--strategies", "megatron", "--json",
                           "--set", "training.memory_policy=reuse")
    assert code == 0 and steps["megatron"] == json.loads(out)["summaries"][0]["step_time_s"]


def test_parameter_server_shards_without_a_parameter_server_are_refused(capsys):
    assert_one_line_error(run_cli(capsys, "simulate", "scenarios/demo.yaml", "--set", "strategy.num_parameter_servers=2"),
                          "strategy.num_parameter_servers: 2 shards apply with strategy.dp_sync: parameter_server")
