"""The cluster as a directed networkx graph with per-link latency and bandwidth, and routes.

Shape (two-tier tree, every link full duplex = two directed edges):

    device d  <-> node switch n   (intra-node tier; one port per device)
    node switch n <-> spine       (inter-node tier; `nics_per_node` NICs aggregated; only if
                                   there is more than one node)

Each directed edge is one shared resource in the engine: transfers crossing it share its
bandwidth. A route's latency is the sum of its edges' latencies; each tier's preset latency is
split evenly over the two edges a route crosses in that tier, so a transfer inside a node costs
the intra-node preset latency and one between nodes costs intra + inter latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from simulator.hardware import LinkSpec

INTRA, INTER = "intra", "inter"


@dataclass(frozen=True)
class Link:
    """One directed edge of the cluster graph."""

    index: int
    source: str
    target: str
    tier: str
    latency_s: float
    bandwidth_bytes_per_s: float


class Topology:
    """Devices, switches and directed links of a cluster; routes between devices."""

    def __init__(self, num_nodes: int, gpus_per_node: int, intra: LinkSpec, inter: LinkSpec,
                 nics_per_node: int = 1):
        self.num_nodes = num_nodes
        self.gpus_per_node = gpus_per_node
        self.graph = nx.DiGraph()
        self.links: list[Link] = []
        self._edge_index: dict[tuple[str, str], int] = {}
        for node in range(num_nodes):
            switch = node_switch_name(node)
            for local in range(gpus_per_node):
                device = device_name(node * gpus_per_node + local)
                self._add_duplex(device, switch, INTRA, intra.latency_s / 2, intra.bandwidth_bytes_per_s)
            if num_nodes > 1:
                self._add_duplex(switch, "spine", INTER, inter.latency_s / 2,
                                 inter.bandwidth_bytes_per_s * nics_per_node)
        self._route = lru_cache(maxsize=None)(self._compute_route)

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, device: int) -> int:
        return device // self.gpus_per_node

    def route(self, source_device: int, target_device: int) -> tuple[int, ...]:
        """Link indices from one device to another (empty for a device to itself)."""
        return self._route(source_device, target_device)

    def route_latency_s(self, source_device: int, target_device: int) -> float:
        return sum(self.links[i].latency_s for i in self.route(source_device, target_device))

    def route_tier(self, source_device: int, target_device: int) -> str:
        """The outermost tier a route crosses: "inter" between nodes, else "intra"."""
        same_node = self.node_of(source_device) == self.node_of(target_device)
        return INTRA if same_node else INTER

    def _compute_route(self, source_device: int, target_device: int) -> tuple[int, ...]:
        if source_device == target_device:
            return ()
        source, target = device_name(source_device), device_name(target_device)
        source_switch = node_switch_name(self.node_of(source_device))
        target_switch = node_switch_name(self.node_of(target_device))
        hops = [source, source_switch]
        if source_switch != target_switch:
            hops += ["spine", target_switch]
        hops.append(target)
        return tuple(self._edge_index[(u, v)] for u, v in zip(hops, hops[1:]))

    def _add_duplex(self, a: str, b: str, tier: str, latency_s: float, bandwidth: float) -> None:
        for source, target in ((a, b), (b, a)):
            link = Link(len(self.links), source, target, tier, latency_s, bandwidth)
            self.links.append(link)
            self._edge_index[(source, target)] = link.index
            self.graph.add_edge(source, target, index=link.index, tier=tier,
                                latency_s=latency_s, bandwidth_bytes_per_s=bandwidth)


def device_name(device: int) -> str:
    return f"gpu{device}"


def node_switch_name(node: int) -> str:
    return f"node{node}"


def build_topology(cluster) -> Topology:
    """Topology of a `ClusterConfig`."""
    return Topology(cluster.num_nodes, cluster.gpus_per_node, cluster.intra_node_link,
                    cluster.inter_node_link, cluster.nics_per_node)
