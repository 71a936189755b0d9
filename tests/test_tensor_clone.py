"""A full megatron plan whose ranks are relabelled from their stage's first rank
(`simulator.strategies.tensor_clone`) equals the plan built rank by rank, action for action."""

from pathlib import Path

import pytest

from simulator.fabrics import build_topology
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from simulator.simulate import analytic_costs
from simulator.strategies import compile_plan, tensor
from simulator.strategies.tensor_clone import relabelled_ranks_alike

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
GPT2 = SCENARIOS / "gpt2_1.5b_dgx_a100_3d.yaml"
SMALL = ["strategy.symmetry=off", "model.params.num_layers=8", "strategy.num_microbatches=4",
         "training.global_batch_size=64"]

CASES = {
    "1f1b, overlapped buckets": [],
    "interleaved, selective recompute, sequence parallel": [
        "strategy.num_virtual_stages=2", "training.recompute=selective",
        "strategy.sequence_parallel=true"],
    "ZeRO-1, full recompute, gradients after the last micro-batch": [
        "strategy.zero_stage=1", "training.recompute=full", "strategy.overlap_backward=false"],
    "ZeRO-2 (no pipeline), TP comm overlap, devices in reverse order": [
        "strategy.zero_stage=2", "strategy.pp_degree=1", "strategy.sequence_parallel=true",
        "strategy.tp_comm_overlap=true", f"strategy.placement={list(range(31, -1, -1))}"],
    "no TP, 4 stages": ["strategy.tp_degree=1", "strategy.pp_degree=4"],
}


def _plans(overrides: list[str], monkeypatch):
    scenario = load_scenario(GPT2, SMALL + overrides)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    topology = build_topology(scenario.cluster)
    costs = analytic_costs(scenario, workload)
    relabelled = compile_plan(scenario, workload, topology, costs)
    with monkeypatch.context() as patch:
        patch.setattr(tensor, "relabelled_ranks_alike", lambda config, workload: False)
        built = compile_plan(scenario, workload, topology, costs)
    return scenario, workload, relabelled, built


@pytest.mark.parametrize("name", CASES)
def test_relabelled_plan_equals_the_built_one(name, monkeypatch):
    scenario, workload, relabelled, built = _plans(CASES[name], monkeypatch)
    config = tensor.tensor_config(scenario)
    assert relabelled_ranks_alike(config, workload)
    assert relabelled.num_ranks > config.pp  # ranks beyond pipeline 0 were relabelled
    assert len(relabelled.actions) == len(built.actions)
    for rank, (ours, theirs) in enumerate(zip(relabelled.actions, built.actions)):
        assert ours == theirs, f"rank {rank} differs"
    assert relabelled.meta["recompute_actions"] == built.meta["recompute_actions"]


def test_expert_and_context_parallel_plans_are_built_rank_by_rank():
    scenario = load_scenario(GPT2, SMALL + ["strategy.cp_degree=2"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert not relabelled_ranks_alike(tensor.tensor_config(scenario), workload)
    zero3 = load_scenario(GPT2, SMALL + ["strategy.zero_stage=3", "strategy.pp_degree=1"])
    assert not relabelled_ranks_alike(tensor.tensor_config(zero3), workload)
