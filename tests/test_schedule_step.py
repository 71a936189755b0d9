"""The step a schedule plays with given chunk costs (`schedules.makespan`), and the flushed
partition ranking its candidate splits by it (`partition.flushed_partition`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.partition import flushed_partition
from simulator.scenario import read_yaml
from simulator.schedules import build_schedule, unit_time_run
from simulator.schedules.makespan import schedule_step_s

VGG_PIPELINE = Path(__file__).resolve().parents[1] / "scenarios" / "pipeline_vgg16_1f1b_pcie.yaml"


@pytest.mark.parametrize("kind,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 2, 1),
                                        ("interleaved_1f1b", 4, 8, 2), ("interleaved_1f1b", 2, 4, 3)])
def test_equal_chunks_without_transfers_play_as_the_unit_time_run(kind, p, m, v):
    schedule = build_schedule(kind, p, m, v)
    chunks = p * v
    played = schedule_step_s(schedule, [0.5] * chunks, [1.5] * chunks, [0.0] * chunks, [0.0] * chunks, [0.0] * p)
    assert played == pytest.approx(unit_time_run(schedule, 0.5, 1.5).makespan, rel=1e-12)


def test_one_microbatch_through_two_stages_by_hand():
    # F0 (1) -> send 0.25 -> F1 (2), B1 (3) -> send 0.5 -> B0 (4), then rank 0's update 0.125:
    # 1 + 0.25 + 2 + 3 + 0.5 + 4 + 0.125; rank 1 ends at 1 + 0.25 + 2 + 3 + 7 (its update).
    schedule = build_schedule("1f1b", 2, 1)
    step = schedule_step_s(schedule, [1.0, 2.0], [4.0, 3.0], [0.25, 0.0], [0.0, 0.5], [0.125, 7.0])
    assert step == pytest.approx(max(1 + 0.25 + 2 + 3 + 0.5 + 4 + 0.125, 1 + 0.25 + 2 + 3 + 7), rel=1e-15)


def test_where_the_heavy_stage_sits_changes_the_step():
    # 1F1B, 3 stages, m = 4, one stage 2 + 4 s a micro-batch and two 1 + 2 s: the closed form
    # (sum + (m - 1) x slowest = 12 + 18) gives 30 s wherever the heavy stage sits. Played: heavy
    # last, its 24 busy seconds come after the fill (1 + 1) and before the drain (2 + 2): 30 s.
    # Heavy first, it runs F0-F2 (0-6 s), waits for B0 until 8 s (F 2 + 1 + 1, B 2 + 2), then
    # never waits again: B0, F3, B1, B2, B3 take 4 + 2 + 4 + 4 + 4 = 18 s more, 26 s.
    schedule = build_schedule("1f1b", 3, 4)
    zeros = [0.0] * 3
    assert schedule_step_s(schedule, [2.0, 1.0, 1.0], [4.0, 2.0, 2.0], zeros, zeros, zeros) == pytest.approx(26.0)
    assert schedule_step_s(schedule, [1.0, 1.0, 2.0], [2.0, 2.0, 4.0], zeros, zeros, zeros) == pytest.approx(30.0)
    gpipe = build_schedule("gpipe", 3, 4)  # all forwards first: the heavy stage paces both sweeps alike
    assert schedule_step_s(gpipe, [2.0, 1.0, 1.0], [4.0, 2.0, 2.0], zeros, zeros, zeros) == pytest.approx(30.0)


def test_the_partition_takes_the_candidate_that_plays_fastest():
    rng = np.random.default_rng(3)
    compute = rng.uniform(0.5, 2.0, 12)
    zeros = np.zeros((4, 12))
    closed = flushed_partition(compute, zeros, zeros, 4, None, 4)
    seen = []

    def played_s(ranges):
        seen.append(ranges)
        return -float(len(seen))  # the last candidate asked about "plays" fastest
    chosen = flushed_partition(compute, zeros, zeros, 4, None, 4, played_s=played_s)
    if len(seen) > 1:
        assert chosen == seen[-1]
    else:
        assert chosen == closed


def _pipeline(**strategy):
    raw = read_yaml(VGG_PIPELINE)
    raw["strategy"].update(strategy)
    return raw


@pytest.mark.parametrize("strategy,closed_form_pick", [
    ({"kind": "1f1b", "num_microbatches": 8}, [4, 3, 3, 6]),
    ({"kind": "1f1b", "num_microbatches": 4}, [4, 3, 3, 6]),
    ({"kind": "interleaved_1f1b", "num_virtual_stages": 2, "num_microbatches": 8}, [2, 2, 2, 1, 2, 1, 5, 1]),
])
def test_the_balanced_split_plays_no_slower_than_the_closed_forms_pick(strategy, closed_form_pick):
    balanced = simulate(load_scenario(_pipeline(**strategy)))
    closed = simulate(load_scenario(_pipeline(**strategy, partition=closed_form_pick)))
    assert balanced.step_time_s <= closed.step_time_s * (1 + 1e-12)
    assert balanced.summary["partition"] != closed_form_pick  # each of these plays strictly faster
    assert balanced.step_time_s < closed.step_time_s * (1 - 0.015)


@pytest.mark.parametrize("device", [0, 1, 2, 3])
def test_a_negligible_straggler_keeps_the_split(device):
    strategy = {"kind": "interleaved_1f1b", "num_virtual_stages": 2, "num_microbatches": 8}
    healthy = simulate(load_scenario(_pipeline(**strategy)))
    raw = _pipeline(**strategy)
    raw["cluster"]["stragglers"] = {device: 1.000001}
    slowed = simulate(load_scenario(raw))
    assert slowed.summary["partition"] == healthy.summary["partition"]
    assert slowed.step_time_s == pytest.approx(healthy.step_time_s, rel=1e-5)


def test_the_balanced_split_is_the_best_of_every_split():
    # VGG16 (16 layers) in 4 stages, 1F1B, m = 4, over PCIe 3: all C(15, 3) = 455 splits simulated.
    from itertools import combinations

    from simulator.model_source import resolve_workload
    raw = _pipeline(kind="1f1b", num_microbatches=4)
    workload = resolve_workload(load_scenario(raw).model)
    balanced = simulate(load_scenario(raw), workload=workload)
    best_s = min(simulate(load_scenario({**raw, "strategy": {**raw["strategy"], "partition": [
        b - a for a, b in zip((0, *cuts), (*cuts, workload.num_layers))]}}), workload=workload).step_time_s
        for cuts in combinations(range(1, workload.num_layers), 3))
    assert balanced.step_time_s == pytest.approx(best_s, rel=1e-12)


def test_a_heavier_first_stage_beats_the_even_split_with_few_microbatches():
    # 1F1B, p = 2, m = 2, 8 equal layers (forward 1/3, backward 2/3 of a layer's time). Split 4 | 4:
    # (m + p - 1) x 4 = 12. Split 5 | 3: stage 0 runs F0 F1 (0-10/3), waits for B0 until 14/3
    # (stage 1: F0 5/3-8/3, B0 8/3-14/3), B0 to 8, B1 (its gradient back at 23/3) to 8 + 10/3.
    schedule, zeros = build_schedule("1f1b", 2, 2), [0.0, 0.0]
    even = schedule_step_s(schedule, [4 / 3, 4 / 3], [8 / 3, 8 / 3], zeros, zeros, zeros)
    heavy_first = schedule_step_s(schedule, [5 / 3, 1.0], [10 / 3, 2.0], zeros, zeros, zeros)
    assert even == pytest.approx(12.0) and heavy_first == pytest.approx(8 + 10 / 3)


def test_a_pass_over_a_range_takes_the_larger_of_its_device_and_host_sums():
    """HostIssue: three host-bound layers (device 1, host 2) and a GPU-bound head (device 6, host 0.5)
    in one pass take max(3 + 6, 6 + 0.5) = 9 forward, not 2 + 2 + 2 + 6 = 12 (each layer's larger side)."""
    from simulator.stage_costs import HostIssue
    device, host = np.array([1.0, 1.0, 1.0, 6.0]), np.array([2.0, 2.0, 2.0, 0.5])
    issue = HostIssue(device, host, 2 * device, 2 * host)
    assert issue.pass_s(0, 0, 4) == (9.0, 18.0)
    assert issue.pass_s(0, 0, 3) == (6.0, 12.0)  # host-bound alone
    starts, ends = np.array([0, 0, 3]), np.array([3, 2, 3])
    assert issue.excess_s(0, starts, ends) == pytest.approx([0.0 + 0.0, 3.0 + 6.0, 0.0])  # host 6.5 < device 9
    rows = HostIssue(*(np.vstack([values, 2 * values]) for values in (device, host, device, host)))
    assert rows.pass_s(1, 0, 4) == (18.0, 18.0)  # row 1 of (M, L) arrays


def test_the_head_does_not_drive_blocks_off_its_stage_where_the_blocks_are_host_bound():
    """GPT-2 1.5B at TP 4 x PP 2, micro-batches of 4: each block's kernels are issued slower than they
    run, so the head's long GEMMs cost the last stage little; weighing each layer's larger side moved a
    block to the first stage ([26, 24]) and played 3 % slower than the even split."""
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"
    for layout in ([], ["strategy.pp_degree=4", "strategy.tp_degree=2"]):
        balanced = simulate(load_scenario(scenario, layout))
        uniform = simulate(load_scenario(scenario, [*layout, "strategy.partition=uniform"]))
        assert balanced.step_time_s <= uniform.step_time_s * (1 + 1e-12), (layout, balanced.summary["partition"])
    assert balanced.step_time_s < uniform.step_time_s * 0.95  # PP 4: the balanced split plays 6 % faster


def test_jobs_sharing_one_server_each_progress_at_an_equal_share():
    from simulator.strategies.stage_partition import processor_shared_finish_s
    assert processor_shared_finish_s([0.0, 0.0], [1.0, 3.0]) == pytest.approx([2.0, 4.0])  # 2 x 1, then 3 - 1 alone
    assert processor_shared_finish_s([0.0, 1.0], [2.0, 2.0]) == pytest.approx([3.0, 4.0])
    assert processor_shared_finish_s([0.0, 10.0], [1.0, 1.0]) == pytest.approx([1.0, 11.0])  # never together
    assert processor_shared_finish_s([0.0, 0.5, 0.5], [0.0, 1.0, 2.0]) == pytest.approx([0.0, 2.5, 3.5])


DEMO = Path(__file__).resolve().parents[1] / "scenarios" / "demo.yaml"
SHARED_RINGS = ["strategy.kind=gpipe", "strategy.num_groups=8", "strategy.num_microbatches=4",
                "training.global_batch_size=256", "cluster.inter_node_link=ib-hdr", "strategy.placement=group_per_node"]
"""VGG16 GPipe, 8 replicas of 2 stages, each replica on one node: both stage rings leave every node."""


def test_stage_rings_sharing_a_nic_are_played_as_they_overlap(monkeypatch):
    """The closed form prices each ring leaving a node as if every such ring ran beside it all along
    (x 2 here); the last stage holds VGG16's fully connected weights, the first a few convolutions'.
    The play shares the NIC only while the allreduces overlap: within 3 % of the simulated step for
    each split (pricing x 2 played [7, 9] 30 % slow and chose [11, 5], 20 % slower than uniform)."""
    import simulator.strategies.stage_partition as stage_partition
    plays = []
    original = stage_partition._played_step
    monkeypatch.setattr(stage_partition, "_played_step", lambda *args: plays.append(original(*args)) or plays[-1])
    balanced = simulate(load_scenario(DEMO, SHARED_RINGS))
    for first in (4, 7, 8, 11):
        ranges = ((0, first), (first, 16))
        split = simulate(load_scenario(DEMO, [*SHARED_RINGS, f"strategy.partition=[{first}, {16 - first}]"]))
        assert plays[0](ranges) == pytest.approx(split.step_time_s, rel=0.03), first
        assert balanced.step_time_s <= split.step_time_s * 1.01, (balanced.summary["partition"], first)


@pytest.mark.parametrize("placement,within", [("stage_per_node", 0.10), ("group_per_node", 0.04)])
def test_each_chunk_reduces_its_gradients_when_its_last_backward_ends(monkeypatch, placement, within):
    """Interleaved 1F1B, 8 replicas of 2 devices x 2 chunks: a device's later chunk finishes its
    backward passes first, and its allreduce runs while the earlier chunk's continue (the engine
    plays each chunk's buckets in its last backward). Reduced after the device's last pass, the
    play was 39-52 % above the simulated step with a stage to a node (now within 10 %), and up to
    8 % above with a replica to a node (now within 4 %)."""
    import simulator.strategies.stage_partition as stage_partition
    plays = []
    original = stage_partition._played_step
    monkeypatch.setattr(stage_partition, "_played_step", lambda *args: plays.append(original(*args)) or plays[-1])
    layout = ["strategy.kind=interleaved_1f1b", "strategy.num_groups=8", "strategy.num_microbatches=2",
              "strategy.num_virtual_stages=2", "training.global_batch_size=64", "cluster.inter_node_link=ib-hdr",
              f"strategy.placement={placement}"]
    simulate(load_scenario(DEMO, layout))
    for split in ([11, 3, 1, 1], [4, 3, 3, 6], [13, 1, 1, 1]):
        bounds = np.cumsum([0, *split])
        step = simulate(load_scenario(DEMO, [*layout, f"strategy.partition={split}".replace(" ", "")])).step_time_s
        assert plays[0](tuple(zip(bounds[:-1], bounds[1:]))) == pytest.approx(step, rel=within), split
