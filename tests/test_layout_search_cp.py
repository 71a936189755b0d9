"""Context parallelism in the layout search (simulator/layout_search.py): CP degrees are enumerated
only where the simulator runs them (simulator/strategies/context.py), the step-time bound and the
memory floor (simulator/step_bound.py, simulator/memory_floor.py) stay below the simulation for
c > 1, the pruned search keeps the exhaustive best, and labels, scenarios and rows carry c."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.fabrics import build_topology, cached_topology
from simulator.hardware import GPUS
from simulator.layout_search import context_degrees, exact_peak_memory_bytes, megatron_space, search_layouts
from simulator.planner import Candidate, _row, _workload, candidate_scenario, scenario_for_gpus
from simulator.scenario import load_scenario, scenario_from_dict
from simulator.search_gates import CP_UNFOLDED_PASSES, megatron_folds
from simulator.simulate import analytic_costs, simulate
from simulator.step_bound import BoundModel
from simulator.strategies.tensor import tensor_config

pytestmark = pytest.mark.slow  # exhaustive layout searches end to end: `python -m pytest -m slow`


def tiny_llama(num_nodes=2, gpus_per_node=4, batch=8, seq_len=256, layers=4, memory=None) -> dict:
    """A 4-block LLaMA (GQA, SwiGLU) on 2 nodes of 4 A100s: CP groups of 2 and 4 fit in a node."""
    gpu = "A100-80GB" if memory is None else {**GPUS["A100-80GB"].model_dump(mode="json"), "memory_bytes": memory}
    return {"name": "tiny_llama",
            "cluster": {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node, "gpu": gpu,
                        "intra_node_link": "nvlink3-a100", "inter_node_link": "ib-hdr"},
            "model": {"name": "llama", "params": {"num_layers": layers, "hidden_size": 256, "num_heads": 8,
                                                  "num_kv_heads": 4, "seq_len": seq_len, "vocab_size": 1024,
                                                  "ffn_hidden_size": 512}},
            "training": {"global_batch_size": batch, "dtype": "bf16", "optimizer": "adam"},
            "costs": {"host_overhead_s": 0}}  # the GPU's work alone: a 256-wide model is otherwise host-bound


def space_of(raw: dict, sizes=(1, 2, 4)):
    scenario = load_scenario(raw)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    return scenario, workload, megatron_space(scenario, workload, sizes)


def megatron_search(raw: dict, overrides=(), **options):
    return search_layouts(load_scenario(raw, list(overrides)), kinds=("megatron",), microbatch_sizes=(1, 2),
                          workers=1, show_progress=False, **{"context": True, **options})


def test_cp_degrees_follow_the_simulator_s_rules():
    scenario, _, space = space_of(tiny_llama())
    n, batch = scenario.num_gpus, scenario.training.global_batch_size
    # powers of two with t c dividing the 4 GPUs of a node (CP groups inside a node); across nodes
    # only up to the scenario's c, here 1
    assert {(c.tp_degree, c.cp_degree) for c in space if c.cp_degree > 1} == {(1, 2), (1, 4), (2, 2)}
    _, _, across = space_of({**tiny_llama(), "strategy": {"kind": "megatron", "cp_degree": 2}})
    assert {(c.tp_degree, c.cp_degree) for c in across if c.cp_degree > 1} == {(1, 2), (1, 4), (2, 2), (4, 2)}
    assert {c.cp_degree for c in space} == {1, 2, 4}
    for c in space:
        d = c.data_parallel
        assert c.tp_degree * c.cp_degree * c.workers_per_group * d == n and c.num_groups == n // c.workers_per_group
        if c.cp_degree > 1:  # ZeRO 0 / 1 and no EP (the simulator refuses the rest); b < c (module docstring)
            assert c.zero_stage in (0, 1) and c.ep_degree is None
            assert batch // (d * c.num_microbatches) < c.cp_degree
    assert any(c.cp_degree > 1 and c.zero_stage == 1 and c.data_parallel == 1 for c in space)  # ZeRO-1 over c
    assert len({c.label for c in space}) == len(space)


@pytest.mark.parametrize("model, expected", [
    ({"name": "mlp"}, {1}),  # no attention layer
    ({"name": "llama", "params": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 6,
                                  "vocab_size": 100, "ffn_hidden_size": 128}}, {1}),  # 6 is not 2 x 2 chunks
    ({"name": "llama", "params": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 12,
                                  "vocab_size": 100, "ffn_hidden_size": 128}}, {1, 2}),  # 12 is not 2 x 4 chunks
])
def test_no_cp_without_attention_or_where_the_sequence_does_not_split(model, expected):
    _, _, space = space_of({**tiny_llama(), "model": model})
    assert {c.cp_degree for c in space} == expected


def test_labels_scenarios_placements_and_rows_carry_c():
    scenario = load_scenario(tiny_llama())
    plain = Candidate("megatron", 4, 2, "tp_dp_pp", 4, 1, 1, "none", 1, False)
    assert plain.label == "megatron (t=1 x p=2 x d=4) m=4 recompute=none zero1 tp-dp-pp"  # c = 1: as before
    assert Candidate("megatron", 4, 2, "tp_dp_pp", 4, 1, 1, "none", 1, False, None, 1).label == plain.label
    layout = Candidate("megatron", 4, 2, "tp_dp_pp", 4, 1, 1, "none", 1, False, None, 2)
    assert layout.label == "megatron (t=1 x c=2 x p=2 x d=2) m=4 recompute=none zero1 tp-dp-pp"
    assert layout.data_parallel == 2
    raw = candidate_scenario(scenario, layout)
    assert raw["strategy"]["cp_degree"] == 2 and candidate_scenario(scenario, plain)["strategy"]["cp_degree"] == 1
    concrete = scenario_from_dict(raw)
    config = tensor_config(concrete)
    # tp_dp_pp: a stage's d c ranks side by side (CP pairs adjacent), stages one after another
    devices = {(replica, cp, pp): config.device_of(replica * 2 + cp, pp, 0)
               for replica in range(2) for cp in range(2) for pp in range(2)}
    assert devices == {(r, k, pp): pp * 4 + r * 2 + k for r in range(2) for k in range(2) for pp in range(2)}
    megatron_order = scenario_from_dict(candidate_scenario(scenario, Candidate(
        "megatron", 4, 2, "group_per_node", 4, 1, 1, "none", 1, False, None, 2)))
    assert megatron_order.strategy.placement == "group_per_node"
    result = simulate(concrete)
    assert result.plan.meta["tensor"]["cp_degree"] == 2 and result.plan.meta["tensor"]["dp_degree"] == 2
    outcome = {"summary": result.summary, "peak_memory_bytes": [result.summary["memory"]["peak_memory_bytes"]]}
    row = _row(layout, outcome, scenario.cluster.gpu.memory_bytes)
    assert (row["cp_degree"], row["tp_degree"]) == (2, 1)
    assert _row(plain, outcome, scenario.cluster.gpu.memory_bytes)["cp_degree"] == 1


@pytest.mark.parametrize("overrides", [
    (),
    ("cluster.topology=fat_tree", "strategy.overlap_backward=false", "training.recompute=selective"),
    ("strategy.tp_comm_overlap=true", "strategy.bucket_size_bytes=100000", "training.memory_policy=reuse"),
    ("cluster.intra_node_link=pcie3", "cluster.inter_node_link=10gbe", "strategy.bucket_size_bytes=1000000"),
])
def test_the_bound_is_never_above_the_simulated_time_with_cp(overrides):
    ranking = megatron_search(tiny_llama(), overrides, exhaustive=True)
    assert {row["cp_degree"] for row in ranking.rows} == {1, 2, 4} and not ranking.skipped
    for row in ranking.rows:
        assert 0 < row["bound_s"] <= row["step_time_s"], row["label"]
    context = [row for row in ranking.rows if row["cp_degree"] > 1]
    close = [row for row in context if row["bound_s"] >= 0.7 * row["step_time_s"]]
    assert len(close) >= 0.8 * len(context)  # and close for most (PCIe and 10 GbE: 87 %)


def test_memory_floor_with_cp_stays_below_the_memory_model():
    scenario, workload, space = space_of(tiny_llama(batch=16))
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    checked = [c for c in space if c.cp_degree > 1][::4]
    assert {c.cp_degree for c in checked} == {2, 4} and {c.zero_stage for c in checked} == {0, 1}
    peaks = []
    for candidate in checked:
        concrete = scenario_from_dict(candidate_scenario(scenario, candidate))
        simulated = simulate(concrete, workload=workload).summary["memory"]["peak_memory_bytes"]
        assert exact_peak_memory_bytes(concrete, workload) == pytest.approx(simulated, rel=1e-12), candidate.label
        assert model.memory_floor_bytes(candidate) <= simulated * (1 + 1e-12), candidate.label
        peaks.append(simulated)
    # a capacity between the CP layouts' peaks: the search drops exactly those the memory model rejects
    capacity = sorted(peaks)[len(peaks) // 2]
    ranking = megatron_search(tiny_llama(batch=16, memory=capacity), exhaustive=True)
    full = megatron_search(tiny_llama(batch=16), exhaustive=True)
    over = {row["label"] for row in full.rows if row["peak_memory_bytes"] > capacity}
    assert any(" c=" in label for label in over) and any(" c=" in row["label"] for row in ranking.rows)
    assert {entry["label"] for entry in ranking.pruned if entry["reason"] == "memory"} | \
        {row["label"] for row in ranking.rows if not row["fits_in_memory"]} == over


@pytest.mark.parametrize("raw, cp_best", [(tiny_llama(batch=16), False), (tiny_llama(batch=2, seq_len=2048), True)])
def test_the_first_ranked_equals_the_exhaustive_best_with_cp_in_the_space(raw, cp_best):
    full = megatron_search(raw, exhaustive=True)
    fitting = [row for row in full.rows if row["fits_in_memory"]]
    assert any(row["cp_degree"] > 1 for row in fitting)
    assert (fitting[0]["cp_degree"] > 1) == cp_best  # 2 sequences of 2,048 tokens on 8 GPUs: CP wins
    for top in (1, 3):
        pruned = megatron_search(raw, top=top)
        assert [(r["label"], r["step_time_s"]) for r in pruned.rows[:top]] == \
            [(r["label"], r["step_time_s"]) for r in fitting[:top]]
        assert pruned.stats.pruned_bound > 0 and pruned.stats.simulated < len(full.rows)
        kth = pruned.rows[top - 1]["step_time_s"]
        assert all(entry["bound_s"] > kth for entry in pruned.pruned if entry["reason"] != "memory")


@pytest.mark.parametrize("fabric", ["two_tier", "fat_tree"])
def test_large_cp_layouts_that_do_not_fold_are_skipped_with_the_reason(fabric):
    """256 GPUs with N m v over the budget for small d: on the two-tier fabric every CP layout inside
    a node folds and is searched (one across nodes may meet other replicas' hops on the node's NIC);
    on a fat-tree with a NIC per GPU, replicas' transfers meet other loads, the large ones do not
    fold and are skipped, each with the reason."""
    raw = tiny_llama(num_nodes=64, batch=4096)
    raw["cluster"].update(topology=fabric, nics_per_node=4 if fabric == "fat_tree" else 1)
    ranking = megatron_search(raw, top=1)
    reasons = {entry["label"] for entry in ranking.skipped if "context parallelism is simulated unfolded" in entry["reason"]}
    assert all(" c=" in label for label in reasons)
    scenario, _, space = space_of(raw, (1, 2))
    topology, folds = cached_topology(scenario.cluster.model_dump_json()), {}
    over = [c for c in space if c.cp_degree > 1
            and scenario.num_gpus * c.num_microbatches * c.num_virtual_stages > CP_UNFOLDED_PASSES]
    unfolded = [c for c in over if not megatron_folds(scenario, c, topology, folds)]
    # each is checked when its turn to be simulated comes: skipped with the reason, or dropped by the bound first
    pruned = {entry["label"] for entry in ranking.pruned}
    assert over and reasons == {c.label for c in unfolded} - pruned
    assert not reasons & {row["label"] for row in ranking.rows}
    if fabric == "two_tier":
        assert all(c.tp_degree * c.cp_degree > scenario.cluster.gpus_per_node for c in unfolded)
    else:
        assert len(unfolded) > 0


def test_the_unfolded_gate_is_asked_only_for_the_layouts_whose_turn_comes(monkeypatch):
    """The fold check behind `search_gates.unfolded_refusal` costs about a second at 16,384 GPUs, so
    the search asks it only for the candidates it is about to simulate: a refused one is skipped with
    its reason and the next in bound order takes its place; the bound drops the rest unasked."""
    import simulator.layout_search as layout_search
    raw = tiny_llama()
    first = megatron_search(raw, top=2)
    refused_label, asked = first.rows[0]["label"], []

    def refusal(scenario, candidate, topology, cache):
        asked.append(candidate.label)
        return "too big to simulate unfolded (test)" if candidate.label == refused_label else None

    monkeypatch.setattr(layout_search, "unfolded_refusal", refusal)
    again = megatron_search(raw, top=2)
    assert {"label": refused_label, "reason": "too big to simulate unfolded (test)"} in again.skipped
    assert refused_label not in {row["label"] for row in again.rows}
    assert again.rows[0]["label"] == first.rows[1]["label"]
    assert sorted(asked) == sorted([refused_label, *(row["label"] for row in again.rows)])
    assert again.stats.pruned_bound > 0


def test_a_cp_group_across_nodes_is_searched_as_the_405b_scenario_runs_it():
    # t 8 x c 2 on 8-GPU nodes: each CP pair spans two nodes at the same local rank (Megatron's order)
    scenario = load_scenario(str(Path(__file__).resolve().parent.parent / "scenarios" / "llama3_405b_4d_h100.yaml"))
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    assert context_degrees(workload, 8, 8, scenario.strategy.cp_degree) == (1, 2)
    assert context_degrees(workload, 8, 8, 8) == (1, 2, 4, 8)
    assert context_degrees(workload, 2, 8, 2) == (1, 2, 4)  # 2 x 4 inside a node; 2 x 8 across, over 2
    assert context_degrees(workload, 3, 8, 4) == (1,)  # 6, 12 ranks: neither part of a node nor whole nodes


def test_a_cp_scenario_on_another_gpu_count_leaves_its_cp_degree_to_the_candidates():
    scenario = load_scenario(str(Path(__file__).resolve().parent.parent / "scenarios" / "llama3_405b_4d_h100.yaml"))
    assert scenario.strategy.cp_degree == 2
    moved = scenario_for_gpus(scenario, 512)  # its ZeRO-1 keeps kind megatron, at t = p = c = 1
    assert (moved.num_gpus, moved.strategy.kind, moved.strategy.cp_degree) == (512, "megatron", 1)
