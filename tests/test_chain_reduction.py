"""A megatron chain's stage partition weighs each stage's data-parallel reduction
(`simulator.strategies.chain_reduction`): the rings it builds, and the split it leads to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.model_source import resolve_workload
from simulator.strategies.chain_reduction import chain_reduction
from simulator.strategies.experts import expert_params, is_moe

GPT2 = Path(__file__).resolve().parents[1] / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"


def megatron_order(t: int, p: int):
    return lambda dp, pp, tp: (dp * p + pp) * t + tp


def test_each_stage_has_a_ring_per_tp_rank_over_its_copies():
    reduction = chain_reduction(megatron_order(2, 2), 2, 2, 3, dtype="bf16", zero_stage=0,
                                zero1_gradient_reduce="reduce_scatter", collective="auto")
    assert reduction.rings == (((0, 4, 8), (1, 5, 9)), ((2, 6, 10), (3, 7, 11)))
    assert (reduction.reduce_op, reduction.gradient_element_bytes, reduction.gathered_element_bytes) == \
        ("allreduce", 4, 0)  # Megatron's fp32 gradient buffer under bf16, no gather without ZeRO
    zero1 = chain_reduction(megatron_order(2, 2), 2, 2, 3, dtype="bf16", zero_stage=1,
                            zero1_gradient_reduce="reduce_scatter", collective="auto")
    assert (zero1.reduce_op, zero1.gathered_element_bytes) == ("reduce_scatter", 2)
    assert zero1.reduces and zero1.tp_chains(4) == (0, 2, 0, 2, 1, 3, 1, 3)  # replica 0's TP ranks 0 and 1
    single = chain_reduction(megatron_order(2, 2), 2, 2, 1, dtype="bf16", zero_stage=0,
                             zero1_gradient_reduce="reduce_scatter", collective="auto")
    assert not single.reduces and single.tp_chains(2) == (0, 2, 1, 3)  # nothing to reduce, chains to send on
    assert chain_reduction(megatron_order(2, 2), 2, 2, 4, dtype="bf16", zero_stage=3,  # gathered per layer
                           zero1_gradient_reduce="reduce_scatter", collective="auto") is None


def _plays(monkeypatch):
    """The schedule's play of each partition compiled (`stage_partition._played_step`), and each chain's update."""
    import simulator.strategies.chain_reduction as chain
    import simulator.strategies.stage_partition as stage_partition
    plays, updates = [], []
    played, update = stage_partition._played_step, chain.chain_update
    monkeypatch.setattr(stage_partition, "_played_step", lambda *args: plays.append(played(*args)) or plays[-1])
    monkeypatch.setattr(chain, "chain_update", lambda *args: updates.append(update(*args)) or updates[-1])
    return plays, updates


def _ranges(split):
    bounds = np.cumsum([0, *split])
    return tuple(zip(bounds[:-1], bounds[1:]))


def test_a_slow_network_keeps_the_stage_closing_last_light(monkeypatch):
    """GPT-2 1.5B, TP 4 x PP 4 x DP 2 over 10 GbE, one micro-batch: the first stage's backward ends
    last, so its allreduce has nothing left to hide behind. The split of compute and transfers
    alone, [1, 9, 26, 14], closes late (0.72 s); weighing the reduction finds about [10, 12, 13,
    15] (0.41 s). The play that ranks the splits is within 3 % of the simulated step."""
    plays, _ = _plays(monkeypatch)
    layout = ["strategy.tp_degree=4", "strategy.pp_degree=4", "strategy.num_microbatches=1",
              "training.global_batch_size=4", "cluster.inter_node_link=10gbe"]
    balanced = simulate(load_scenario(GPT2, layout))
    steps = {}
    for split in ([10, 12, 13, 15], [1, 9, 26, 14], [13, 12, 12, 13]):
        steps[str(split)] = step = simulate(load_scenario(GPT2, [*layout, f"strategy.partition={split}"])).step_time_s
        assert plays[0](_ranges(split)) == pytest.approx(step, rel=0.03), split
    assert balanced.step_time_s <= 1.02 * steps["[10, 12, 13, 15]"]
    assert steps["[1, 9, 26, 14]"] > 1.5 * balanced.step_time_s


@pytest.mark.parametrize("nics,shared_by", [(1, 8.0), (8, 1.0)])
def test_rings_crossing_one_nic_share_it_while_they_overlap(monkeypatch, nics, shared_by):
    """PP 8 x DP 2 over 10 GbE, a replica to a node: with one NIC a node, the eight stage rings
    cross it (one class, each priced x 8 by the closed form and shared only while they overlap by
    the play); with a NIC a GPU (the DGX fat tree), no two rings share a link."""
    plays, updates = _plays(monkeypatch)
    layout = ["strategy.tp_degree=1", "strategy.pp_degree=8", "strategy.num_microbatches=4",
              "training.global_batch_size=16", "cluster.inter_node_link=10gbe", f"cluster.nics_per_node={nics}"]
    simulate(load_scenario(GPT2, layout))
    update, classes = updates[0]
    assert list(update.shared_by) == [shared_by] * 8
    assert classes == ([0] * 8 if nics == 1 else [-1] * 8)
    for split in ([5, 6, 6, 6, 6, 7, 7, 7], [7, 7, 7, 6, 6, 7, 6, 4]):
        step = simulate(load_scenario(GPT2, [*layout, f"strategy.partition={split}"])).step_time_s
        assert plays[0](_ranges(split)) == pytest.approx(step, rel=0.02), split


def test_each_tp_rank_sends_its_slice_of_a_boundary():
    """Megatron's scatter-gather: each of the t TP ranks sends 1 / t of a stage's output on its own
    route. GPT-2 1.5B, TP 8 x PP 4 x 2 chunks over 10 GbE (a NIC a GPU): priced as one route
    carrying the whole boundary, the transfers weighed 8x and the split was [9, 5, 5, 7, 6, 3, 7, 8],
    0.40 s, 14 % slower than the best found (0.35 s, the uniform split within 1 % of it)."""
    layout = ["strategy.tp_degree=8", "strategy.pp_degree=4", "strategy.num_virtual_stages=2",
              "strategy.num_microbatches=8", "training.global_batch_size=16", "cluster.inter_node_link=10gbe"]
    balanced = simulate(load_scenario(GPT2, layout))
    for split in ([7, 6, 6, 6, 6, 6, 6, 7], [7, 7, 6, 5, 6, 6, 6, 7], [9, 5, 5, 7, 6, 3, 7, 8]):
        step = simulate(load_scenario(GPT2, [*layout, f"strategy.partition={split}"])).step_time_s
        assert balanced.step_time_s <= step * 1.001, split


def test_expert_gradients_reduce_among_the_copies_of_each_expert(monkeypatch):
    """Mixtral 8x7B, EP 8 x PP 4: with d = 16 copies each expert weight's gradient is reduced among
    the 2 copies of its expert, priced apart from the dense weights' ring of 16 (and a range without
    MoE layers pays no expert latency); with d = e = 8 each expert has one copy: nothing to reduce."""
    _, updates = _plays(monkeypatch)
    mixtral = Path(__file__).resolve().parents[1] / "scenarios" / "mixtral_8x7b_ep_h100.yaml"
    simulate(load_scenario(mixtral))
    update = updates[-1][0]  # (the update, the ring classes)
    scenario = load_scenario(mixtral)
    layers = resolve_workload(scenario.model, scenario.base_dir).layers
    moe = next(i for i, layer in enumerate(layers) if is_moe(layer))
    experts = expert_params(layers[moe].spec) / 8 * 4  # one rank's eighth, fp32 gradients under bf16
    assert update.expert_bytes[moe] == pytest.approx(experts) and update.expert_bytes[0] == 0.0
    assert update.gradient_bytes[moe] > 0 and update.expert_per_byte_s[0] > 0
    head = np.array([len(layers) - 1])
    with_experts, without = (update.closing_s(0, np.array([start]), head) for start in (moe, len(layers) - 1))
    assert with_experts[0] > without[0]
    updates.clear()
    simulate(load_scenario(mixtral, ["cluster.num_nodes=4", "training.global_batch_size=128",
                                     "strategy.placement=group_per_node"]))
    assert updates[-1][0].expert_bytes is None  # d = e: each expert's gradient stays where it is
    assert updates[-1][0].gradient_bytes[moe] < update.gradient_bytes[moe] + update.expert_bytes[moe]
