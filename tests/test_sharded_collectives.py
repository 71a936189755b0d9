"""Allgather and reduce-scatter across nodes (simulator/collectives.py `gather_algorithm`): played as
the rail decomposition of NCCL's channels, so the inter-node part moves at the node's NICs together
as the hierarchical allreduce's does; their closed forms; a reduce-scatter then an allgather is that
allreduce; and on a DGX-style fabric (a NIC per GPU) an FSDP gather no longer waits on one NIC."""

from __future__ import annotations

import pytest

from simulator import load_scenario
from simulator.collective_forms import (hierarchical_allgather_time_s, hierarchical_allreduce_time_s,
                                        hierarchical_reduce_scatter_time_s, ring_allgather_time_s)
from simulator.collectives import allgather_phases, gather_algorithm
from simulator.fabrics import build_topology
from simulator.plan import Collective, Plan, Stage
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_plan

INTRA_LATENCY, INTRA_BW = 2e-6, 100e9
INTER_LATENCY, INTER_BW = 10e-6, 2e9
NODES, PER_NODE = 2, 4


def _topology() -> Topology:
    return Topology(NODES, PER_NODE, link(INTRA_LATENCY, INTRA_BW), link(INTER_LATENCY, INTER_BW))


def _plan(ops: list[tuple[str, float]], num_ranks: int = NODES * PER_NODE) -> Plan:
    """Every rank runs `ops` ((op, size_bytes), ...) one after another."""
    ranks = tuple(range(num_ranks))
    actions = tuple(tuple(Collective(id=i, op=op, ranks=ranks, size_bytes=size, key=(op, i), algorithm="auto",
                                     deps=(i - 1,) if i else ()) for i, (op, size) in enumerate(ops))
                    for _ in ranks)
    return Plan("test", num_ranks, 1, (Stage(0, 0, 1, 0),), ranks, actions, 1.0)


def _end_s(ops) -> float:
    return run_plan(_plan(ops), _topology(), FixedCosts())["end_s"].max()


def test_gathers_go_hierarchical_across_nodes_with_several_ranks_on_each():
    topology = _topology()
    assert gather_algorithm(topology, tuple(range(8))) == "hierarchical"
    assert gather_algorithm(topology, (0, 1, 2, 3)) == "ring"      # one node
    assert gather_algorithm(topology, (0, 4)) == "ring"            # one rank a node: each hop its own NIC
    assert len(allgather_phases(topology, tuple(range(8)), 1e6)) == 2


def test_hierarchical_allgather_matches_its_closed_form():
    per_rank = 10e6
    expected = hierarchical_allgather_time_s(per_rank, NODES, PER_NODE, INTRA_LATENCY, INTRA_BW,
                                             INTRA_LATENCY + INTER_LATENCY, INTER_BW)
    assert _end_s([("allgather", per_rank)]) == pytest.approx(expected, rel=1e-9)
    # the rails' rings share the node's link: the g ranks' blocks cross it, not the whole buffer p times
    flat = ring_allgather_time_s(per_rank, NODES * PER_NODE, INTER_LATENCY, INTER_BW)
    assert expected < flat


def test_hierarchical_reduce_scatter_matches_its_closed_form():
    size = 80e6
    expected = hierarchical_reduce_scatter_time_s(size, NODES, PER_NODE, INTRA_LATENCY, INTRA_BW,
                                                  INTRA_LATENCY + INTER_LATENCY, INTER_BW)
    assert _end_s([("reduce_scatter", size)]) == pytest.approx(expected, rel=1e-9)


def test_reduce_scatter_then_allgather_is_the_hierarchical_allreduce():
    size = 80e6
    pair = _end_s([("reduce_scatter", size), ("allgather", size / (NODES * PER_NODE))])
    allreduce = hierarchical_allreduce_time_s(size, NODES, PER_NODE, INTRA_LATENCY, INTRA_BW,
                                              INTRA_LATENCY + INTER_LATENCY, INTER_BW)
    assert pair == pytest.approx(allreduce, rel=1e-9)
    assert _end_s([("allreduce", size)]) == pytest.approx(allreduce, rel=1e-9)


def test_on_a_dgx_fabric_reduce_scatter_and_allgather_cost_what_the_allreduce_does():
    """Two DGX H100 nodes (a NIC per GPU, NCCL's protocols): a 1 GB reduce-scatter then allgather
    take the hierarchical allreduce's time to within its phases' latencies, and a 16-GPU FSDP step
    gathers at the nodes' eight NICs (the flat ring's one NIC a node took about eight times longer)."""
    scenario = load_scenario("scenarios/llama3_70b_fsdp_h100.yaml", ["cluster.num_nodes=2"])
    topology = build_topology(scenario.cluster)
    plan = _plan([("reduce_scatter", 1e9), ("allgather", 1e9 / 16)], 16)
    pair = run_plan(plan, topology, FixedCosts())["end_s"].max()
    allreduce = run_plan(_plan([("allreduce", 1e9)], 16), topology, FixedCosts())["end_s"].max()
    assert pair == pytest.approx(allreduce, rel=0.02)
    nic_bw = min(topology.links[link_index].bandwidth_bytes_per_s for link_index in topology.route(7, 8))
    nic_s = 1e9 / 16 * 15 / nic_bw  # the flat ring: every block through one NIC a node
    gather = run_plan(_plan([("allgather", 1e9 / 16)], 16), topology, FixedCosts())["end_s"].max()
    assert gather < nic_s / 4
