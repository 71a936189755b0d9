"""The engine against closed forms and hand-computed whole timelines."""

import pytest

from simulator.collective_forms import hierarchical_allreduce_time_s, ring_allreduce_time_s, tree_allreduce_time_s
from simulator.plan import Collective, Compute, Plan, Recv, Send, Stage
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_grid, run_plan, toy_workload


def collective_plan(num_ranks: int, size_bytes: float, algorithm: str) -> Plan:
    ranks = tuple(range(num_ranks))
    actions = tuple((Collective(id=0, op="allreduce", ranks=ranks, size_bytes=size_bytes, key=("ar",),
                                algorithm=algorithm),) for _ in ranks)
    return Plan("test", num_ranks, 1, (Stage(0, 0, 1, 0),), ranks, actions, 1.0)


@pytest.mark.parametrize("num_ranks", [2, 3, 4, 8])
def test_ring_allreduce_on_one_tier_matches_closed_form(num_ranks):
    alpha, bandwidth, size = 5e-6, 10e9, 100e6
    topology = Topology(1, num_ranks, link(alpha, bandwidth), link(1e-6, 1e9))
    spans = run_plan(collective_plan(num_ranks, size, "ring"), topology, FixedCosts())
    expected = 2 * (num_ranks - 1) / num_ranks * size / bandwidth + 2 * (num_ranks - 1) * alpha
    assert spans["end_s"].max() == pytest.approx(expected, rel=1e-9)
    assert ring_allreduce_time_s(size, num_ranks, alpha, bandwidth) == pytest.approx(expected, rel=1e-12)


def test_ring_across_nodes_runs_at_the_inter_node_link_and_adds_both_latencies():
    intra, inter = link(2e-6, 100e9), link(10e-6, 1e9)
    topology = Topology(4, 1, intra, inter)
    spans = run_plan(collective_plan(4, 64e6, "ring"), topology, FixedCosts())
    expected = ring_allreduce_time_s(64e6, 4, 2e-6 + 10e-6, 1e9)
    assert spans["end_s"].max() == pytest.approx(expected, rel=1e-9)


def test_hierarchical_allreduce_matches_closed_form():
    intra, inter = link(2e-6, 100e9), link(10e-6, 2e9)
    topology = Topology(2, 4, intra, inter)
    spans = run_plan(collective_plan(8, 80e6, "hierarchical"), topology, FixedCosts())
    expected = hierarchical_allreduce_time_s(80e6, 2, 4, 2e-6, 100e9, 12e-6, 2e9)
    assert spans["end_s"].max() == pytest.approx(expected, rel=1e-9)


def test_hierarchical_beats_flat_ring_when_the_network_is_slow():
    intra, inter = link(2e-6, 150e9), link(20e-6, 1.25e9)
    topology = Topology(4, 4, intra, inter)
    ring = run_plan(collective_plan(16, 100e6, "ring"), topology, FixedCosts())["end_s"].max()
    tree = run_plan(collective_plan(16, 100e6, "tree"), topology, FixedCosts())["end_s"].max()
    hierarchical = run_plan(collective_plan(16, 100e6, "hierarchical"), topology, FixedCosts())["end_s"].max()
    assert hierarchical < ring
    assert tree > 0 and tree_allreduce_time_s(100e6, 16, 1e-6, 1e9) > ring_allreduce_time_s(100e6, 16, 1e-6, 1e9)


def _sends_plan(pairs, size, start_delays=None):
    """Each (src, dst) pair: src waits start_delay (a compute action) then sends `size` bytes."""
    num_ranks = 1 + max(max(pair) for pair in pairs)
    actions = [[] for _ in range(num_ranks)]
    for index, (source, target) in enumerate(pairs):
        deps = ()
        if start_delays and start_delays[index]:
            actions[source].append(Compute(id=len(actions[source]), phase="F", layer_start=0, layer_end=1,
                                           batch=start_delays[index]))
            deps = (actions[source][-1].id,)
        actions[source].append(Send(id=len(actions[source]), dst=target, size_bytes=size, key=("t", index), deps=deps))
        actions[target].append(Recv(id=len(actions[target]), src=source, key=("t", index)))
    return Plan("test", num_ranks, 1, (Stage(0, 0, 1, 0),), tuple(range(num_ranks)),
                tuple(tuple(a) for a in actions), 1.0)


def _send_ends(spans):
    return sorted(spans.loc[spans["stream"] == "send", "end_s"])


def test_two_transfers_sharing_a_link_each_take_twice_as_long():
    topology = Topology(1, 3, link(0.0, 1e9), link(0.0, 1e9))
    alone = run_plan(_sends_plan([(0, 2)], 1e9), topology, FixedCosts())
    shared = run_plan(_sends_plan([(0, 2), (1, 2)], 1e9), topology, FixedCosts())
    assert _send_ends(alone) == pytest.approx([1.0])
    assert _send_ends(shared) == pytest.approx([2.0, 2.0])


def test_transfers_on_disjoint_links_do_not_slow_each_other():
    topology = Topology(1, 4, link(0.0, 1e9), link(0.0, 1e9))
    spans = run_plan(_sends_plan([(0, 1), (2, 3)], 1e9), topology, FixedCosts())
    assert _send_ends(spans) == pytest.approx([1.0, 1.0])


def test_bandwidth_is_reshared_when_a_transfer_joins_midway():
    # A alone for 0.5 s (half done), then both at half rate: A ends at 1.5 s; B then has 0.5 GB left alone.
    topology = Topology(1, 3, link(0.0, 1e9), link(0.0, 1e9))
    spans = run_plan(_sends_plan([(0, 2), (1, 2)], 1e9, start_delays=[0, 0.5]), topology, FixedCosts(1.0))
    assert _send_ends(spans) == pytest.approx([1.5, 2.0])


def _timeline(spans, rank):
    rows = spans[spans["rank"] == rank].sort_values(["start_s", "stream"])
    return [(row.stream, row.name, round(row.start_s, 9), round(row.end_s, 9)) for row in rows.itertuples()]


def test_whole_timeline_two_rank_model_parallel():
    # F = 1 s and B = 2 s per layer at batch 4; a 16 kB activation over a 32 kB/s link = 0.5 s.
    topology = Topology(1, 2, link(0.0, 32_000), link(0.0, 32_000))
    _, spans = run_grid(toy_workload(2, output_elements=1000), topology, FixedCosts(0.25, optimizer_s=0.1),
                        groups=1, workers=2, batch=4)
    assert _timeline(spans, 0) == [
        ("compute", "F0 L0-0", 0.0, 1.0),
        ("send", "send act", 1.0, 1.5),
        ("compute", "B0 L0-0", 5.0, 7.0),
        ("compute", "optimizer", 7.0, 7.1),
    ]
    assert _timeline(spans, 1) == [
        ("compute", "F0 L1-1", 1.5, 2.5),
        ("compute", "B0 L1-1", 2.5, 4.5),
        ("compute", "optimizer", 4.5, 4.6),
        ("send", "send grad", 4.5, 5.0),
    ]


def test_whole_timeline_two_by_two_ghp_with_contention():
    # Two groups of two (one group per node), batch 8 -> 4 per group. Stage 1's allreduce (8 kB per
    # ring hop over the 16 kB/s inter-node link = 0.5 s) shares rank 1's up-link with its 16 kB
    # gradient send: both run at 16 kB/s until the allreduce ends at 5.0 s; the send's last 8 kB
    # then go at 32 kB/s, ending at 5.25 s. Stage 0 backward follows, then its allreduce.
    topology = Topology(2, 2, link(0.0, 32_000), link(0.0, 16_000))
    plan, spans = run_grid(toy_workload(2, num_params=2000, output_elements=1000), topology,
                           FixedCosts(0.25, optimizer_s=0.1), groups=2, workers=2, batch=8)
    assert plan.rank_to_device == (0, 1, 2, 3)
    for stage0, stage1 in ((0, 1), (2, 3)):
        assert _timeline(spans, stage0) == [
            ("compute", "F0 L0-0", 0.0, 1.0),
            ("send", "send act", 1.0, 1.5),
            ("compute", "B0 L0-0", 5.25, 7.25),
            ("comm", "allreduce b0", 7.25, 7.75),
            ("compute", "optimizer", 7.75, 7.85),
        ]
        assert _timeline(spans, stage1) == [
            ("compute", "F0 L1-1", 1.5, 2.5),
            ("compute", "B0 L1-1", 2.5, 4.5),
            ("comm", "allreduce b0", 4.5, 5.0),
            ("send", "send grad", 4.5, 5.25),
            ("compute", "optimizer", 5.0, 5.1),
        ]


def test_data_parallel_without_overlap_is_compute_plus_allreduce():
    alpha, bandwidth = 1e-5, 1e10
    topology = Topology(1, 4, link(alpha, bandwidth), link(alpha, bandwidth))
    workload = toy_workload(4, num_params=1_000_000)
    costs = FixedCosts(1e-3, optimizer_s=1e-4)
    _, spans = run_grid(workload, topology, costs, groups=4, workers=1, batch=8, overlap_backward=False,
                        collective="ring")
    compute_s = 4 * 3 * 1e-3 * 2
    allreduce_s = ring_allreduce_time_s(16e6, 4, alpha, bandwidth)
    assert spans["end_s"].max() == pytest.approx(compute_s + allreduce_s + 1e-4, rel=1e-9)


@pytest.mark.parametrize("per_sample_s", [1e-5, 1e-4, 1e-3, 1e-2])
def test_data_parallel_overlap_lies_between_max_and_sum(per_sample_s):
    alpha, bandwidth = 1e-5, 1e10
    topology = Topology(1, 4, link(alpha, bandwidth), link(alpha, bandwidth))
    workload = toy_workload(8, num_params=1_000_000)
    costs = FixedCosts(per_sample_s)
    _, spans = run_grid(workload, topology, costs, groups=4, workers=1, batch=8,
                        bucket_size_bytes=4e6, collective="ring")
    compute_s = 8 * 3 * per_sample_s * 2
    comm_s = 8 * ring_allreduce_time_s(4e6, 4, alpha, bandwidth)
    step_s = spans["end_s"].max()
    assert max(compute_s, comm_s) <= step_s * (1 + 1e-9)
    assert step_s <= (compute_s + comm_s) * (1 + 1e-9)
    assert spans[spans["stream"] == "comm"]["name"].nunique() == 8
