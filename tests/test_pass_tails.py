"""What a megatron pass plays after its compute, as its stage partition weighs it
(`strategies.pass_tails`, `stage_costs.HostIssue`), and a measured collective run `repeat` times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.model_source import resolve_workload
from simulator.plan import Collective, Plan, Stage
from simulator.stage_costs import HostIssue
from simulator.strategies.pass_tails import chain_tails_s, layer_tails_s
from simulator.strategies.tensor_layers import pass_collectives
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_plan

GPT2 = Path(__file__).resolve().parents[1] / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"


@pytest.fixture
def plays(monkeypatch) -> list:
    """The schedule's play of each flushed partition compiled (`stage_partition._played_step`)."""
    import simulator.strategies.stage_partition as stage_partition
    found: list = []
    original = stage_partition._played_step
    monkeypatch.setattr(stage_partition, "_played_step", lambda *args: found.append(original(*args)) or found[-1])
    return found


def test_a_pass_adds_what_follows_its_compute_after_the_larger_of_device_and_host():
    """Device 1 + 1, host 2 + 2 and 0.5 + 0.5 after each layer: max(2, 4) + 1 = 5 forward; device_s, the
    closed form's additive part, counts the tails, and the host's excess is still over the compute alone."""
    device, host, after = np.array([1.0, 1.0]), np.array([2.0, 2.0]), np.array([0.5, 0.5])
    issue = HostIssue(device, host, 2 * device, 2 * host, after, 2 * after)
    assert issue.pass_s(0, 0, 2) == (5.0, 10.0)
    assert issue.device_s == pytest.approx([1 + 2 + 0.5 + 1] * 2)
    assert issue.excess_s(0, np.array([0]), np.array([1])) == pytest.approx([2.0 + 4.0])
    assert HostIssue(device, host, 2 * device, 2 * host).pass_s(0, 0, 2) == (4.0, 8.0)  # no tails: as before


def _gpt2():
    scenario = load_scenario(GPT2)
    return resolve_workload(scenario.model, scenario.base_dir)


def test_each_layer_pays_its_own_tp_collectives_and_a_recomputed_layer_its_forward_ones_again():
    workload = _gpt2()
    priced = []

    def collective_s(op, size_bytes, repeat):
        priced.append((op, size_bytes, repeat))
        return repeat * (1e-5 + size_bytes / 1e11)

    forward, backward = layer_tails_s(workload, False, 4, 2, 8, collective_s)
    block = next(i for i, layer in enumerate(workload.layers) if layer.kind == "attention")
    ((op, repeat, elements),) = pass_collectives(workload, block, block + 1, "F", False)
    assert (op, repeat) == ("allreduce", 2)  # Megatron's g after attention and after the MLP
    assert forward[block] == pytest.approx(collective_s(op, elements * 4 * 2, repeat))
    topology = Topology(1, 8, link(1e-6, 200e9), link(5e-6, 25e9))
    common = dict(sequence_parallel=False, microbatch_size=4, element_bytes=2)
    plain = chain_tails_s(workload, topology, None, [tuple(range(8))], recompute="none", **common)
    full = chain_tails_s(workload, topology, None, [tuple(range(8))], recompute="full", **common)
    assert not plain.recomputed.any() and full.recomputed.all()
    assert full.backward_s == pytest.approx(plain.backward_s + plain.forward_s)
    sequence_parallel, _ = layer_tails_s(workload, True, 4, 2, 8, collective_s)
    assert sequence_parallel[block] > 0 and ("allgather", elements * 4 * 2 / 8, 2) in priced  # 1 / t per rank


def test_chains_without_tp_or_recompute_have_no_tails_and_alike_groups_share_theirs():
    workload = _gpt2()
    topology = Topology(2, 8, link(1e-6, 200e9), link(5e-6, 25e9))
    common = dict(sequence_parallel=False, microbatch_size=4, element_bytes=2)
    assert chain_tails_s(workload, topology, None, [(0,), (1,)], recompute="none", **common) is None
    memo = {}
    by_node = lambda group: tuple(device % 8 for device in group)  # noqa: E731 (groups alike on each node)
    tails = chain_tails_s(workload, topology, None, [(0, 1), (8, 9)], recompute="none", memo=memo,
                          signature=by_node, **common)
    assert tails.forward_s.shape == (workload.num_layers,) and tails.forward_s.max() > 0
    assert chain_tails_s(workload, topology, None, [(0, 1), (8, 9)], recompute="none", memo=memo,
                         signature=by_node, **common) is tails
    split = chain_tails_s(workload, topology, None, [(0, 1), (7, 8)], recompute="none", **common)
    assert split.forward_s.shape == (2, workload.num_layers)  # a group across the nodes times slower
    assert (split.forward_s[1] > split.forward_s[0]).any()


def test_the_megatron_partition_plays_its_tp_collectives(plays):
    """GPT-2 1.5B at TP 8 x PP 4, 4 micro-batches of 2 over HDR InfiniBand: without the TP collectives
    the play read the even and the searched-best splits 16 % under their simulated steps and a
    lopsided one 12 % under; with them within 3 % and 8 % (each collective as the engine times it),
    and it ranks the splits as the simulation does."""
    layout = ["strategy.tp_degree=8", "strategy.pp_degree=4", "strategy.num_microbatches=4",
              "training.global_batch_size=8"]
    simulate(load_scenario(GPT2, [*layout, "strategy.partition=balanced"]))
    steps, played = [], []
    for split, within in (([13, 12, 12, 13], 0.03), ([16, 11, 11, 12], 0.03), ([2, 22, 1, 25], 0.08)):
        bounds = np.cumsum([0, *split])
        explicit = f"strategy.partition=[{','.join(map(str, split))}]"
        steps.append(simulate(load_scenario(GPT2, [*layout, explicit])).step_time_s)
        played.append(plays[0](tuple(zip(bounds[:-1], bounds[1:]))))
        assert played[-1] == pytest.approx(steps[-1], rel=within), split
    assert np.argsort(played).tolist() == np.argsort(steps).tolist()


class _MeasuredCosts(FixedCosts):
    """Communication as a calibration profile prices it: 1 ms a collective, whatever its size."""

    def __init__(self):
        super().__init__()
        self.communication = self
        self.message_overheads_s = (0.0, 0.0)

    def collective_s(self, op: str, size_bytes: float, num_ranks: int) -> float:
        return 1e-3


def test_a_measured_collective_run_three_times_takes_three_times_its_fit():
    ranks = (0, 1)
    actions = tuple((Collective(0, "allreduce", ranks, 1e6, ("tp",), repeat=3),) for _ in ranks)
    plan = Plan("test", 2, 1, (Stage(0, 0, 1, 0),), ranks, actions, 1.0)
    spans = run_plan(plan, Topology(1, 2, link(1e-6, 1e10), link(1e-6, 1e9)), _MeasuredCosts())
    assert spans["end_s"].max() == pytest.approx(3e-3)


def test_a_recompute_that_waits_for_no_gradient_runs_while_its_rank_waits():
    """1F1B, two stages, one micro-batch, passes 1 + 2 s each: stage 0 recomputes 3 s before its
    backward. Its gradient arrives at 4 s, by when the recompute (from 1 s) is done: the backward
    ends at 6 s, not 4 + 3 + 2 = 9 s as it would with the recompute after the gradient."""
    from simulator.schedules import build_schedule
    from simulator.schedules.makespan import pass_ends_s
    schedule = build_schedule("1f1b", 2, 1)
    assert pass_ends_s(schedule, [1, 1], [2, 2], [0, 0], [0, 0], [3, 0])[0] == pytest.approx([6.0, 4.0])
    assert pass_ends_s(schedule, [1, 1], [5, 2], [0, 0], [0, 0])[0] == pytest.approx([9.0, 4.0])
    issue = HostIssue(*(np.ones(2),) * 4, redo_device_s=np.array([3.0, 0.0]), redo_host_s=np.array([1.0, 2.0]))
    assert issue.redo_s(0, 0, 2) == 3.0 and issue.pass_s(0, 0, 2) == (2.0, 2.0)
    assert issue.device_s == pytest.approx([5.0, 2.0]) and issue.excess_s(0, np.array([1]), np.array([1])) == [2.0]


def test_a_layer_table_pipeline_partition_plays_the_recomputed_forward(plays):
    """GPipe re-materialises each stage's forward before its backward (`training.recompute: full`), as
    soon as the rank is free; the engine plays it, and so does the partition's play: VGG16 in 4 stages
    of 4 replicas, 8 micro-batches, within 5 % of the simulated step for splits near the best (13-23 %
    under without it)."""
    demo = Path(__file__).resolve().parents[1] / "scenarios" / "demo.yaml"
    layout = ["strategy.kind=gpipe", "strategy.num_groups=4", "strategy.num_microbatches=8",
              "training.global_batch_size=128", "training.recompute=full"]
    simulate(load_scenario(demo, layout))
    for split in ([7, 7, 1, 1], [13, 1, 1, 1], [10, 4, 1, 1]):
        bounds = np.cumsum([0, *split])
        step = simulate(load_scenario(demo, [*layout, f"strategy.partition=[{','.join(map(str, split))}]"])).step_time_s
        assert plays[0](tuple(zip(bounds[:-1], bounds[1:]))) == pytest.approx(step, rel=0.05), split


def test_a_moe_pipeline_partition_plays_its_all_to_alls(plays):
    """Mixtral 8x7B, EP 8 x PP 4 on 64 H100: each MoE layer's dispatch and combine all-to-alls follow
    its pass, as the TP collectives do. Without them the play read each split 6.5 % under its
    simulated step; with them within 4 %."""
    mixtral = Path(__file__).resolve().parents[1] / "scenarios" / "mixtral_8x7b_ep_h100.yaml"
    simulate(load_scenario(mixtral))
    for split in ([9, 8, 8, 9], [7, 9, 9, 9]):
        bounds = np.cumsum([0, *split])
        step = simulate(load_scenario(mixtral, [f"strategy.partition=[{','.join(map(str, split))}]"])).step_time_s
        assert plays[0](tuple(zip(bounds[:-1], bounds[1:]))) == pytest.approx(step, rel=0.04), split


def test_an_moe_layer_pays_its_all_to_alls_and_with_tp_the_routed_tokens_gather():
    from simulator.strategies.pass_tails import expert_layer_s
    mixtral = Path(__file__).resolve().parents[1] / "scenarios" / "mixtral_8x7b_ep_h100.yaml"
    scenario = load_scenario(mixtral)
    spec = next(layer.spec for layer in resolve_workload(scenario.model, scenario.base_dir).layers
                if layer.spec.get("num_experts"))
    priced = []

    def tp_collective_s(op, size_bytes):
        priced.append((op, size_bytes))
        return 1.0

    assert expert_layer_s(spec, 1, False, 2, 2, lambda size: size / 1e9, tp_collective_s) > 0 and not priced
    alone = expert_layer_s(spec, 2, True, 2, 2, lambda size: 0.0, tp_collective_s)
    (gather, gathered), (scatter, scattered) = priced
    assert (gather, scatter, alone) == ("allgather", "reduce_scatter", 2.0) and scattered == 2 * gathered
