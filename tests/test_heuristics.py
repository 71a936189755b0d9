"""The GHP heuristics' closed forms (simulator/heuristics.py) against hand-computed values."""

from __future__ import annotations

import pytest

from simulator.heuristics import (closed_form_step, estimate_peak_memory_bytes, grid_estimates, memory_first,
                                  time_minimising)
from simulator.topology import Topology
from simulator.workload import Layer, Workload
from tests.helpers import FixedCosts, link, toy_workload

INTRA = link(1e-5, 1e9)
INTER = link(4e-5, 1e8)


def two_layer_table() -> Workload:
    """params 100 / 50; input 10 / 20; output 20 / 5; saved 10 / 20 elements per sample."""
    return Workload("two", (
        Layer("a", "linear", 1.0, 2.0, 100, 10, 20, 10),
        Layer("b", "linear", 1.0, 2.0, 50, 20, 5, 20),
    ))


@pytest.mark.parametrize("dtype, optimizer, stashed, one_pass, expected", [
    # 150 params x (4 w + 4 g + 8 adam) + (10 + 20) x 8 x 4 saved + max(10+20, 20+5) x 8 x 4 workspace
    ("fp32", "adam", 8, None, 150 * 16 + 30 * 8 * 4 + 30 * 8 * 4),
    # 150 x (2 + 2 + 4 velocity + 4 fp32 master) + 30 x 8 x 2 + 30 x 8 x 2
    ("fp16", "momentum", 8, None, 150 * 12 + 30 * 8 * 2 + 30 * 8 * 2),
    # a pipeline stage: 4 samples held, passes of 2; SGD has no state
    ("fp32", "sgd", 4, 2, 150 * 8 + 30 * 4 * 4 + 30 * 2 * 4),
])
def test_memory_estimate_by_hand(dtype, optimizer, stashed, one_pass, expected):
    workload = two_layer_table()
    assert estimate_peak_memory_bytes(workload, 0, 2, dtype=dtype, optimizer=optimizer, stashed_samples=stashed,
                                      pass_samples=one_pass) == pytest.approx(expected)
    # one layer alone: layer b, 50 params, saved 20, workspace 20 + 5
    assert estimate_peak_memory_bytes(workload, 1, 2, dtype="fp32", optimizer="sgd", stashed_samples=1) == 50 * 8 + 20 * 4 + 25 * 4


def closed(topology, groups, placement="group_per_node", memory=1e12):
    # toy: 4 layers of 1e6 params, 1000-element outputs; F = 1 ms / sample, B = 2 ms / sample
    return closed_form_step(toy_workload(4), FixedCosts(1e-3), topology, groups, placement, global_batch_size=8,
                            dtype="fp32", optimizer="sgd", device_memory_bytes=memory)


def test_closed_form_on_one_node_by_hand():
    node = Topology(1, 4, INTRA, INTER)
    ghp = closed(node, 2)  # G = 2 x M = 2, B/G = 4
    assert ghp.ranges == ((0, 2), (2, 4))
    assert ghp.compute_s == pytest.approx(4 * 3e-3 * 4)
    assert ghp.activation_s == pytest.approx(2 * 1000 * 4 * 4 / 1e9)
    assert ghp.allreduce_s == pytest.approx(2 * 1 / 2 * 8e6 / 1e9 + 2 * 1e-5)  # ring of 2 over 2 layers' 8 MB
    dp = closed(node, 4)
    assert dp.step_time_s == pytest.approx(4 * 3e-3 * 2 + 2 * 3 / 4 * 16e6 / 1e9 + 6 * 1e-5)
    mp = closed(node, 1)
    assert mp.step_time_s == pytest.approx(4 * 3e-3 * 8 + 3 * 2 * 1000 * 8 * 4 / 1e9)
    assert mp.allreduce_s == 0.0


def test_closed_form_two_nodes_placement_and_shared_nic():
    nodes = Topology(2, 2, INTRA, INTER)
    by_group = closed(nodes, 2, "group_per_node")  # groups inside nodes, both stage rings leave each node
    assert by_group.activation_s == pytest.approx(2 * 1000 * 4 * 4 / 1e9)
    assert by_group.allreduce_s == pytest.approx(8e6 / (1e8 / 2) + 2 * (1e-5 + 4e-5))
    by_stage = closed(nodes, 2, "stage_per_node")  # peers inside nodes, activations cross the 1e8 link
    assert by_stage.activation_s == pytest.approx(2 * 1000 * 4 * 4 / 1e8)
    assert by_stage.allreduce_s == pytest.approx(8e6 / 1e9 + 2 * 1e-5)


def test_grid_estimates_enumerate_divisor_pairs_and_placements():
    common = dict(global_batch_size=8, dtype="fp32", optimizer="sgd", device_memory_bytes=1e12)
    one_node = grid_estimates(toy_workload(4), FixedCosts(1e-3), Topology(1, 4, INTRA, INTER), **common)
    assert [(e.num_groups, e.workers_per_group) for e in one_node] == [(1, 4), (2, 2), (4, 1)]
    two_nodes = grid_estimates(toy_workload(4), FixedCosts(1e-3), Topology(2, 2, INTRA, INTER), **common)
    assert [(e.num_groups, e.placement) for e in two_nodes] == [
        (1, "group_per_node"), (2, "group_per_node"), (2, "stage_per_node"), (4, "group_per_node")]
    odd_batch = grid_estimates(toy_workload(2), FixedCosts(1e-3), Topology(1, 4, INTRA, INTER),
                               **{**common, "global_batch_size": 6})
    # G = 4: 6 samples not divisible by 4; G = 1: M = 4 stages > 2 layers; only G = 2 x M = 2 stays
    assert [(e.num_groups, e.workers_per_group) for e in odd_batch] == [(2, 2)]


def test_memory_first_picks_the_smallest_fitting_m():
    # fp32 SGD, 1e6 params per layer: M=1 (B/G = 2) 32e6 + 32e3 saved + 16e3 workspace;
    # M=2 (4 samples) 16e6 + 32e3 + 32e3; M=4 (8 samples) 8e6 + 32e3 + 64e3
    workload, costs, node = toy_workload(4), FixedCosts(1e-3), Topology(1, 4, INTRA, INTER)
    peaks = {e.workers_per_group: e.peak_memory_bytes for e in grid_estimates(
        workload, costs, node, global_batch_size=8, dtype="fp32", optimizer="sgd", device_memory_bytes=1e12)}
    assert peaks == {1: pytest.approx(32.048e6), 2: pytest.approx(16.064e6), 4: pytest.approx(8.096e6)}
    for memory, expected in ((1e12, 1), (20e6, 2), (10e6, 4), (5e6, None)):
        estimates = grid_estimates(workload, costs, node, global_batch_size=8, dtype="fp32", optimizer="sgd",
                                   device_memory_bytes=memory)
        pick = memory_first(estimates)
        assert (pick.workers_per_group if pick else None) == expected
        fitting = [e for e in estimates if e.fits]
        best = time_minimising(estimates)
        assert best.step_time_s == min(e.step_time_s for e in fitting or estimates)
