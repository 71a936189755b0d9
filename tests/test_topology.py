"""The cluster graph: routes, tiers, latencies and the networkx view agree."""

import networkx as nx
import pytest

from simulator.topology import INTER, INTRA, Topology, device_name
from tests.helpers import link


def test_routes_match_networkx_shortest_paths():
    topology = Topology(3, 4, link(2e-6, 100e9), link(10e-6, 10e9), nics_per_node=2)
    for source in range(12):
        for target in range(12):
            route = topology.route(source, target)
            if source == target:
                assert route == ()
                continue
            path = nx.shortest_path(topology.graph, device_name(source), device_name(target))
            assert [topology.links[i].source for i in route] + [topology.links[route[-1]].target] == path


def test_latency_and_tier_of_routes():
    topology = Topology(2, 2, link(2e-6, 100e9), link(10e-6, 10e9))
    assert topology.route_latency_s(0, 1) == pytest.approx(2e-6)
    assert topology.route_latency_s(0, 2) == pytest.approx(12e-6)
    assert topology.route_tier(0, 1) == INTRA and topology.route_tier(1, 2) == INTER


def test_nics_multiply_the_inter_node_bandwidth_and_one_node_has_no_spine():
    topology = Topology(2, 4, link(2e-6, 100e9), link(10e-6, 10e9), nics_per_node=4)
    inter = [l for l in topology.links if l.tier == INTER]
    assert len(inter) == 4 and all(l.bandwidth_bytes_per_s == 40e9 for l in inter)
    assert "spine" not in Topology(1, 8, link(0, 1e9), link(0, 1e9)).graph


def test_a_topology_is_freed_when_its_last_user_drops_it():
    """Its route memos hold no reference back to it: no cycle is left for the garbage collector."""
    import gc
    import weakref
    from simulator.fabrics import build_topology
    from simulator.scenario import ClusterConfig
    topology = build_topology(ClusterConfig(num_nodes=2, gpus_per_node=2, gpu="A100-80GB",
                                            intra_node_link="nvlink3-a100", inter_node_link="ib-hdr"))
    assert topology.route(0, 3) and topology.route_class(0, 3) and topology.route_latency_s(0, 3) > 0
    alive = weakref.ref(topology)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del topology
        assert alive() is None
    finally:
        if enabled:
            gc.enable()
