"""Fabrics beyond two-tier: routes and hop counts on small instances, fat-tree bisection, graph files."""

import json
from types import SimpleNamespace

import networkx as nx
import pytest

from simulator.errors import ScenarioError
from simulator.fabrics import build_topology, fat_tree, rail_optimized, torus_2d
from simulator.network import max_min_rates
from simulator.scenario import ClusterConfig, load_scenario
from simulator.topology import Topology, device_name
from tests.helpers import link

INTRA, INTER = link(1e-6, 100e9), link(4e-6, 10e9)


def vertices(topology, route):
    """The vertex path of a route; asserts consecutive links join up."""
    path = [topology.links[route[0]].source]
    for index in route:
        assert topology.links[index].source == path[-1]
        path.append(topology.links[index].target)
    return path


def assert_shortest_routes(topology):
    for source in range(topology.num_devices):
        lengths = nx.single_source_shortest_path_length(topology.graph, device_name(source))
        for target in range(topology.num_devices):
            route = topology.route(source, target)
            if source == target:
                assert route == ()
                continue
            path = vertices(topology, route)
            assert (path[0], path[-1]) == (device_name(source), device_name(target))
            assert len(route) == lengths[device_name(target)], (source, target, path)


def test_fat_tree_k4_routes_are_shortest_with_2_4_6_hops_between_nics():
    topology = fat_tree(16, 1, INTRA, INTER, k=4)  # 16 nodes = the k^3/4 hosts of a 4-ary fat-tree
    assert sum(1 for v in topology.graph if str(v).startswith("core")) == 4
    assert_shortest_routes(topology)
    # gpu -> nic, then nic -> edge -> nic (same edge switch), via an aggregation switch (same pod) or a core.
    assert [len(topology.route(0, t)) for t in (1, 2, 4)] == [4, 6, 8]
    assert vertices(topology, topology.route(0, 7)) == [
        "gpu0", "nic0.0", "edge0.0", "agg0.1", "core1.1", "agg1.1", "edge1.1", "nic7.0", "gpu7"]
    assert topology.route_latency_s(0, 7) == pytest.approx(4e-6)


def test_fat_tree_gpus_of_one_node_use_the_node_switch_and_their_own_nics():
    topology = fat_tree(2, 4, INTRA, INTER, nics_per_node=2)  # 4 NICs -> k = 4 (k^3/4 = 16 >= 4)
    assert topology.fat_tree_k == 4
    assert vertices(topology, topology.route(0, 3)) == ["gpu0", "node0", "gpu3"]
    assert vertices(topology, topology.route(1, 6))[:2] == ["gpu1", "nic0.0"]
    assert vertices(topology, topology.route(2, 6))[:2] == ["gpu2", "nic0.1"]
    assert_shortest_routes(topology)


def permutation_rates(topology, pairs):
    flows = [SimpleNamespace(id=i, usage=tuple((l, 1) for l in topology.route(s, t)), cap=float("inf"))
             for i, (s, t) in enumerate(pairs)]
    rates = max_min_rates(flows, [l.bandwidth_bytes_per_s for l in topology.links])
    return [rates[i] for i in range(len(pairs))]


def test_fat_tree_has_full_bisection_where_two_tier_with_one_uplink_congests():
    # 4 nodes x 4 GPUs; every GPU sends to the GPU 8 further on (the other half of the cluster).
    pairs = [(d, (d + 8) % 16) for d in range(16)]
    two_tier = Topology(4, 4, INTRA, INTER, nics_per_node=1)
    assert permutation_rates(two_tier, pairs) == pytest.approx([10e9 / 4] * 16)
    tree = fat_tree(4, 4, INTRA, INTER, nics_per_node=4)
    assert permutation_rates(tree, pairs) == pytest.approx([10e9] * 16)


@pytest.mark.parametrize("shift", range(1, 16))
def test_fat_tree_d_mod_k_routes_every_shift_permutation_without_contention(shift):
    tree = fat_tree(16, 1, INTRA, INTER, k=4)
    assert permutation_rates(tree, [(d, (d + shift) % 16) for d in range(16)]) == pytest.approx([10e9] * 16)


def test_rail_optimized_same_rail_direct_and_other_rails_through_the_nvlink_proxy():
    topology = rail_optimized(2, 4, INTRA, INTER, nics_per_node=4)
    assert vertices(topology, topology.route(0, 4)) == ["gpu0", "nic0.0", "rail0", "nic1.0", "gpu4"]
    assert vertices(topology, topology.route(0, 5)) == [
        "gpu0", "node0", "gpu1", "nic0.1", "rail1", "nic1.1", "gpu5"]
    assert topology.route_latency_s(0, 4) == pytest.approx(4e-6)
    assert topology.route_latency_s(0, 5) == pytest.approx(5e-6)
    # Rail r carries only GPU r of each node: GPU i of node 0 to GPU i of node 1 never contend.
    assert permutation_rates(topology, [(i, 4 + i) for i in range(4)]) == pytest.approx([10e9] * 4)


def test_torus_routes_are_dimension_ordered_shortest_paths():
    topology = torus_2d(12, 1, INTRA, INTER, shape=(3, 4))
    assert_shortest_routes(topology)
    # Node 0 -> node 6 (row 1, column 2): along row 0 to column 2 (tie: increasing), then down.
    assert vertices(topology, topology.route(0, 6)) == ["gpu0", "node0", "node1", "node2", "node6", "gpu6"]
    # Node 0 -> node 3: one hop the short way round the row ring.
    assert vertices(topology, topology.route(0, 3)) == ["gpu0", "node0", "node3", "gpu3"]
    assert topology.route_latency_s(0, 6) == pytest.approx(1e-6 + 3 * 4e-6)


def test_torus_default_shape_and_rings_of_two():
    assert torus_2d(6, 2, INTRA, INTER).torus_shape == (2, 3)
    topology = torus_2d(4, 1, INTRA, INTER)  # 2 x 2: one cable per neighbour pair
    assert len([l for l in topology.links if l.tier == "inter"]) == 8
    assert_shortest_routes(topology)


def small_graph():
    graph = nx.Graph()
    for device in range(4):
        graph.add_edge(f"gpu{device}", f"sw{device // 2}", bandwidth="100 GB/s", latency="1 us", tier="intra")
    graph.add_edge("sw0", "sw1", bandwidth="200 Gb/s", latency="3 us")
    return graph


@pytest.mark.parametrize("suffix", [".json", ".graphml"])
def test_graph_file_round_trip(tmp_path, suffix):
    path = tmp_path / f"cluster{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(nx.node_link_data(small_graph(), edges="links")))
    else:
        nx.write_graphml(small_graph(), path)
    cluster = ClusterConfig(num_nodes=2, gpus_per_node=2, topology="graph_file", topology_file=str(path),
                            degraded_links={"sw0--sw1": 0.5})
    topology = build_topology(cluster)
    assert vertices(topology, topology.route(0, 3)) == ["gpu0", "sw0", "sw1", "gpu3"]
    assert [topology.links[i].bandwidth_bytes_per_s for i in topology.route(0, 3)] == pytest.approx(
        [100e9, 12.5e9, 100e9])
    assert topology.route_latency_s(0, 3) == pytest.approx(5e-6)
    assert topology.route_tier(0, 3) == "inter" and topology.route_tier(0, 1) == "intra"


def test_graph_file_errors_name_the_field(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(nx.node_link_data(small_graph(), edges="links")))
    with pytest.raises(ScenarioError, match="cluster.topology_file: .*gpu5"):
        build_topology(ClusterConfig(num_nodes=3, gpus_per_node=2, topology="graph_file", topology_file=str(path)))
    with pytest.raises(ScenarioError, match="file not found"):
        build_topology(ClusterConfig(topology="graph_file", topology_file=str(tmp_path / "nope.json")))


def test_default_is_the_two_tier_topology():
    cluster = ClusterConfig(num_nodes=3, gpus_per_node=2, inter_node_link=INTER, intra_node_link=INTRA)
    built, direct = build_topology(cluster), Topology(3, 2, INTRA, INTER)
    assert built.kind == "two_tier" and built.links == direct.links
    assert all(built.route(s, t) == direct.route(s, t) for s in range(6) for t in range(6))


def scenario_with(cluster):
    return {"cluster": {"num_nodes": 4, "gpus_per_node": 2, **cluster}, "model": {"name": "mlp"},
            "training": {"global_batch_size": 8}}


@pytest.mark.parametrize("cluster, message", [
    ({"topology": "torus_2d", "torus_shape": [3, 3]}, "cluster.torus_shape"),
    ({"fat_tree_k": 4}, "cluster.fat_tree_k: only used with cluster.topology fat_tree"),
    ({"topology": "graph_file"}, "cluster.topology_file: required"),
    ({"topology": "fat_tree", "fat_tree_k": 3}, "cluster.fat_tree_k: 3 must be even"),
    ({"topology": "fat_tree", "nics_per_node": 3, "gpus_per_node": 4}, "cluster.nics_per_node: 3"),
    ({"degraded_links": {"node7": 0.5}}, "cluster.degraded_links: 'node7'"),
    ({"stragglers": {8: 2.0}}, "cluster.stragglers: index 8"),
    ({"degraded_links": {"node0": 1.5}}, "cluster.degraded_links"),
])
def test_bad_fabric_settings_raise_one_line_errors(cluster, message):
    with pytest.raises(ScenarioError, match=message):
        build_topology(load_scenario(scenario_with(cluster)).cluster)


@pytest.mark.parametrize("cluster", [
    dict(topology="two_tier", num_nodes=5, gpus_per_node=4, nics_per_node=2),
    dict(topology="fat_tree", num_nodes=24, gpus_per_node=8, nics_per_node=8),  # three pods
    dict(topology="fat_tree", num_nodes=10, gpus_per_node=4, nics_per_node=2),
    dict(topology="fat_tree", num_nodes=7, gpus_per_node=2, nics_per_node=1, fat_tree_k=4),
    dict(topology="rail_optimized", num_nodes=5, gpus_per_node=8, nics_per_node=2),  # PXN hops
    dict(topology="rail_optimized", num_nodes=3, gpus_per_node=4, nics_per_node=4),
    dict(topology="torus_2d", num_nodes=12, gpus_per_node=2),
    dict(topology="torus_2d", num_nodes=16, gpus_per_node=1, torus_shape=[4, 4]),  # ties both ways round
    dict(topology="torus_2d", num_nodes=5, gpus_per_node=2),  # one ring
], ids=lambda cluster: f"{cluster['topology']}-{cluster['num_nodes']}x{cluster['gpus_per_node']}")
def test_routes_by_link_index_equal_the_routes_by_vertex_name(cluster):
    topology = build_topology(ClusterConfig(**cluster))
    assert topology._link_route is not None
    n = topology.num_devices
    for source in range(n):
        for target in range(n):
            assert topology.route(source, target) == topology.named_route(source, target), (source, target)


def test_a_replaced_edge_falls_back_to_routes_by_name():
    topology = Topology(2, 2, INTRA, INTER)
    topology.add_link("node0", "spine", "inter", 0.0, 1e9)  # a second node0 -> spine edge wins the name
    assert topology._link_route is None
    assert topology.route(0, 2)[1] == len(topology.links) - 1
