"""Sharded data parallelism for real (validator/fsdp_runtime.py): 2-process gloo runs of megatron
plans with tp = pp = 1 under FSDP2 (`fully_shard`) and DDP end with the parameters of
single-process training on the global batch, hold exactly the sharded states the simulator counts,
and `ghpsim validate` runs them end to end or refuses other layouts in one line."""

import json

import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch")

from ghpsim.cli import main  # noqa: E402
from simulator import load_scenario, simulate  # noqa: E402
from simulator.profile import FORMAT  # noqa: E402
from simulator.profile_costs import profile_costs  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.measure import RunOptions, reference_training, run_rank  # noqa: E402
from validator.validate import predictions, prepare_case  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

STEPS = 2
MLP = {"name": "mlp", "params": {"input_dim": 32, "hidden_dim": 48, "num_hidden_layers": 3, "num_classes": 10}}
"""Every weight and bias has an even first dimension, so FSDP2 shards it over 2 ranks without padding."""


def megatron_scenario(sharding: str, num_microbatches: int = 1, num_nodes: int = 1, **strategy) -> dict:
    return {
        "name": "mlp_fsdp",
        "cluster": {"num_nodes": num_nodes, "gpus_per_node": 2 // num_nodes, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MLP,
        "strategy": {"kind": "megatron", "fsdp_sharding": sharding, "num_microbatches": num_microbatches, **strategy},
        "training": {"global_batch_size": 8, "optimizer": "momentum"},
    }


def relative_error(actual, expected) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("sharding, num_microbatches, num_nodes", [
    ("full_shard", 2, 1), ("shard_grad_op", 1, 1), ("no_shard", 2, 1),
    ("hybrid_shard", 1, 2),  # one rank per node: a 2-D mesh of 2 replicas x 1 shard
])
def test_sharded_runs_end_with_the_parameters_of_single_process_training(sharding, num_microbatches, num_nodes):
    result = simulate(load_scenario(megatron_scenario(sharding, num_microbatches, num_nodes)))
    options = RunOptions(steps=STEPS, warmup=0, optimizer="momentum", learning_rate=0.05, return_state=True,
                         measure_memory=True)
    ranks = spawn(run_rank, (result.plan, result.workload, options), LaunchConfig(2, timeout_s=120))
    reference = reference_training(result.workload, 8, STEPS, "momentum", 0.05)
    for rank in ranks:  # each rank gathers the full parameters
        assert set(rank["state"]) == set(reference)
        worst = max(relative_error(torch.from_numpy(rank["state"][name]), reference[name]) for name in reference)
        assert worst <= 1e-5
    initial = reference_training(result.workload, 8, 0, "momentum", 0.05)
    assert max(relative_error(reference[name], initial[name]) for name in reference) > 1e-3
    # between steps a rank holds its parameter shard, its gradient shard and its momentum shard
    # (4 bytes each per parameter, / 2 ranks when sharded): what the simulator's memory model counts
    breakdown = result.summary["devices"][0]["memory_breakdown_bytes"]
    states = breakdown["weights"] + breakdown["weight_gradients"] + breakdown["optimizer_state"]
    expected = 3 * 4 * result.workload.num_params / result.plan.meta["tensor"]["shard_degree"]
    if sharding != "shard_grad_op":  # ZeRO-2 keeps whole weights; FSDP2's parameters stay sharded between steps
        assert states == expected
    assert [rank["persistent_bytes"] for rank in ranks] == [expected, expected]
    assert all(rank["peak_memory_bytes"] > rank["persistent_bytes"] for rank in ranks)


def synthetic_profile(path, workload) -> None:
    """A CPU profile of `workload` at world size 2 (invented figures: the test checks the flow)."""
    fit = {"latency_s": 1e-4, "bandwidth_bytes_per_s": 1e9}
    path.write_text(json.dumps({
        "format": FORMAT, "device": {"kind": "cpu", "name": "test", "num_threads": 1}, "backend": "gloo",
        "world_size": 2, "model": {"name": workload.name, "layer_names": [layer.name for layer in workload.layers]},
        "layers": [{"name": layer.name, "forward": {"intercept_s": 1e-4, "per_sample_s": 1e-5},
                    "backward": {"intercept_s": 1e-4, "per_sample_s": 2e-5}} for layer in workload.layers],
        "optimizer": {"name": "momentum", "intercept_s": 0.0, "per_param_s": 1e-9},
        "p2p": fit, "allreduce": {"2": fit}, "allgather": {"2": fit}, "compute_slowdown": {"1": 1.0, "2": 1.0}}))


def write_inputs(tmp_path, **strategy):
    data = megatron_scenario(strategy.pop("sharding", "full_shard"), **strategy)
    scenario = tmp_path / "mlp_fsdp.yaml"
    scenario.write_text(yaml.safe_dump(data))
    profile = tmp_path / "profile.json"
    synthetic_profile(profile, simulate(load_scenario(data)).workload)
    return scenario, profile


def test_validate_runs_a_zero3_scenario_and_reports_step_time_and_memory(tmp_path, capsys):
    scenario, profile = write_inputs(tmp_path)
    assert main(["validate", str(scenario), "--profile", str(profile), "--steps", "2", "--warmup", "1",
                 "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].strip().startswith("megatron:full_shard (G=2 x M=1)  predicted") and " measured " in lines[0]
    assert lines[1].strip().startswith("peak memory per rank  predicted") and "MiB  measured" in lines[1]
    (row,) = pd.read_csv(tmp_path / "out" / "mlp_fsdp.csv").to_dict("records")
    assert row["world_size"] == 2 and row["measured_s"] > 0
    expected = predictions(load_scenario(scenario), str(profile), [("megatron", None)],
                           RunOptions(optimizer="momentum"))
    assert expected == {row["strategy"]: pytest.approx(row["predicted_s"], rel=1e-12)}
    assert row["error_pct"] == pytest.approx(100 * (row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    predicted = simulate(load_scenario(scenario)).summary["memory"]["peak_memory_bytes"]
    assert row["predicted_peak_memory_bytes"] == predicted  # memory needs no profile
    assert row["measured_peak_memory_bytes"] > row["measured_persistent_bytes"] == 3 * 4 * 6778 / 2
    assert row["memory_error_pct"] == pytest.approx(
        100 * (predicted - row["measured_peak_memory_bytes"]) / row["measured_peak_memory_bytes"])


@pytest.mark.parametrize("strategy, field", [({"tp_degree": 2, "sharding": "no_shard"}, "strategy.tp_degree: 2"),
                                             ({"cp_degree": 2, "sharding": "no_shard"}, "strategy.cp_degree: 2"),
                                             ({"sharding": None, "zero_stage": 1}, "strategy.zero_stage: 1"),
                                             ({"sharding": "full_shard", "fsdp_reduce_dtype": "bf16"},
                                              "strategy.fsdp_reduce_dtype: bf16"),
                                             ({"sharding": "full_shard", "fsdp_version": 1}, "strategy.fsdp_version: 1")])
def test_validate_refuses_other_megatron_layouts_in_one_line(tmp_path, capsys, strategy, field):
    scenario, profile = write_inputs(tmp_path, sharding="no_shard")
    data = yaml.safe_load(scenario.read_text())
    sharding = strategy.pop("sharding")
    data["strategy"] = {**data["strategy"], "fsdp_sharding": sharding, **strategy}
    if sharding is None:
        del data["strategy"]["fsdp_sharding"]
    scenario.write_text(yaml.safe_dump(data))
    code = main(["validate", str(scenario), "--profile", str(profile), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err, err


def test_a_megatron_plan_on_a_shared_cpu_host_is_simulated_rank_by_rank(tmp_path):
    """A calibration profile prices a collective by its ranks (and its ranks share the host's
    cores), so one folded representative would be priced alone: the run is not folded, and it
    predicts what the unfolded run predicts."""
    scenario, profile = write_inputs(tmp_path)
    workload = simulate(load_scenario(scenario)).workload
    auto = simulate(load_scenario(scenario), costs=profile_costs(profile, workload), workload=workload)
    assert auto.plan.meta["symmetry_decision"]["used"] is False
    assert "calibration profile" in auto.plan.meta["symmetry_decision"]["reason"]
    data = yaml.safe_load(scenario.read_text())
    data["strategy"]["symmetry"] = "off"
    off = simulate(load_scenario(data), costs=profile_costs(profile, workload), workload=workload)
    assert auto.step_time_s == pytest.approx(off.step_time_s, rel=1e-12)


def test_zero_stage_2_is_predicted_as_the_shard_grad_op_that_runs(tmp_path):
    """The validator runs `zero_stage: 2` as FSDP2 SHARD_GRAD_OP (it has no DeepSpeed), so it predicts
    that plan: gathers before each forward, none after the update, as `fsdp_sharding: shard_grad_op`."""
    scenario, profile = write_inputs(tmp_path)
    data = yaml.safe_load(scenario.read_text())
    del data["strategy"]["fsdp_sharding"]
    data["strategy"]["zero_stage"] = 2
    workload = simulate(load_scenario(data)).workload
    costs = profile_costs(profile, workload)
    case = prepare_case(load_scenario(data), workload, costs, "megatron", None, RunOptions(optimizer="momentum"))
    ops = [action.op for action in case.plan.actions[0] if type(action).__name__ == "Collective"]
    assert case.plan.meta["tensor"]["fsdp_sharding"] == "shard_grad_op"
    assert ops and ops[0] == "allgather" and ops[-1] == "reduce_scatter"  # no allgather after the update
    data["strategy"]["fsdp_sharding"] = "shard_grad_op"
    explicit = simulate(load_scenario(data), costs=costs, workload=workload)
    assert case.predicted.step_time_s == pytest.approx(explicit.step_time_s, rel=1e-12)
