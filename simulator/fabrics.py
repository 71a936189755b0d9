"""Fabric builders for `cluster.topology` (the shapes and routing rules are described in
`simulator.topology`): fat-tree, rail-optimised, 2D torus and graph files; two-tier is
`Topology`'s own constructor. `build_topology` is a `ClusterConfig`'s whole topology."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import networkx as nx

from simulator.errors import ScenarioError
from simulator.graph_file import check_devices, read_graph_file
from simulator.hardware import LinkSpec
from simulator.topology import (INTER, Topology, device_name, nic_name, node_switch_name)


def build_topology(cluster, base_dir: str = ".") -> Topology:
    """Topology of a `ClusterConfig`, with its heterogeneous devices and degraded links."""
    topology = build_fabric(cluster, base_dir)
    topology.node_gpus = {node: gpu for node, gpu in cluster.node_gpus.items() if gpu != cluster.gpu}
    topology.slowdowns = {device: factor for device, factor in cluster.stragglers.items() if factor != 1.0}
    topology.degrade(cluster.degraded_links)
    return topology


@lru_cache(maxsize=4)
def cached_topology(cluster_json: str) -> Topology:
    """The topology of a `ClusterConfig` given as JSON, built once per process (a fat-tree of
    thousands of GPUs takes a second; the layout search simulates many candidates on one cluster).
    Simulations only read a topology (its route memo aside)."""
    from simulator.scenario import ClusterConfig
    return build_topology(ClusterConfig.model_validate_json(cluster_json))


def build_fabric(cluster, base_dir: str = ".") -> Topology:
    """The links of a `ClusterConfig`'s fabric (without heterogeneity or degraded links). A loaded
    scenario's relative topology_file is already made absolute from the scenario's folder
    (`scenario_from_dict`); `base_dir` serves a relative one of a `ClusterConfig` built by hand."""
    args = (cluster.num_nodes, cluster.gpus_per_node, cluster.intra_node_link, cluster.inter_node_link,
            cluster.nics_per_node)
    if cluster.topology == "two_tier":
        return Topology(*args)
    if cluster.topology == "fat_tree":
        return fat_tree(*args, k=cluster.fat_tree_k)
    if cluster.topology == "rail_optimized":
        return rail_optimized(*args)
    if cluster.topology == "torus_2d":
        return torus_2d(*args, shape=cluster.torus_shape)
    path = Path(cluster.topology_file)
    path = path if path.is_absolute() else Path(base_dir) / path
    return from_graph(read_graph_file(path), cluster.num_nodes, cluster.gpus_per_node,
                      what=f"cluster.topology_file: {str(path)!r}")


def _with_nics(num_nodes, gpus_per_node, intra, inter, nics_per_node, kind, hops) -> Topology:
    """Node switches plus NIC vertices; GPU i of a node has a direct edge to its NIC."""
    if gpus_per_node % nics_per_node:
        raise ScenarioError(f"cluster.nics_per_node: {nics_per_node} does not divide cluster.gpus_per_node "
                            f"{gpus_per_node} (topology {kind} gives each NIC the same number of GPUs)")
    topology = Topology.empty(num_nodes, gpus_per_node, kind, hops)
    topology.nics_per_node = nics_per_node
    topology._add_node_switches(intra)
    nic_links = topology.route_tables["nic_links"] = []  # device -> its link to its NIC (+1: back)
    for device in range(topology.num_devices):
        node = topology.node_of(device)
        nic = nic_name(node, _nic_of(topology, device))
        topology.owner[nic] = node
        nic_links.append(len(topology.links))
        topology.add_duplex(device_name(device), nic, INTER, 0.0, inter.bandwidth_bytes_per_s, inter.kind)
    return topology


def _nic_of(topology: Topology, device: int) -> int:
    return device % topology.gpus_per_node * topology.nics_per_node // topology.gpus_per_node


def fat_tree(num_nodes: int, gpus_per_node: int, intra: LinkSpec, inter: LinkSpec, nics_per_node: int = 1,
             k: int | None = None) -> Topology:
    """k-ary fat-tree of the nodes' NICs (Al-Fares et al., SIGCOMM 2008: k/2 hosts per edge switch,
    (k/2)^2 per pod). k defaults to the smallest even k with k^3/4 >= NICs whose edge switches hold
    a power of two of whole nodes (k/2 = nics_per_node x 2^i: each node cabled to one edge switch).
    Switch radices are powers of two (64 ports: NVIDIA Quantum-2 QM9700, Spectrum-4 SN5600; 128:
    Broadcom Tomahawk 5), and so are the node counts of a layout's replicas (t x c x p GPUs), so
    replicas sit alike under the edge switches and pods, and a symmetric run folds."""
    hosts = num_nodes * nics_per_node
    if k is None:
        k = 2
        while k ** 3 // 4 < hosts or (k // 2) % nics_per_node or not _power_of_two(k // 2 // nics_per_node):
            k += 2
    if k % 2 or k ** 3 // 4 < hosts:
        raise ScenarioError(f"cluster.fat_tree_k: {k} must be even with k^3/4 >= the {hosts} NICs "
                            "(num_nodes x nics_per_node)")
    topology = _with_nics(num_nodes, gpus_per_node, intra, inter, nics_per_node, "fat_tree", _fat_tree_hops)
    topology.fat_tree_k, half = k, k // 2
    bandwidth = inter.bandwidth_bytes_per_s
    num_pods = math.ceil(hosts / (half * half))
    host_links, edge_links, core_links = [], {}, {}  # NIC -> edge; (edge, agg) -> edge -> agg; (pod, agg, core)
    for host in range(hosts):
        host_links.append(len(topology.links))
        topology.add_duplex(nic_name(*divmod(host, nics_per_node)), _edge(host, half), INTER,
                            inter.latency_s / 2, bandwidth, inter.kind)
    for pod in range(num_pods):
        for agg in range(half):
            for edge in range(half):
                edge_links[pod * half + edge, agg] = len(topology.links)
                topology.add_duplex(f"edge{pod}.{edge}", f"agg{pod}.{agg}", INTER, 0.0, bandwidth, inter.kind)
            for core in range(half):
                core_links[pod, agg, core] = len(topology.links)
                topology.add_duplex(f"agg{pod}.{agg}", f"core{agg}.{core}", INTER, 0.0, bandwidth, inter.kind)
    topology.set_link_route(_fat_tree_route, host_links=host_links, edge_links=edge_links, core_links=core_links)
    return topology


def _power_of_two(count: int) -> bool:
    return count > 0 and count & (count - 1) == 0


def _edge(host: int, half: int) -> str:
    pod, edge = divmod(host // half, half)
    return f"edge{pod}.{edge}"


def _fat_tree_hops(topology: Topology, source: int, target: int) -> list[str]:
    half, nics = topology.fat_tree_k // 2, topology.nics_per_node
    hs = topology.node_of(source) * nics + _nic_of(topology, source)
    ht = topology.node_of(target) * nics + _nic_of(topology, target)
    up, down = [device_name(source), nic_name(*divmod(hs, nics))], [nic_name(*divmod(ht, nics)), device_name(target)]
    pod_s, pod_t = hs // (half * half), ht // (half * half)
    agg = ht % half
    if hs // half == ht // half:
        middle = [_edge(hs, half)]
    elif pod_s == pod_t:
        middle = [_edge(hs, half), f"agg{pod_s}.{agg}", _edge(ht, half)]
    else:
        core = f"core{agg}.{ht // half % half}"
        middle = [_edge(hs, half), f"agg{pod_s}.{agg}", core, f"agg{pod_t}.{agg}", _edge(ht, half)]
    return up + middle + down


def _fat_tree_route(topology: Topology, source: int, target: int) -> tuple[int, ...]:
    """`_fat_tree_hops` as link indices (each duplex pair: the up link, then the down link)."""
    tables, half, nics = topology.route_tables, topology.fat_tree_k // 2, topology.nics_per_node
    nic_links, host_links = tables["nic_links"], tables["host_links"]
    hs = source // topology.gpus_per_node * nics + _nic_of(topology, source)
    ht = target // topology.gpus_per_node * nics + _nic_of(topology, target)
    up, down = (nic_links[source], host_links[hs]), (host_links[ht] + 1, nic_links[target] + 1)
    edge_s, edge_t = hs // half, ht // half
    if edge_s == edge_t:
        return up + down
    agg, edge_links = ht % half, tables["edge_links"]
    pod_s, pod_t = hs // (half * half), ht // (half * half)
    if pod_s == pod_t:
        return up + (edge_links[edge_s, agg], edge_links[edge_t, agg] + 1) + down
    core_links, core = tables["core_links"], ht // half % half
    return up + (edge_links[edge_s, agg], core_links[pod_s, agg, core], core_links[pod_t, agg, core] + 1,
                 edge_links[edge_t, agg] + 1) + down


def rail_optimized(num_nodes: int, gpus_per_node: int, intra: LinkSpec, inter: LinkSpec,
                   nics_per_node: int = 1) -> Topology:
    """NIC j of every node on rail switch j; no spine (a rail-only network)."""
    topology = _with_nics(num_nodes, gpus_per_node, intra, inter, nics_per_node, "rail_optimized", _rail_hops)
    rail_links = []  # node x nics_per_node + nic -> the NIC's link to its rail switch (+1: back)
    for node in range(num_nodes):
        for nic in range(nics_per_node):
            rail_links.append(len(topology.links))
            topology.add_duplex(nic_name(node, nic), f"rail{nic}", INTER, inter.latency_s / 2,
                                inter.bandwidth_bytes_per_s, inter.kind)
    topology.set_link_route(_rail_route, rail_links=rail_links)
    return topology


def _rail_hops(topology: Topology, source: int, target: int) -> list[str]:
    rail = _nic_of(topology, target)
    node_s, node_t = topology.node_of(source), topology.node_of(target)
    hops = [device_name(source)]
    if _nic_of(topology, source) != rail:  # PXN: over NVLink to the GPU on the target's rail
        proxy = node_s * topology.gpus_per_node + rail * topology.gpus_per_node // topology.nics_per_node
        hops += [node_switch_name(node_s), device_name(proxy)]
    return hops + [nic_name(node_s, rail), f"rail{rail}", nic_name(node_t, rail), device_name(target)]


def _rail_route(topology: Topology, source: int, target: int) -> tuple[int, ...]:
    """`_rail_hops` as link indices."""
    tables, per_node, nics = topology.route_tables, topology.gpus_per_node, topology.nics_per_node
    nic_links, rail_links = tables["nic_links"], tables["rail_links"]
    rail = _nic_of(topology, target)
    node_s, node_t = source // per_node, target // per_node
    sender = source
    head: tuple[int, ...] = ()
    if _nic_of(topology, source) != rail:  # PXN: over NVLink to the GPU on the target's rail
        sender = node_s * per_node + rail * per_node // nics
        head = (topology._device_uplinks[source], topology._device_downlinks[sender])
    return head + (nic_links[sender], rail_links[node_s * nics + rail], rail_links[node_t * nics + rail] + 1,
                   nic_links[target] + 1)


def torus_2d(num_nodes: int, gpus_per_node: int, intra: LinkSpec, inter: LinkSpec, nics_per_node: int = 1,
             shape: tuple[int, int] | None = None) -> Topology:
    """Node switches on an R x C torus; `shape` defaults to the most nearly square R <= C."""
    if shape is None:
        rows = max(r for r in range(1, math.isqrt(num_nodes) + 1) if num_nodes % r == 0)
        shape = (rows, num_nodes // rows)
    rows, cols = shape
    if rows * cols != num_nodes:
        raise ScenarioError(f"cluster.torus_shape: {list(shape)} does not hold the {num_nodes} nodes")
    topology = Topology.empty(num_nodes, gpus_per_node, "torus_2d", _torus_hops)
    topology.torus_shape = (rows, cols)
    topology._add_node_switches(intra)
    bandwidth = inter.bandwidth_bytes_per_s * nics_per_node
    switch_links = {}  # (node, neighbour node) -> the link between their switches
    for row in range(rows):
        for col in range(cols):
            node = row * cols + col
            here = node_switch_name(node)
            for neighbour, size in ((row * cols + (col + 1) % cols, cols), (((row + 1) % rows) * cols + col, rows)):
                there = node_switch_name(neighbour)
                if size > 1 and not topology.has_link(here, there):
                    index = len(topology.links)
                    switch_links[node, neighbour], switch_links[neighbour, node] = index, index + 1
                    topology.add_duplex(here, there, INTER, inter.latency_s, bandwidth, inter.kind)
    topology.set_link_route(_torus_route, switch_links=switch_links)
    return topology


def _torus_nodes(topology: Topology, source: int, target: int) -> list[int]:
    """The nodes a route visits from `source`'s node to `target`'s: dimension order (columns,
    then rows), the shorter way round each ring (ties: increasing index)."""
    rows, cols = topology.torus_shape
    row, col = divmod(topology.node_of(source), cols)
    row_t, col_t = divmod(topology.node_of(target), cols)
    nodes = [row * cols + col]
    for size, is_col in ((cols, True), (rows, False)):
        here, there = (col, col_t) if is_col else (row, row_t)
        step = 1 if (there - here) % size <= size // 2 else -1
        while here != there:
            here = (here + step) % size
            nodes.append(row * cols + here if is_col else here * cols + col_t)
    return nodes


def _torus_hops(topology: Topology, source: int, target: int) -> list[str]:
    return ([device_name(source)] + [node_switch_name(node) for node in _torus_nodes(topology, source, target)]
            + [device_name(target)])


def _torus_route(topology: Topology, source: int, target: int) -> tuple[int, ...]:
    """`_torus_hops` as link indices."""
    switch_links, nodes = topology.route_tables["switch_links"], _torus_nodes(topology, source, target)
    return (topology._device_uplinks[source], *(switch_links[pair] for pair in zip(nodes, nodes[1:])),
            topology._device_downlinks[target])


def from_graph(graph: nx.Graph, num_nodes: int, gpus_per_node: int, what: str = "cluster.topology_file") -> Topology:
    """A topology from a graph whose edges carry `tier`, `latency_s`, `bandwidth_bytes_per_s`;
    vertices gpu0 .. gpu{N-1} are the devices (device d on node d // gpus_per_node), all connected
    (`check_devices`; `what` names the file in its errors). Edges have no link kind: they count as
    ethernet, so they keep their bandwidth and the plain flow model."""
    topology = Topology.empty(num_nodes, gpus_per_node, "graph_file", _graph_hops)
    check_devices(graph, topology.num_devices, what)
    for device in range(topology.num_devices):
        topology.owner[device_name(device)] = topology.node_of(device)
    for a, b, data in graph.edges(data=True):
        add = topology.add_link if graph.is_directed() else topology.add_duplex
        add(str(a), str(b), data["tier"], data["latency_s"], data["bandwidth_bytes_per_s"])
    return topology


def _graph_hops(topology: Topology, source: int, target: int) -> list[str]:
    try:
        return nx.shortest_path(topology.graph, device_name(source), device_name(target))
    except (nx.NetworkXNoPath, nx.NodeNotFound):  # `check_devices` refuses both when the graph is read
        raise ScenarioError(f"cluster.topology_file: no path from {device_name(source)} to "
                            f"{device_name(target)}") from None
