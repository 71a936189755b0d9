"""The asynchronous host of the kernel model in the engine: a rank's host issues each pass's kernels
right after the previous pass's, from the step's start, never waiting for the device, so a pass ends
no earlier than its last kernel is issued and a host that ran ahead during long device work costs
nothing (simulator.engine's module docstring)."""

from __future__ import annotations

import pytest

from simulator.engine import Engine
from simulator.plan import Compute, Plan, Recv, Send, Stage
from simulator.records import span_table
from simulator.topology import Topology
from tests.helpers import FixedCosts, link


class SplitCosts(FixedCosts):
    """Per layer (device seconds, host seconds) of the forward; the backward is free on both."""

    def __init__(self, forward_parts):
        super().__init__()
        self.forward_parts = forward_parts

    def compute_parts(self, layer_index: int, phase: str, batch: float) -> tuple[float, float]:
        return self.forward_parts[layer_index] if phase == "F" else (0.0, 0.0)

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        return max(self.compute_parts(layer_index, phase, batch))


def forward_ends(parts) -> list[float]:
    """End times of one rank's chain of single-layer forward passes with these (device, host) parts."""
    actions = tuple(Compute(i, "F", i, i + 1, 1.0, deps=(i - 1,) if i else ()) for i in range(len(parts)))
    plan = Plan("mp", 1, 1, (Stage(0, 0, len(parts), 0),), (0,), (actions,), 1.0)
    topology = Topology(1, 1, link(1e-6, 1e9), link(1e-6, 1e9))
    table = span_table(Engine(plan, topology, SplitCosts(parts)).run().spans)
    return sorted(table[table["stream"] == "compute"]["end_s"])


def test_a_host_that_ran_ahead_during_long_device_work_costs_nothing():
    # layer 0: 10 s on the device, issued in 1 s; layer 1: 1 s on the device, issued in 5 s (by 6 s)
    assert forward_ends([(10.0, 1.0), (1.0, 5.0)]) == pytest.approx([10.0, 11.0])  # a pass alone each: 15 s


def test_a_host_bound_start_holds_the_device_back():
    # layer 0 is issued in 4 s, 1 s of device work; layer 1 issued by 4 + 4 s
    assert forward_ends([(1.0, 4.0), (1.0, 4.0)]) == pytest.approx([4.0, 8.0])


def test_the_host_lead_is_spent_before_it_binds_again():
    # the device runs ahead of a host at 3 s a pass only while layer 0's 5 s last
    assert forward_ends([(5.0, 1.0), (1.0, 3.0), (1.0, 3.0), (1.0, 3.0)]) == pytest.approx([5.0, 6.0, 7.0, 10.0])


def test_a_received_input_resyncs_the_host():
    """Rank 1's second pass waits for rank 0's activation (sent at 10 s): its host issues it only then."""
    first = (Compute(0, "F", 0, 1, 1.0), Send(1, 1, 1e3, ("x",), deps=(0,)))
    second = (Compute(0, "F", 1, 2, 1.0), Recv(1, 0, ("x",)), Compute(2, "F", 2, 3, 1.0, deps=(1,)))
    plan = Plan("mp", 1, 2, (Stage(0, 0, 1, 0), Stage(1, 1, 3, 0)), (0, 1), (first, second), 1.0)
    topology = Topology(1, 2, link(1e-9, 1e15), link(1e-9, 1e15))
    costs = SplitCosts([(10.0, 0.0), (1.0, 1.0), (0.5, 2.0)])
    table = span_table(Engine(plan, topology, costs).run().spans)
    last = table[(table["rank"] == 1) & (table["stream"] == "compute")]["end_s"].max()
    assert last == pytest.approx(12.0, rel=1e-6)  # without the resync: issued by 3 s, ending at 10.5 s
