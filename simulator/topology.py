"""The cluster as directed links with per-link latency and bandwidth, and routes (a networkx graph on demand).

A link's bandwidth is what an application gets from it, the capacity the engine shares among flows:
for the kinds NCCL's tables describe (nvlink, pcie, infiniband, roce) the preset's line rate x the
kind's achievable fraction (`simulator.nccl.LINK_EFFICIENCY`: NVLink and PCIe 0.8, IB and RoCE
0.94); ethernet and host links keep their configured rate, since how much of an Ethernet or host
link an application gets (TCP, gloo, MPI) is the scenario's figure to set. Every link records its
kind and whether its switch reduces in-network (NVLS); graph-file edges have no kind and count
as ethernet (the default of an inline link spec).

Every fabric (`cluster.topology`) has, per node, a node switch (NVSwitch/NVLink) with one
intra-tier link per device; a node's devices always talk through it. Every link is full duplex =
two directed edges, each one shared resource in the engine. Between nodes:

- two_tier (default): node switch <-> one spine (inter tier; `nics_per_node` NICs aggregated;
  only with more than one node). Each tier's preset latency is split over the two edges a route
  crosses in it: intra-node routes cost the intra latency, inter-node ones intra + inter.
- fat_tree: a k-ary fat-tree (Al-Fares, Loukissas & Vahdat, SIGCOMM 2008) whose hosts are the
  nodes' NICs; GPU i of a node reaches NIC i // (gpus_per_node / nics_per_node) directly (GPUDirect
  RDMA; the GPU-NIC edge has the NIC's bandwidth and no latency). Every switch link has the NIC's
  bandwidth (full bisection); routes are the unique up-down shortest paths with D-mod-k uplink
  choice (aggregation switch t mod k/2, core (t div k/2) mod k/2 for destination NIC t; Zahavi et
  al., 2010), so shift permutations are contention free. Inter-node latency: the inter preset.
- rail_optimized: NIC j of every node on rail switch j (a rail-only network, Wang et al., 2023);
  a transfer to another rail first crosses the node switch to the source node's GPU on the target
  rail (PXN, as NCCL does).
- torus_2d: node switches on an R x C torus (links of `nics_per_node` x the inter preset, inter
  latency per hop); dimension-order routing (columns, then rows), the shorter way round each ring
  (ties: increasing index).
- graph_file: any graph (`simulator.graph_file`), fewest-hop routes (networkx bidirectional BFS,
  deterministic for a given file).

Routes are defined by vertex names (`Hops`, `Topology.named_route`); the preset fabrics also
compute them from link-index tables (`LinkRoute`), equal by test and several times faster, and
memoise every route, its latency and its NCCL class per device pair.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from weakref import ref
from typing import NamedTuple

from simulator.errors import ScenarioError
from simulator.hardware import GpuSpec, LinkSpec
from simulator.nccl import HOP_LATENCY_S, achievable_bandwidth_bytes_per_s

INTRA, INTER = "intra", "inter"


class Link(NamedTuple):
    """One directed edge of the cluster graph; `bandwidth_bytes_per_s` is the achievable rate
    (the module docstring), `kind` the LinkSpec's kind. A named tuple: fabrics of 16,384 GPUs
    create hundreds of thousands of them."""

    index: int
    source: str
    target: str
    tier: str
    latency_s: float
    bandwidth_bytes_per_s: float
    kind: str = "ethernet"
    nvls: bool = False


def _new_link(fields: tuple) -> Link:
    """A `Link` from all its fields in order (tuple.__new__: no keyword handling, for fabrics of
    hundreds of thousands of links)."""
    return tuple.__new__(Link, fields)


Hops = Callable[["Topology", int, int], list]
"""(topology, source device, target device) -> vertex names of the route, inter-node pairs only."""
LinkRoute = Callable[["Topology", int, int], tuple]
"""The same route as link indices, from the fabric's `Topology.route_tables` (no names built: a
fabric of 16,384 GPUs routes tens of thousands of pairs). Equal to the `Hops` route (tested)."""


def _memo(topology: "Topology", function):
    """`function(topology, source_device, target_device)` memoized without a reference back to the
    topology: a topology of 100 k links and their routes is then freed when its last user drops
    it, not left in a reference cycle for the garbage collector to walk (0.2-0.4 s at 16,384 GPUs)."""
    weak = ref(topology)
    return lru_cache(maxsize=None)(lambda source_device, target_device: function(weak(), source_device, target_device))


class Topology:
    """Devices, switches and directed links of a cluster; routes between devices.

    `Topology(num_nodes, gpus_per_node, intra, inter, nics_per_node)` is the two-tier fabric; the
    other fabrics come from `fat_tree`, `rail_optimized`, `torus_2d` and `from_graph`, and a
    `ClusterConfig`'s whole topology from `build_topology` (all in `simulator.fabrics`).
    `node_gpus` (node -> GpuSpec differing from the cluster's GPU) and `slowdowns` (device ->
    compute slowdown) describe heterogeneous devices (`simulator.heterogeneity`).
    """

    def __init__(self, num_nodes: int, gpus_per_node: int, intra: LinkSpec, inter: LinkSpec,
                 nics_per_node: int = 1):
        self._start(num_nodes, gpus_per_node, "two_tier", _two_tier_hops)
        self.nics_per_node = nics_per_node
        self._add_node_switches(intra)
        if num_nodes > 1:
            uplinks = []
            for node in range(num_nodes):
                uplinks.append(len(self.links))
                self.add_duplex(node_switch_name(node), "spine", INTER, inter.latency_s / 2,
                                inter.bandwidth_bytes_per_s * nics_per_node, inter.kind)
            self.set_link_route(_two_tier_route, node_uplinks=uplinks)

    @classmethod
    def empty(cls, num_nodes: int, gpus_per_node: int, kind: str, hops: Hops) -> "Topology":
        """A topology without links, for fabric builders."""
        topology = cls.__new__(cls)
        topology._start(num_nodes, gpus_per_node, kind, hops)
        return topology

    def _start(self, num_nodes: int, gpus_per_node: int, kind: str, hops: Hops) -> None:
        self.num_nodes = num_nodes
        self.gpus_per_node = gpus_per_node
        self.kind = kind
        self.nics_per_node = 1
        self.fat_tree_k: int | None = None
        self.torus_shape: tuple[int, int] | None = None
        self._graph = None
        self.links: list[Link] = []
        self.node_gpus: dict[int, GpuSpec] = {}
        self.slowdowns: dict[int, float] = {}
        self.owner: dict[str, int] = {}
        """Vertex -> node for the vertices inside a node (devices, node switch, NICs)."""
        self._edge_index: dict[tuple[str, str], int] | None = None
        """(source, target) vertex names -> link index, built from `links` on first use (`_edges`):
        fabrics routed by link index (`set_link_route`) never need it for their ~10^5 links."""
        self._hops = hops
        self._link_route: LinkRoute | None = None
        self.route_tables: dict[str, object] = {}
        """Link indices a fabric's `LinkRoute` reads (filled as the fabric's links are added)."""
        self._device_uplinks: list[int] = []
        self._device_downlinks: list[int] = []
        self._route = _memo(self, Topology._compute_route)
        self._route_class = _memo(self, Topology._compute_route_class)
        self._route_latency_s = _memo(self, Topology._compute_route_latency_s)
        self._shapes: dict[tuple, tuple[float, tuple[str, float]]] = {}
        """(same node, each link's (tier, kind, latency)) -> (route latency, route class): routes of one
        shape share them, so a ring of thousands of hops computes each once (`route_shape`)."""

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, device: int) -> int:
        return device // self.gpus_per_node

    def route(self, source_device: int, target_device: int) -> tuple[int, ...]:
        """Link indices from one device to another (empty for a device to itself)."""
        return self._route(source_device, target_device)

    def route_latency_s(self, source_device: int, target_device: int) -> float:
        return self._route_latency_s(source_device, target_device)

    def _compute_route_latency_s(self, source_device: int, target_device: int) -> float:
        return sum(self.links[i].latency_s for i in self.route(source_device, target_device))

    def route_shape(self, source_device: int, target_device: int) -> tuple[float, tuple[str, float]]:
        """(`route_latency_s`, `route_class`) of a route between two different devices, computed
        once per shape of route (the same two functions of the same link fields) and not memoized
        per pair: for walking many distinct pairs once, as a large ring's hops."""
        links = self.links
        route = self.route(source_device, target_device)
        key = (source_device // self.gpus_per_node == target_device // self.gpus_per_node,
               tuple(links[i][3:5] + links[i][6:7] for i in route))
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = (self._compute_route_latency_s(source_device, target_device),
                                         self._compute_route_class(source_device, target_device))
        return found

    def route_tier(self, source_device: int, target_device: int) -> str:
        """The outermost tier a route crosses: "inter" between nodes, else "intra"."""
        same_node = self.node_of(source_device) == self.node_of(target_device)
        return INTRA if same_node else INTER

    def route_class(self, source_device: int, target_device: int) -> tuple[str, float]:
        """NCCL's hardware class of a route and its own latency: the kind of the links of the
        route's outermost tier (`route_tier`; the one of largest NCCL hop latency if they differ)
        and their summed one-way latency. NVLink or PCIe inside a node, the network between nodes."""
        return self._route_class(source_device, target_device)

    def _compute_route_class(self, source_device: int, target_device: int) -> tuple[str, float]:
        links = [self.links[i] for i in self.route(source_device, target_device)]
        tier = self.route_tier(source_device, target_device)
        outer = [link for link in links if link.tier == tier] or links
        kinds = {link.kind for link in outer}
        kind = kinds.pop() if len(kinds) == 1 else max(kinds, key=lambda k: (HOP_LATENCY_S[k, "ring", "Simple"], k))
        return kind, sum(link.latency_s for link in outer)

    def set_link_route(self, link_route: "LinkRoute", **tables) -> None:
        """Route by link indices (`LinkRoute`) instead of by vertex names, reading `tables`."""
        self.route_tables.update(tables)
        self._link_route = link_route

    def _compute_route(self, source_device: int, target_device: int) -> tuple[int, ...]:
        if source_device == target_device:
            return ()
        if self._link_route is not None:
            if source_device // self.gpus_per_node == target_device // self.gpus_per_node:
                return self._device_uplinks[source_device], self._device_downlinks[target_device]
            return self._link_route(self, source_device, target_device)
        return self.named_route(source_device, target_device)

    def named_route(self, source_device: int, target_device: int) -> tuple[int, ...]:
        """The route from the fabric's vertex names (`Hops`), what `LinkRoute`s must equal."""
        if source_device == target_device:
            return ()
        if self.kind != "graph_file" and self.node_of(source_device) == self.node_of(target_device):
            switch = node_switch_name(self.node_of(source_device))
            hops = [device_name(source_device), switch, device_name(target_device)]
        else:
            hops = self._hops(self, source_device, target_device)
        edges = self._edges()
        return tuple(edges[(u, v)] for u, v in zip(hops, hops[1:]))

    def _edges(self) -> dict[tuple[str, str], int]:
        """`_edge_index`, built now if it is not (a later link of an edge replaces the earlier)."""
        if self._edge_index is None:
            self._edge_index = {(link[1], link[2]): link[0] for link in self.links}
        return self._edge_index

    def add_link(self, source: str, target: str, tier: str, latency_s: float, line_rate: float,
                 kind: str = "ethernet", nvls: bool = False) -> None:
        """A directed link of `kind` whose capacity is the achievable share of its `line_rate`."""
        self._append(source, target, tier, latency_s, achievable_bandwidth_bytes_per_s(kind, line_rate), kind, nvls)

    def _append(self, source: str, target: str, tier: str, latency_s: float, bandwidth: float, kind: str,
                nvls: bool) -> None:
        index, edge = len(self.links), (source, target)
        if self._edge_index is not None or self._link_route is not None:  # else built when first asked
            edges = self._edges()
            if edge in edges:  # an edge replaced: index routes would miss it
                self._link_route = None
            edges[edge] = index
        self.links.append(_new_link((index, source, target, tier, latency_s, bandwidth, kind, nvls)))
        self._graph = None

    def has_link(self, source: str, target: str) -> bool:
        return (source, target) in self._edges()

    @property
    def graph(self):
        """The fabric as a networkx DiGraph (vertex names, each edge's index, tier, latency_s and
        bandwidth_bytes_per_s), built on first use: only graph-file routes need it."""
        if self._graph is None:
            import networkx as nx
            self._graph = nx.DiGraph()
            self._graph.add_edges_from((link.source, link.target, {
                "index": link.index, "tier": link.tier, "latency_s": link.latency_s,
                "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s}) for link in self.links)
        return self._graph

    def add_duplex(self, a: str, b: str, tier: str, latency_s: float, line_rate: float,
                   kind: str = "ethernet", nvls: bool = False) -> None:
        """Two directed links, a -> b then b -> a (`_append` twice; inlined while no edge index is
        kept, as fabric builders add ~10^5)."""
        bandwidth = achievable_bandwidth_bytes_per_s(kind, line_rate)
        if self._edge_index is not None or self._link_route is not None:
            self._append(a, b, tier, latency_s, bandwidth, kind, nvls)
            self._append(b, a, tier, latency_s, bandwidth, kind, nvls)
            return
        links, index = self.links, len(self.links)  # no edge index to keep: `_append` without it
        links.append(tuple.__new__(Link, (index, a, b, tier, latency_s, bandwidth, kind, nvls)))
        links.append(tuple.__new__(Link, (index + 1, b, a, tier, latency_s, bandwidth, kind, nvls)))
        self._graph = None

    def _add_node_switches(self, intra: LinkSpec) -> None:
        uplinks, downlinks = self._device_uplinks, self._device_downlinks
        for node in range(self.num_nodes):
            switch = node_switch_name(node)
            self.owner[switch] = node
            for local in range(self.gpus_per_node):
                device = device_name(node * self.gpus_per_node + local)
                self.owner[device] = node
                uplinks.append(len(self.links))
                downlinks.append(len(self.links) + 1)
                self.add_duplex(device, switch, INTRA, intra.latency_s / 2, intra.bandwidth_bytes_per_s,
                                intra.kind, intra.nvls)

    def degrade(self, factors: dict[str, float]) -> None:
        """Scale the bandwidth of named links (see `degraded_links`) by their factors."""
        for name, factor in factors.items():
            for index in degraded_links(self, name):
                link = self.links[index]
                bandwidth = link.bandwidth_bytes_per_s * factor
                self.links[index] = link._replace(bandwidth_bytes_per_s=bandwidth)
        self._graph = None  # rebuilt from the links on next use


def degraded_links(topology: Topology, name: str) -> list[int]:
    """Links named by a `cluster.degraded_links` key, both directions.

    "node<n>": node n's links to the rest of the fabric (its uplinks / NIC cables / torus links);
    "gpu<d>": every link of device d; "<a>--<b>": the link between graph vertices a and b. n and d
    are ASCII digits without a leading zero (`simulator.scenario_types`: "node02" is refused).
    """
    match = re.fullmatch(r"node(0|[1-9][0-9]*)|gpu(0|[1-9][0-9]*)|(.+)--(.+)", name)
    found: list[int] = []
    if match and match.group(1) is not None:
        node = int(match.group(1))
        found = [l.index for l in topology.links
                 if (topology.owner.get(l.source) == node) != (topology.owner.get(l.target) == node)]
    elif match and match.group(2) is not None:
        vertex = device_name(int(match.group(2)))
        found = [l.index for l in topology.links if vertex in (l.source, l.target)]
    elif match:
        a, b = match.group(3), match.group(4)
        found = [l.index for l in topology.links if {l.source, l.target} == {a, b}]
    if not found:
        raise ScenarioError(f"cluster.degraded_links: {name!r} names no link of the {topology.kind} "
                            "topology (use node<n>, gpu<d> or <vertex>--<vertex>)")
    return found


def _two_tier_hops(topology: Topology, source: int, target: int) -> list[str]:
    return [device_name(source), node_switch_name(topology.node_of(source)), "spine",
            node_switch_name(topology.node_of(target)), device_name(target)]


def _two_tier_route(topology: Topology, source: int, target: int) -> tuple[int, ...]:
    uplinks, per_node = topology.route_tables["node_uplinks"], topology.gpus_per_node
    return (topology._device_uplinks[source], uplinks[source // per_node],
            uplinks[target // per_node] + 1, topology._device_downlinks[target])


def device_name(device: int) -> str:
    return f"gpu{device}"


def node_switch_name(node: int) -> str:
    return f"node{node}"


def nic_name(node: int, nic: int) -> str:
    return f"nic{node}.{nic}"

