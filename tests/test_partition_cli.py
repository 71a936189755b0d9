"""`ghpsim partition` (PipeDream's partitioner on a scenario) and `strategy.partition: pipedream`."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import yaml

from ghpsim.cli import main
from simulator import load_scenario, simulate
from simulator.collective_forms import ring_allreduce_time_s
from simulator.costs import BACKWARD, FORWARD
from simulator.errors import ScenarioError
from simulator.fabrics import build_topology
from simulator.model_source import resolve_workload
from simulator.pipedream_costs import grid_stage_costs
from simulator.pipedream_partition import StageCosts, pipedream_partition
from simulator.placement import place_ranks
from simulator.simulate import analytic_costs
from simulator.strategies.pipeline import pipeline_config

ROOT = Path(__file__).resolve().parent.parent
CUSTOM = str(ROOT / "scenarios" / "custom_layers.yaml")  # tiny MLP, 2 nodes x 2 toy GPUs, ghp 2 x 2
DEMO = str(ROOT / "scenarios" / "demo.yaml")  # VGG16, 4 x 4 V100, ghp 8 x 2

TOY_CLUSTER = {
    "num_nodes": 2, "gpus_per_node": 4,
    "gpu": {"name": "toy", "peak_flops_per_s": {"fp32": "10 TFLOP/s"}, "memory_bytes": "16 GiB",
            "memory_bandwidth_bytes_per_s": "500 GB/s"},
    "intra_node_link": {"name": "toy-pcie", "latency_s": "5 us", "bandwidth_bytes_per_s": "16 GB/s"},
    "inter_node_link": {"name": "toy-eth", "latency_s": "20 us", "bandwidth_bytes_per_s": "10 Gb/s"},
}

# Layers whose compute and parameters differ by orders of magnitude: heavy convolutions without many
# weights, then fully connected layers with many weights and little compute (VGG-like).
UNBALANCED_LAYERS = [
    {"name": f"l{i}", "kind": "conv" if flops > 1e8 else "linear", "forward_flops_per_sample": flops,
     "num_params": params, "input_elements_per_sample": size, "output_elements_per_sample": size}
    for i, (flops, params, size) in enumerate([
        (3e9, 2_000, 200_000), (1e8, 40_000, 100_000), (4e9, 60_000, 100_000), (2e9, 500_000, 50_000),
        (5e7, 30_000_000, 4096), (2e7, 16_000_000, 4096), (1e6, 40_000, 1000)])
]


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_scenario(tmp_path, **sections) -> str:
    raw = {"name": "toy", "cluster": TOY_CLUSTER, "model": {"layers": UNBALANCED_LAYERS},
           "strategy": {"kind": "dp"}, "training": {"global_batch_size": 48, "dtype": "fp32", "optimizer": "adam"}}
    for key, value in sections.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and key != "model" else value
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def check_cover(plan: dict, num_layers: int, num_workers: int) -> None:
    stages = plan["stages"]
    assert stages[0]["layer_start"] == 0 and stages[-1]["layer_end"] == num_layers
    assert all(a["layer_end"] == b["layer_start"] for a, b in zip(stages, stages[1:]))
    assert all(s["layer_end"] > s["layer_start"] for s in stages)
    assert sum(s["num_replicas"] for s in stages) == num_workers


# ----------------------------------------------------------------------------- the command


@pytest.mark.parametrize("workers", [None, "3", "1"])
def test_stages_cover_every_layer_once_and_replicas_sum_to_the_workers(capsys, workers):
    extra = () if workers is None else ("--workers", workers)
    code, out, err = run_cli(capsys, "partition", CUSTOM, "--json", *extra)
    assert code == 0, err
    document = json.loads(out)
    num_workers = 4 if workers is None else int(workers)
    assert document["num_workers"] == num_workers and document["num_layers"] == 4
    check_cover(document["pipedream"], 4, num_workers)
    check_cover(document["plain_dp"], 4, num_workers)
    assert [s["num_replicas"] for s in document["plain_pipeline"]["stages"]] == [1] * num_workers
    # plain DP and the plain pipeline are in the search space, and everything fits 16 GiB
    best = document["pipedream"]["time_per_microbatch_s"]
    assert best <= document["plain_dp"]["time_per_microbatch_s"] * (1 + 1e-12)
    assert best <= document["plain_pipeline"]["time_per_microbatch_s"] * (1 + 1e-12)
    code, text, _ = run_cli(capsys, "partition", CUSTOM, *extra)
    assert code == 0
    for stage in document["pipedream"]["stages"]:
        row = f"[{stage['layer_start']}, {stage['layer_end']})"
        assert row in text and f"{stage['time_s'] * 1e3:.3f}" in text


def test_plain_dp_is_compute_plus_ring_allreduce_over_the_workers(capsys):
    # 2 workers on one node of the custom scenario: (sum of F + B at b + ring allreduce of all
    # gradients over the intra-node link) / 2, b = B / G = 32 (ghp G = 2).
    code, out, err = run_cli(capsys, "partition", CUSTOM, "--workers", "2", "--json")
    assert code == 0, err
    document = json.loads(out)
    scenario = load_scenario(CUSTOM)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = analytic_costs(scenario, workload)
    assert document["microbatch_size"] == 32
    compute = sum(costs.compute_s(i, FORWARD, 32) + costs.compute_s(i, BACKWARD, 32) for i in range(4))
    latency = build_topology(scenario.cluster).route_latency_s(0, 1)
    sync = ring_allreduce_time_s(workload.num_params * 4, 2, latency, 16e9)
    assert document["plain_dp"]["time_per_microbatch_s"] == pytest.approx((compute + sync) / 2, rel=1e-12)
    # adam, fp32: weights + gradients + two moments, plus the activations saved at b = 32
    saved = sum(layer.saved_elements_per_sample for layer in workload.layers) * 32 * 4
    assert document["plain_dp"]["peak_memory_bytes"] == pytest.approx(workload.num_params * 16 + saved)


def test_profile_gives_the_compute_times(capsys):
    # One worker, one stage: the whole model's forward + backward at b = 64 / 4 = 16 samples from the
    # profile's fits, as one rank alone (compute_slowdown[1] / compute_slowdown[world size]).
    profile = ROOT / "reports" / "profiles" / "mlp_cpu_ws4.json"
    document = json.loads(profile.read_text())
    scale = document["compute_slowdown"]["1"] / document["compute_slowdown"][str(document["world_size"])]
    expected = scale * sum(layer[phase]["intercept_s"] + layer[phase]["per_sample_s"] * 16
                           for layer in document["layers"] for phase in ("forward", "backward"))
    code, out, err = run_cli(capsys, "partition", str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml"),
                             "--profile", str(profile), "--workers", "1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["microbatch_size"] == 16 and result["costs"] == str(profile)
    assert result["pipedream"]["time_per_microbatch_s"] == pytest.approx(expected, rel=1e-12)


def test_json_round_trips_and_matches_the_table(capsys):
    code, out, _ = run_cli(capsys, "partition", DEMO, "--json")
    assert code == 0
    document = json.loads(out)
    assert json.loads(json.dumps(document)) == document
    check_cover(document["pipedream"], 16, 16)
    code, text, _ = run_cli(capsys, "partition", DEMO)
    for key in ("pipedream", "plain_dp", "plain_pipeline"):
        assert f"{document[key]['time_per_microbatch_s'] * 1e3:.3f}" in text


def test_memory_limits_choose_a_partition_that_fits(tmp_path, capsys):
    path = write_scenario(tmp_path)
    code, out, _ = run_cli(capsys, "partition", path, "--json", "--workers", "4")
    assert code == 0
    roomy = json.loads(out)
    dp_bytes, pipeline_bytes = roomy["plain_dp"]["peak_memory_bytes"], roomy["plain_pipeline"]["peak_memory_bytes"]
    assert pipeline_bytes < dp_bytes
    limit = (dp_bytes + pipeline_bytes) / 2  # the plain pipeline fits, plain DP does not
    gpu = {**TOY_CLUSTER["gpu"], "memory_bytes": limit}
    path = write_scenario(tmp_path, cluster={"gpu": gpu})
    code, out, err = run_cli(capsys, "partition", path, "--json", "--workers", "4")
    assert code == 0, err
    document = json.loads(out)
    pipedream = document["pipedream"]
    assert pipedream["fits_in_memory"] and all(s["memory_bytes"] <= limit for s in pipedream["stages"])
    assert not document["plain_dp"]["fits_in_memory"] and document["plain_pipeline"]["fits_in_memory"]
    check_cover(document["pipedream"], len(UNBALANCED_LAYERS), 4)


def test_no_partition_fitting_memory_exits_2_with_one_line(tmp_path, capsys):
    path = write_scenario(tmp_path, cluster={"gpu": {**TOY_CLUSTER["gpu"], "memory_bytes": "1 MiB"}})
    code, out, err = run_cli(capsys, "partition", path)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "cluster.gpu.memory_bytes: no PipeDream partition" in err and "Traceback" not in err


@pytest.mark.parametrize("workers", ["0", "9"])
def test_bad_worker_count_is_a_one_line_error(tmp_path, capsys, workers):
    code, _, err = run_cli(capsys, "partition", write_scenario(tmp_path), "--workers", workers)
    assert code == 2 and err.count("\n") == 1 and "--workers" in err


def test_too_large_a_search_is_refused_with_one_line(capsys):
    code, _, err = run_cli(capsys, "partition", str(ROOT / "scenarios" / "gpt3_175b_dgx_a100_3d.yaml"))
    assert code == 2 and err.count("\n") == 1 and "--workers: PipeDream's dynamic program over 98 layers" in err


# ----------------------------------------------------------------------------- fixed replication


def _brute_force(costs: StageCosts, num_layers: int, num_stages: int, replicas: int):
    """Every set of cuts into `num_stages` ranges, each replicated `replicas` times: (time, ranges)."""
    options = []
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = (0, *cuts, num_layers)
        ranges = tuple(zip(bounds[:-1], bounds[1:]))
        options.append((max(costs.time_s(a, b, replicas) for a, b in ranges), ranges))
    return sorted(options)


@pytest.mark.parametrize("seed", range(8))
def test_fixed_replicas_equal_brute_force(seed):
    rng = random.Random(seed)
    num_layers, replicas = rng.randint(2, 7), rng.randint(1, 3)
    num_stages = rng.randint(1, num_layers)
    costs = StageCosts(compute_s=[rng.uniform(0.5, 3) for _ in range(num_layers)],
                       gradient_bytes=[rng.choice([0.0, 100.0, 2000.0]) for _ in range(num_layers)],
                       boundary_s=[rng.uniform(0, 1) for _ in range(num_layers)],
                       allreduce_s=lambda size, r: 2 * (r - 1) / r * size / 1e3 + 0.01 * (r - 1))
    partition = pipedream_partition(costs, num_stages * replicas, replicas=replicas)
    assert [s.num_replicas for s in partition.stages] == [replicas] * num_stages
    assert partition.slowest_stage_s == pytest.approx(_brute_force(costs, num_layers, num_stages, replicas)[0][0])


def test_fixed_replicas_must_divide_the_workers():
    costs = StageCosts(compute_s=[1.0, 1.0], gradient_bytes=[0.0, 0.0], boundary_s=[0.0, 0.0],
                       allreduce_s=lambda size, r: 0.0)
    with pytest.raises(ScenarioError, match="strategy.partition"):
        pipedream_partition(costs, 3, replicas=2)


# ----------------------------------------------------------------------------- strategy.partition: pipedream

GRIDS = {  # strategy section, GPUs used (nodes x 4)
    "ghp 2 x 3": ({"kind": "ghp", "num_groups": 2, "placement": "stage_per_node"}, (2, 3)),
    "ghp 4 x 2": ({"kind": "ghp", "num_groups": 4}, (2, 4)),
    "mp 4": ({"kind": "mp"}, (1, 4)),
    "1f1b 2 x 4, m 4": ({"kind": "1f1b", "num_groups": 2, "num_microbatches": 4}, (2, 4)),
    "pipedream 2 x 3, m 2": ({"kind": "pipedream", "num_groups": 2, "num_microbatches": 2}, (2, 3)),
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_pipedream_partition_equals_brute_force_over_contiguous_splits(tmp_path, name):
    strategy, (nodes, gpus_per_node) = GRIDS[name]
    path = write_scenario(tmp_path, cluster={"num_nodes": nodes, "gpus_per_node": gpus_per_node},
                          strategy={**strategy, "partition": "pipedream"})
    scenario = load_scenario(path)
    result = simulate(scenario)
    groups, stages = scenario.grid()
    # the cost function the partitioner used, rebuilt from the scenario
    workload = resolve_workload(scenario.model, scenario.base_dir)
    topology = build_topology(scenario.cluster)
    config = pipeline_config(scenario).grid() if scenario.strategy.kind in ("1f1b", "pipedream") else None
    if config is None:
        from simulator.strategies import grid_config
        config = grid_config(scenario)
        batch = scenario.training.global_batch_size / groups
    else:
        batch = scenario.training.global_batch_size / (groups * scenario.strategy.num_microbatches)
    devices = place_ranks(config.placement, groups, stages, topology.gpus_per_node)
    costs = grid_stage_costs(config, workload, topology, analytic_costs(scenario, workload), devices, batch)
    options = _brute_force(costs, workload.num_layers, stages, groups)
    best_s = options[0][0]
    optimal = [[b - a for a, b in ranges] for value, ranges in options if value <= best_s * (1 + 1e-12)]
    assert result.summary["partition"] in optimal  # the slowest stage often leaves other cuts free (ties)
    balanced = simulate(load_scenario(path, ["strategy.partition=balanced"])).summary["partition"]
    bounds = list(itertools.accumulate(balanced, initial=0))
    assert max(costs.time_s(a, b, groups) for a, b in zip(bounds, bounds[1:])) >= best_s


def test_the_balanced_partition_weighs_each_stage_allreduce_on_the_demo():
    # VGG16 ghp 8 x 2 over 10 GbE: the fully connected layers' 120 M parameters make a stage's
    # allreduce dominate its step, so the balanced partition (which counts it, as PipeDream's cost
    # does) picks the fastest of every two-stage split, faster than PipeDream's own.
    balanced = simulate(load_scenario(DEMO))
    splits = {a: simulate(load_scenario(DEMO, [f"strategy.partition=[{a},{16 - a}]"])).step_time_s for a in range(1, 16)}
    assert balanced.step_time_s == pytest.approx(min(splits.values()), rel=1e-12)
    assert simulate(load_scenario(DEMO, ["strategy.partition=pipedream"])).step_time_s > balanced.step_time_s
    assert max(splits.values()) > 1.2 * balanced.step_time_s


def test_unknown_partition_name_is_rejected():
    with pytest.raises(ScenarioError, match="strategy.partition"):
        load_scenario(DEMO, ["strategy.partition=pipedreams"])


def test_data_parallel_keeps_the_whole_model_in_one_stage():
    balanced = simulate(load_scenario(CUSTOM, ["strategy.kind=dp"]))
    pipedream = simulate(load_scenario(CUSTOM, ["strategy.kind=dp", "strategy.partition=pipedream"]))
    assert pipedream.summary["partition"] == [4]
    assert pipedream.step_time_s == balanced.step_time_s


def test_a_heterogeneous_cluster_is_said_to_be_partitioned_as_identical_workers(capsys):
    assert main(["partition", DEMO, "--workers", "8", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["partition", DEMO, "--workers", "8", "--json", "--set", "cluster.stragglers={0: 10}"]) == 0
    slowed = json.loads(capsys.readouterr().out)
    assert "note" not in plain and "assumes identical workers" in slowed.pop("note")
    assert slowed["pipedream"] == plain["pipedream"]  # the straggler is not priced: said, not hidden


def test_partition_prices_training_recompute_in_time_and_memory(capsys):
    """Full recompute runs each forward twice and keeps each layer's input only: one stage's time is
    (2 F + B) summed over its layers, its activations the layers' inputs; `gpt2_mp_pcie` (full
    recompute, 11 GB GPUs), which simulate fits at 7.4 GiB, gets a partition that fits."""
    from simulator.pipedream_costs import activation_bytes, layer_compute_s
    vgg = ROOT / "scenarios" / "pipeline_vgg16_1f1b_pcie.yaml"
    figures = {}
    for mode in ("none", "full"):
        assert main(["partition", str(vgg), "--json", "--set", f"training.recompute={mode}"]) == 0
        figures[mode] = json.loads(capsys.readouterr().out)["plain_pipeline"]["stages"]
    scenario = load_scenario(vgg)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = analytic_costs(scenario, workload)
    batch = 1.0
    none_s, full_s = layer_compute_s(costs, workload, batch), layer_compute_s(costs, workload, batch, "full")
    assert full_s == pytest.approx([t + costs.compute_s(i, FORWARD, batch) for i, t in enumerate(none_s)])
    kept = activation_bytes(workload, 2.0, 4, "full")
    assert kept == [2.0 * 4 * layer.input_elements_per_sample for layer in workload.layers]
    assert max(f["time_s"] for f in figures["full"]) > max(n["time_s"] for n in figures["none"])
    assert sum(f["memory_bytes"] for f in figures["full"]) < sum(n["memory_bytes"] for n in figures["none"])
    assert main(["partition", str(ROOT / "scenarios" / "gpt2_mp_pcie.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pipedream"]["stages"][0]["fits_in_memory"]
