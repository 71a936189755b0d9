"""Expert parallelism in the megatron kind: the all-to-all's closed form and flow phase, the plan's
all-to-alls and expert-gradient groups, memory per rank, and the errors for bad degrees."""

from __future__ import annotations

from collections import Counter

import pytest

from simulator import load_scenario, simulate
from simulator.collective_forms import alltoall_time_s
from simulator.collectives import alltoall_phases, collective_phases
from simulator.errors import ScenarioError
from simulator.fabrics import build_topology
from simulator.kernels import layer_kernels
from simulator.plan import OPTIMIZER, Collective
from simulator.strategies.experts import shard_moe_layer
from simulator.zoo import build_model

MODEL = {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "seq_len": 64, "vocab_size": 1000,
         "num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 128}
EXPERT_PARAMS = 3 * 256 * 128 * 8  # per MoE layer: gate, up, down of 8 experts


def scenario(ep=4, tp=1, model="moe", params=None, gpus=8, kind="megatron", **strategy):
    megatron = {"tp_degree": tp, "ep_degree": ep} if kind == "megatron" else {"ep_degree": ep}
    return load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": gpus, "gpu": "H100-SXM", "intra_node_link": "nvlink4-h100"},
        "model": {"name": model, "params": MODEL if params is None else params},
        "strategy": {"kind": kind, "bucket_size_bytes": "1 GiB", **megatron, **strategy},
        "training": {"global_batch_size": 8, "dtype": "bf16", "optimizer": "adam"}})


def test_alltoall_closed_form():
    size, latency, bandwidth = 8e6, 5e-6, 1e11
    assert alltoall_time_s(size, 1, latency, bandwidth) == 0.0
    assert alltoall_time_s(size, 8, latency, bandwidth) == pytest.approx(latency + 7 / 8 * size / bandwidth)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_alltoall_is_one_phase_of_every_pair_each_link_carrying_p_minus_1_blocks(ranks):
    topology = build_topology(scenario().cluster)
    size = 64e6
    (phase,) = alltoall_phases(topology, tuple(range(ranks)), size)
    assert phase.bytes_per_subflow == pytest.approx(size / ranks)
    assert max(count for _, count in phase.usage) == ranks - 1  # each GPU's NVLink up and down
    assert dict(phase.tier_bytes)["intra"] == pytest.approx((ranks - 1) * size)  # (p-1)/p x S sent per rank
    assert phase.nccl == "p2p/Simple" and phase.latency_s > 0
    bandwidth = min(topology.links[link].bandwidth_bytes_per_s for link, _ in phase.usage)
    alone_s = phase.latency_s + phase.bytes_per_subflow * (ranks - 1) / bandwidth
    assert alone_s == pytest.approx(alltoall_time_s(size, ranks, phase.latency_s, bandwidth))
    assert alltoall_phases(topology, (3,), size) == ()
    (repeated,) = collective_phases(topology, (tuple(range(ranks)),), "alltoall", size, repeat=4)
    assert repeated.bytes_per_subflow == pytest.approx(4 * size / ranks)


def test_plan_dispatches_and_combines_over_the_ep_group_and_reduces_expert_gradients_over_d_over_e():
    result = simulate(scenario(ep=4, symmetry="off"))  # every rank's plan (a fold: tests/test_symmetry.py)
    plan, bytes_per_rank = result.plan, 2 * 64 * 256 * 2  # top-2 copies x s x h x bf16, micro-batch 1
    for rank in (0, 5):
        collectives = [a for a in plan.actions[rank] if isinstance(a, Collective)]
        alltoalls = [a for a in collectives if a.op == "alltoall"]
        group = (0, 1, 2, 3) if rank < 4 else (4, 5, 6, 7)
        assert [(a.ranks, a.repeat, a.size_bytes) for a in alltoalls] == [(group, 4, bytes_per_rank)] * 2  # F, B
        reduced = Counter()
        for action in collectives:
            if action.op == "allreduce":
                reduced[action.ranks] += action.size_bytes
        shard = plan.meta["rank_workload"]
        experts = 2 * EXPERT_PARAMS / 4 * 4  # 2 MoE layers, 1/e of the experts, fp32 gradients under bf16
        assert reduced[(rank % 4, rank % 4 + 4)] == pytest.approx(experts)  # the d / e = 2 copies
        assert reduced[tuple(range(8))] == pytest.approx(shard.num_params * 4 - experts)
    spans = result.spans
    first = spans[(spans["rank"] == 0) & (spans["kind"] == "alltoall")].sort_values("start_s").iloc[0]
    (phase,) = collective_phases(build_topology(result.scenario.cluster), ((0, 1, 2, 3),), "alltoall",
                                 bytes_per_rank, repeat=4)
    bandwidth = build_topology(result.scenario.cluster).links[phase.usage[0][0]].bandwidth_bytes_per_s
    assert first["duration_s"] == pytest.approx(4 * alltoall_time_s(bytes_per_rank, 4, phase.latency_s / 4, bandwidth))
    assert result.summary["collective_algorithms"]["pairwise/Simple"] == 2 * 8 // 4  # F and B of 2 groups


def test_expert_weights_per_rank_are_over_e():
    plain, expert = simulate(scenario(ep=1)), simulate(scenario(ep=8))
    full = build_model("moe", **MODEL).num_params
    assert plain.plan.meta["rank_workload"].num_params == full
    assert expert.plan.meta["rank_workload"].num_params == full - 2 * EXPERT_PARAMS * 7 / 8
    weights = [run.summary["devices"][0]["memory_breakdown_bytes"]["weights"] for run in (plain, expert)]
    assert weights[0] - weights[1] == pytest.approx(2 * EXPERT_PARAMS * 7 / 8 * 2)  # bf16
    assert expert.summary["tensor"]["ep_degree"] == 8


def test_tensor_and_expert_parallel_send_the_sequence_shard():
    plan = simulate(scenario(ep=4, tp=2, sequence_parallel=True, symmetry="off")).plan
    (alltoall, *_) = [a for a in plan.actions[0] if isinstance(a, Collective) and a.op == "alltoall"]
    assert alltoall.size_bytes == 2 * 2 * 64 / 2 * 256 * 2  # micro-batch 2 (d = 4) x top-2 x s / t x h x bf16
    assert alltoall.ranks == (0, 2, 4, 6)  # tp fastest: TP rank 0 of replicas 0..3
    forward = [a for a in plan.actions[0] if isinstance(a, Collective)][:5]
    dense_bytes = 2 * 64 / 2 * 256 * 2  # the block's SP allgather: b (s / t) h x bf16 per rank
    assert [(a.op, a.ranks, a.repeat) for a in forward] == [
        ("alltoall", (0, 2, 4, 6), 4), ("allgather", (0, 1), 2), ("reduce_scatter", (0, 1), 2),
        ("allgather", (0, 1), 5), ("reduce_scatter", (0, 1), 5)]  # 2 per block, the head's and the embedding's
    # the routed tokens' allgather / reduce-scatter over TP: (k - 1) x the dense bytes on top of them
    assert forward[1].size_bytes == pytest.approx((2 - 1) * dense_bytes)
    assert forward[2].size_bytes == pytest.approx((2 - 1) * dense_bytes * 2)
    assert forward[3].size_bytes == pytest.approx(dense_bytes)


@pytest.mark.parametrize("change,message", [
    ({"ep": 3}, "strategy.ep_degree: 3 does not divide the 8 data-parallel replicas"),
    ({"ep": 4, "params": {**MODEL, "num_experts": 6}}, "strategy.ep_degree: 4 does not divide the 6 experts"),
    ({"ep": 2, "model": "llama", "params": {"num_layers": 1, "hidden_size": 64, "num_heads": 4, "seq_len": 16}},
     "strategy.ep_degree: 2 needs a mixture-of-experts model"),
    ({"ep": 2, "tp": 2}, "strategy.sequence_parallel: false with tp_degree 2 and ep_degree 2"),
    ({"ep": 2, "zero_stage": 2}, "strategy.zero_stage: 2 with ep_degree 2"),
    ({"ep": 2, "zero_stage": 3}, "strategy.zero_stage: 3 with ep_degree 2"),
])
def test_bad_expert_parallel_settings_name_the_field_and_value(change, message):
    with pytest.raises(ScenarioError) as error:
        simulate(scenario(**change))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_ep_degree_outside_megatron_is_refused_when_loading():
    with pytest.raises((ScenarioError, ValueError), match="strategy.ep_degree: 2 applies to kind megatron only"):
        scenario(ep=2, kind="dp")


@pytest.mark.parametrize("tp,sequence_parallel,ep", [(1, False, 4), (2, True, 4), (4, True, 8)])
def test_rank_share_of_an_moe_block_matches_its_kernels(tp, sequence_parallel, ep):
    block = build_model("deepseek-moe-16b", seq_len=1024, num_layers=3).layers[2]
    share = shard_moe_layer(block, tp, sequence_parallel, ep)
    h, num_experts = 2048, 64
    experts = 3 * h * 1408 * num_experts
    replicated = 2 * h + h * num_experts  # two RMSNorm weights and the router, whole on every TP rank
    assert share.num_params == pytest.approx((block.num_params - experts - replicated) / tp + replicated
                                             + experts / (tp * ep))
    kernels = layer_kernels(share, "F", 1, dtype="bf16", tp_degree=tp, sequence_parallel=sequence_parallel)
    assert sum(kernel.flops for kernel in kernels) == pytest.approx(share.forward_flops_per_sample, rel=1e-12)


def test_zero1_with_ep_shards_expert_gradients_over_d_over_e_and_the_rest_over_d():
    """Megatron-Core's distributed optimizer with EP: expert gradients reduce-scattered and their
    updated shards allgathered among the d / e = 2 copies of the experts, the rest among all d = 8;
    the update runs on X / (d / e) + (P - X) / d parameters."""
    result = simulate(scenario(ep=4, zero_stage=1, symmetry="off"))
    plan, shard = result.plan, result.plan.meta["rank_workload"]
    experts = 2 * EXPERT_PARAMS / 4  # the rank's expert weights: 2 MoE layers, 1/e of the experts
    for rank in (0, 5):
        moved = Counter()
        for action in plan.actions[rank]:
            if isinstance(action, Collective) and action.op != "alltoall":
                moved[action.op, action.ranks] += action.size_bytes
        copies = (rank % 4, rank % 4 + 4)
        assert set(moved) == {("reduce_scatter", copies), ("reduce_scatter", tuple(range(8))),
                              ("allgather", copies), ("allgather", tuple(range(8)))}
        assert moved["reduce_scatter", copies] == pytest.approx(experts * 4)  # fp32 gradients under bf16
        assert moved["reduce_scatter", tuple(range(8))] == pytest.approx((shard.num_params - experts) * 4)
        assert moved["allgather", copies] == pytest.approx(experts * 2 / 2)  # each copy's 1/2 shard
        assert moved["allgather", tuple(range(8))] == pytest.approx((shard.num_params - experts) * 2 / 8)
        (update,) = [a for a in plan.actions[rank] if getattr(a, "phase", None) == OPTIMIZER]
        assert update.num_params == pytest.approx(experts / 2 + (shard.num_params - experts) / 8)


def test_zero1_with_ep_memory_shards_expert_states_over_d_over_e():
    """fp32 master weights and Adam's two moments: 12 bytes a parameter, over d / e for the rank's
    expert weights X and over d for the rest."""
    plain, sharded = simulate(scenario(ep=4)), simulate(scenario(ep=4, zero_stage=1))
    params = plain.plan.meta["rank_workload"].num_params
    experts = 2 * EXPERT_PARAMS / 4
    states = [run.summary["devices"][0]["memory_breakdown_bytes"] for run in (plain, sharded)]
    assert states[0]["master_weights"] + states[0]["optimizer_state"] == pytest.approx(12 * params)
    assert states[1]["master_weights"] + states[1]["optimizer_state"] == pytest.approx(
        12 * (experts / 2 + (params - experts) / 8))
    saved = 12 * (params - experts / 2 - (params - experts) / 8)
    assert sharded.summary["devices"][0]["peak_memory_bytes"] == pytest.approx(
        plain.summary["devices"][0]["peak_memory_bytes"] - saved, rel=1e-9)
