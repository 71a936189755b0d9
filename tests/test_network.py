"""Max-min fair flow network against closed forms (rates) and hand-computed finish times."""

import math
import random
from types import SimpleNamespace

import pytest
import simpy

from simulator.network import FlowNetwork, max_min_rates, merged_usages
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_plan
from tests.test_engine import _send_ends, _sends_plan


def flow(flow_id, usage, cap=math.inf):
    return SimpleNamespace(id=flow_id, usage=tuple(usage), cap=cap)


@pytest.mark.parametrize("num_flows", [1, 2, 3, 7])
def test_n_flows_on_one_link_each_get_one_nth(num_flows):
    rates = max_min_rates([flow(i, [(0, 1)]) for i in range(num_flows)], [12.0])
    assert rates == pytest.approx({i: 12.0 / num_flows for i in range(num_flows)})


def test_a_flow_limited_elsewhere_leaves_its_share_to_the_others():
    # Link 1 (capacity 4) carries f0 and f1: it fills at 2 each. Link 0 (capacity 10) carries f0,
    # f2, f3: f0 takes only its 2, so f2 and f3 split the remaining 8 (equal shares would give 10/3).
    flows = [flow(0, [(0, 1), (1, 1)]), flow(1, [(1, 1)]), flow(2, [(0, 1)]), flow(3, [(0, 1)])]
    assert max_min_rates(flows, [10.0, 4.0]) == pytest.approx({0: 2.0, 1: 2.0, 2: 4.0, 3: 4.0})


def test_parking_lot_long_flow_gets_the_share_of_its_tightest_link():
    # Bertsekas & Gallager's chain: a long flow over links 0..2 and one short flow per link.
    # Capacities 1, 2, 3: link 0 fills first at 1/2; then links 1 and 2 give the rest to their flows.
    flows = [flow(0, [(0, 1), (1, 1), (2, 1)]), flow(1, [(0, 1)]), flow(2, [(1, 1)]), flow(3, [(2, 1)])]
    assert max_min_rates(flows, [1.0, 2.0, 3.0]) == pytest.approx({0: 0.5, 1: 0.5, 2: 1.5, 3: 2.5})


def test_lock_step_phase_demands_count_times_its_rate():
    # A phase with two sub-flows on link 0 and one on link 1 (capacity 2): link 1 limits it to 2 per
    # sub-flow, i.e. 4 of link 0; the single flow on link 0 gets the other 6.
    phase, single = flow(0, [(0, 2), (1, 1)]), flow(1, [(0, 1)])
    assert max_min_rates([phase, single], [10.0, 2.0]) == pytest.approx({0: 2.0, 1: 6.0})
    # Unconstrained elsewhere, the three sub-flows share link 0 equally.
    assert max_min_rates([flow(0, [(0, 2)]), single], [9.0]) == pytest.approx({0: 3.0, 1: 3.0})


def test_a_rate_cap_freezes_a_flow_below_its_fair_share():
    flows = [flow(0, [(0, 1)], cap=1.0), flow(1, [(0, 1)]), flow(2, [(0, 1)], cap=100.0)]
    assert max_min_rates(flows, [10.0]) == pytest.approx({0: 1.0, 1: 4.5, 2: 4.5})


def run_flows(capacities, starts):
    """starts: (start_s, size, usage) per flow; returns each flow's finish time."""
    env = simpy.Environment()
    network = FlowNetwork(env, capacities)
    finished = {}

    def start(index, start_s, size, usage):
        yield env.timeout(start_s)
        yield network.transfer(size, tuple(usage))
        finished[index] = env.now

    for index, (start_s, size, usage) in enumerate(starts):
        env.process(start(index, start_s, size, usage))
    env.run()
    return [finished[i] for i in range(len(starts))]


def test_a_flow_joining_midway_reshares_the_link():
    # A alone for 0.5 s (half done), then both at 1/2: A ends at 1.5; B's last half alone ends at 2.
    assert run_flows([1.0], [(0.0, 1.0, [(0, 1)]), (0.5, 1.0, [(0, 1)])]) == pytest.approx([1.5, 2.0])


def test_a_flow_ending_midway_frees_bandwidth_along_the_chain():
    # Link 0 (2/s): X, Z; link 1 (1/s): X, Y. Until Y ends at 0.5 s: X = Y = 0.5, Z = 1.5. Then X
    # and Z both run at 1 until X (0.75 left) ends at 1.25; Z (1.5 left) ends alone at 2/s at 2.0.
    # W on its own link is in another component and never changes rate.
    finishes = run_flows([2.0, 1.0, 1.0], [
        (0.0, 1.0, [(0, 1), (1, 1)]),   # X
        (0.0, 0.25, [(1, 1)]),          # Y
        (0.0, 3.0, [(0, 1)]),           # Z
        (0.0, 1.7, [(2, 1)]),           # W
    ])
    assert finishes == pytest.approx([1.25, 0.5, 2.0, 1.7])


def test_links_no_flow_tells_apart_merge_into_the_tightest_with_the_same_finishes():
    # Links 0-3 carry A and B alike (A twice on each), link 4 only C: they merge into link 2, the
    # tightest; link 5 carries A twice and C, so it stays; B alone on 6 and 7 keeps the tighter, 7.
    capacities = [9.0, 8.0, 3.0, 3.0, 5.0, 4.0, 6.0, 2.5]
    usages = [((0, 2), (1, 2), (2, 2), (3, 2), (5, 2)), ((0, 1), (1, 1), (2, 1), (3, 1), (6, 1), (7, 1)),
              ((4, 1), (5, 1))]
    merged = merged_usages(usages + usages[:1], capacities)
    assert merged == {usages[0]: ((2, 2), (5, 2)), usages[1]: ((2, 1), (7, 1)), usages[2]: ((4, 1), (5, 1))}
    starts = [(0.0, 1.0, 0), (0.2, 2.0, 1), (0.1, 0.7, 2), (0.5, 0.4, 1)]
    full = run_flows(capacities, [(start, size, usages[i]) for start, size, i in starts])
    assert run_flows(capacities, [(start, size, merged[usages[i]]) for start, size, i in starts]) == full


def test_zero_bytes_or_no_links_finish_at_once():
    assert run_flows([1.0], [(0.3, 0.0, [(0, 1)]), (0.2, 5.0, [])]) == pytest.approx([0.3, 0.2])


def test_equal_flows_end_together_and_many_flows_stay_consistent():
    # 50 flows of 1 byte starting every 0.01 s on one 10 B/s link: the link is never idle, so the
    # last byte leaves at 50 / 10 = 5.0 s; sharing equally, earlier flows end earlier.
    finishes = run_flows([10.0], [(i * 0.01, 1.0, [(0, 1)]) for i in range(50)])
    assert max(finishes) == pytest.approx(5.0)
    assert finishes == sorted(finishes)


def test_engine_a_send_limited_by_the_inter_node_link_leaves_the_device_port_to_another():
    # gpu0 sends 3 GB to gpu3 (other node, 1 GB/s spine uplink) and 3 GB to gpu1 (same node); both
    # leave through gpu0's 3 GB/s port. Max-min: 1 + 2 GB/s, so gpu1's send ends at 1.5 s (equal
    # shares would give it 1.5 GB/s and 2.0 s); the inter-node send ends at 3.0 s.
    topology = Topology(2, 2, link(0.0, 3e9), link(0.0, 1e9))
    spans = run_plan(_sends_plan([(0, 3), (0, 1)], 3e9), topology, FixedCosts())
    assert _send_ends(spans) == pytest.approx([1.5, 3.0])


def processor_sharing_finishes(capacity, starts):
    """Reference: flows on one link share it equally (starts: (start_s, size) per flow)."""
    remaining = {index: size for index, (_, size) in enumerate(starts)}
    arrivals = sorted(range(len(starts)), key=lambda index: starts[index][0])
    active, finished, now = set(), {}, 0.0
    while len(finished) < len(starts):
        next_arrival_s = starts[arrivals[0]][0] if arrivals else math.inf
        rate = capacity / len(active) if active else 0.0
        first = min(active, key=lambda index: remaining[index]) if active else None
        next_finish_s = now + remaining[first] / rate if active else math.inf
        until = min(next_arrival_s, next_finish_s)
        for index in active:
            remaining[index] -= rate * (until - now)
        now = until
        if next_finish_s <= next_arrival_s:
            active.discard(first)
            finished[first] = now
        else:
            active.add(arrivals.pop(0))
    return [finished[index] for index in range(len(starts))]


def test_many_flows_queued_on_one_link_share_it_as_processor_sharing():
    """Hundreds of flows alike (one stage pair's sends) joining and leaving one link finish when
    equal sharing says, although the network keeps them as one class with one rate."""
    rng = random.Random(7)
    starts = [(rng.uniform(0.0, 50.0), rng.uniform(0.1, 2.0)) for _ in range(300)]
    expected = processor_sharing_finishes(10.0, starts)
    finishes = run_flows([10.0], [(start_s, size, [(0, 1)]) for start_s, size in starts])
    assert finishes == pytest.approx(expected, rel=1e-9)


def test_a_class_of_flows_weighs_as_many_flows_on_every_link_it_crosses():
    """Three flows alike on links 0 (100/s) and 1 (8/s), one more on link 1, one on link 0. Link 1
    fills first at 8 / 4 = 2/s a flow: the three end at 1 s (2 B); the fourth (4 B) has 2 B left and
    runs alone at 8/s: 1.25 s. The flow on link 0 gets what the three leave, 100 - 3 x 2 = 94/s, for
    1 s, then 100/s for its last 4 B: 1.04 s."""
    alike = (0.0, 2.0, [(0, 1), (1, 1)])
    finishes = run_flows([100.0, 8.0], [alike, alike, alike, (0.0, 4.0, [(1, 1)]), (0.0, 98.0, [(0, 1)])])
    assert finishes == pytest.approx([1.0, 1.0, 1.0, 1.25, 1.04], rel=1e-12)
