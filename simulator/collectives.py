"""Collective communication: the flow phases the engine plays on the topology (the closed forms are
in `simulator.collective_forms`).

A collective is played as a sequence of `FlowPhase`s. In a phase, many point-to-point sub-flows
(e.g. the p hops of a ring) move the same number of bytes in lock-step; the engine gives each
sub-flow an equal share of every link it crosses, so a phase runs at the pace of its most loaded
link, and other traffic on those links slows it down. Building a phase is linear in the number of
ranks, and the engine treats a phase as one flow, so a collective never costs quadratic work (but
the all-to-all, whose p(p-1) pair flows are its real traffic: expert-parallel groups are small).

Among devices whose routes cross only the link kinds NCCL's tables describe (nvlink, pcie,
infiniband, roce: `simulator.nccl.NCCL_LINK_KINDS`), phases run as NCCL runs them (NCCL 2.20
`src/graph/tuning.cc`, tables in `simulator.nccl`): each phase picks the protocol (LL, LL128,
Simple) of least predicted time for its size, ring size and link kinds, as NCCL's tuner does; its
latency is base latency(algorithm, protocol) + hops x hop latency(link class, protocol) + the
ring's pipeline fill (`nccl.pipeline_fill_s`), a hop never below the route's own latency in its outermost tier (`Topology.route_class`); its sub-flows carry their bytes / the protocol's payload
efficiency (LL also capped at NCCL's LL bus bandwidth, see `_nccl_choice`). A ring allreduce inside
one node whose NVSwitch reduces (NVLS) may run NVLS instead, when the tuner picks it. Sends take
NCCL's Simple latency (`nccl.p2p_time_s`). A collective crossing any other kind (ethernet, host),
and the parameter server, keep the plain alpha-beta phases: steps x the largest route latency,
payload bytes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from functools import reduce
from itertools import repeat
from weakref import WeakKeyDictionary

from simulator import nccl
from simulator.topology import INTER, INTRA, Topology


@dataclass(frozen=True)
class FlowPhase:
    """Lock-step sub-flows: each moves `bytes_per_subflow` after a start-up `latency_s`."""

    latency_s: float
    bytes_per_subflow: float
    usage: tuple[tuple[int, int], ...]
    """(link index, number of this phase's sub-flows crossing it)."""
    tier_bytes: tuple[tuple[str, float], ...]
    """Bytes this phase moves over each tier (a sub-flow counts in the outermost tier it crosses)."""
    nccl: str = ""
    """NCCL's choice for the phase, "algorithm/protocol" ("ring/LL128", "nvls/Simple", "tree/LL",
    "p2p/Simple"); "" for a plain alpha-beta phase."""


# ----------------------------------------------------------------------------- phases

def choose_algorithm(topology: Topology, devices: tuple[int, ...], requested: str) -> str:
    """`auto`: hierarchical when the ranks span several nodes with several ranks on each node
    (the same number everywhere), else ring."""
    if requested != "auto":
        return requested
    per_node = Counter(topology.node_of(d) for d in devices)
    counts = set(per_node.values())
    if len(per_node) > 1 and len(counts) == 1 and counts.pop() > 1:
        return "hierarchical"
    return "ring"


def allreduce_phases(topology: Topology, devices: tuple[int, ...], size_bytes: float,
                     algorithm: str, num_servers: int = 1) -> tuple[FlowPhase, ...]:
    """Flow phases of an allreduce of `size_bytes` among `devices` with a concrete algorithm."""
    if len(devices) <= 1 or size_bytes <= 0:
        return ()
    ordered = tuple(sorted(devices))
    if algorithm == "ring":
        return _pick([_ring_phase(topology, [ordered], size_bytes, 2.0, nvls=True)])
    if algorithm == "tree":
        return _tree_phases(topology, ordered, size_bytes)
    if algorithm == "hierarchical":
        return _hierarchical_phases(topology, ordered, size_bytes)
    if algorithm == "parameter_server":
        return _parameter_server_phases(topology, ordered, size_bytes, num_servers)
    raise ValueError(f"unknown collective algorithm {algorithm!r}")


def gather_algorithm(topology: Topology, devices: tuple[int, ...]) -> str:
    """`hierarchical` where the ranks span several nodes with the same number (> 1) on each
    (`choose_algorithm`'s auto), else `ring`. NCCL runs one ring per channel, its channels crossing
    the nodes through different NICs (`src/graph/search.cc`; nccl-tests `doc/PERFORMANCE.md`: one bus
    bandwidth for allreduce, allgather and reduce-scatter): the rail decomposition has their traffic
    per NIC, (n-1)/n x S / g, where one flat ring would push every byte through one NIC a node."""
    return "hierarchical" if choose_algorithm(topology, devices, "auto") == "hierarchical" else "ring"


def _node_and_rail_rings(topology: Topology, ordered: tuple[int, ...]) -> tuple[list, list]:
    """(one ring per node of its devices, one ring per local index of that device on every node)."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for device in ordered:
        by_node[topology.node_of(device)].append(device)
    node_rings = [tuple(members) for members in by_node.values()]
    return node_rings, [tuple(ring[k] for ring in node_rings) for k in range(len(node_rings[0]))]


def allgather_phases(topology: Topology, devices: tuple[int, ...],
                     per_rank_bytes: float) -> tuple[FlowPhase, ...]:
    """An allgather: a ring, each hop forwarding p-1 blocks of `per_rank_bytes`; across n nodes of g
    ranks (`gather_algorithm`), each rail's ring across the nodes, then each node's ring of n blocks a rank."""
    if len(devices) <= 1 or per_rank_bytes <= 0:
        return ()
    ordered = tuple(sorted(devices))
    if gather_algorithm(topology, ordered) == "ring":
        return _pick([_ring_phase(topology, [ordered], per_rank_bytes * len(ordered), 1.0)])
    node_rings, rail_rings = _node_and_rail_rings(topology, ordered)
    return _pick([_ring_phase(topology, rail_rings, per_rank_bytes * len(node_rings), 1.0),
                  _ring_phase(topology, node_rings, per_rank_bytes * len(ordered), 1.0)])


def reduce_scatter_phases(topology: Topology, devices: tuple[int, ...],
                          size_bytes: float) -> tuple[FlowPhase, ...]:
    """A reduce-scatter of a `size_bytes` buffer: a ring, each hop forwarding (p-1)/p x S; across n nodes
    of g ranks (`gather_algorithm`), each node's ring over S, then each rail's ring across them over S / g."""
    if len(devices) <= 1 or size_bytes <= 0:
        return ()
    ordered = tuple(sorted(devices))
    if gather_algorithm(topology, ordered) == "ring":
        return _pick([_ring_phase(topology, [ordered], size_bytes, 1.0)])
    node_rings, rail_rings = _node_and_rail_rings(topology, ordered)
    return _pick([_ring_phase(topology, node_rings, size_bytes, 1.0),
                  _ring_phase(topology, rail_rings, size_bytes / len(node_rings[0]), 1.0)])


def alltoall_phases(topology: Topology, devices: tuple[int, ...], size_bytes: float) -> tuple[FlowPhase, ...]:
    """An all-to-all of a `size_bytes` buffer per rank: one phase in which every rank sends 1/p of
    it to each of the p-1 others at once, as NCCL runs `ncclAllToAll` / torch's `all_to_all_single`
    (a group of p-1 sends and receives, all in flight together; NCCL `src/collectives.cc`, whose
    grouped point-to-point calls pay one send latency, `pairs_phase`). Each rank's links carry
    (p-1)/p x S, so alone on a uniform fabric it takes `collective_forms.alltoall_time_s`; over
    shared links (NICs, switch uplinks) the p(p-1) sub-flows split them as any flows do."""
    if len(devices) <= 1 or size_bytes <= 0:
        return ()
    ordered = tuple(sorted(devices))
    pairs = tuple((source, target) for source in ordered for target in ordered if source != target)
    return (pairs_phase(topology, pairs, size_bytes / len(ordered)),)


def collective_phases(topology: Topology, groups: tuple[tuple[int, ...], ...], op: str, size_bytes: float,
                      algorithm: str = "ring", num_servers: int = 1, repeat: int = 1,
                      weight: float = 1.0) -> tuple[FlowPhase, ...]:
    """Phases of `op` ("allreduce" with a concrete `algorithm`, "allgather" of `size_bytes` per rank,
    "reduce_scatter" or "alltoall" of a `size_bytes` buffer) run by every device group of `groups` at once.

    Identical concurrent collectives are merged step by step into one phase (their sub-flows move in
    lock-step, as one ring of `_ring_phase` already does); the collective runs `repeat` times back to
    back, played as one phase of `repeat` x the bytes and the latency (the same time whenever the
    rates on its links do not change in between); tier bytes count `weight` copies (a symmetric
    representative stands for `weight` replicas of its traffic, `simulator.symmetry`).
    """
    if op == "allreduce":
        per_group = [allreduce_phases(topology, group, size_bytes, algorithm, num_servers) for group in groups]
    elif op == "allgather":
        per_group = [allgather_phases(topology, group, size_bytes) for group in groups]
    elif op == "reduce_scatter":
        per_group = [reduce_scatter_phases(topology, group, size_bytes) for group in groups]
    elif op == "alltoall":
        per_group = [alltoall_phases(topology, group, size_bytes) for group in groups]
    else:
        raise ValueError(f"unknown collective {op!r}")
    merged_usages = _MERGED_USAGES.setdefault(topology, {}) if len(groups) > 1 else None
    return tuple(scaled_phase(merge_phases(step, merged_usages), repeat, weight) for step in zip(*per_group))


_MERGED_USAGES: WeakKeyDictionary = WeakKeyDictionary()
"""Topology -> {the usages of concurrent phases: their summed usage}: the groups of a collective cross
the same links at every size (a data-parallel allreduce's t rings of thousands of hops each)."""


def merge_phases(phases, merged_usages: dict | None = None) -> FlowPhase:
    """Concurrent phases moving the same bytes per sub-flow as one phase (usage and bytes summed);
    `merged_usages`: a cache of summed usages by the phases' usages."""
    if len(phases) == 1:
        return phases[0]
    key = tuple(phase.usage for phase in phases)
    usage_items = merged_usages.get(key) if merged_usages is not None else None
    if usage_items is None:
        usage: Counter = Counter()
        for phase in phases:
            usage.update(dict(phase.usage))
        usage_items = tuple(usage.items())
        if merged_usages is not None:
            if len(merged_usages) >= 256:  # `rank` plays many layouts on one cached topology
                del merged_usages[next(iter(merged_usages))]
            merged_usages[key] = usage_items
    tier_bytes: dict[str, float] = defaultdict(float)
    for phase in phases:
        for tier, size in phase.tier_bytes:
            tier_bytes[tier] += size
    return FlowPhase(max(phase.latency_s for phase in phases), max(phase.bytes_per_subflow for phase in phases),
                     usage_items, tuple(tier_bytes.items()), phases[0].nccl)


def scaled_phase(phase: FlowPhase, repeat: int = 1, weight: float = 1.0) -> FlowPhase:
    """`phase` run `repeat` times back to back as one phase; tier bytes x repeat x weight."""
    if repeat == 1 and weight == 1:
        return phase
    return replace(phase, latency_s=phase.latency_s * repeat, bytes_per_subflow=phase.bytes_per_subflow * repeat,
                   tier_bytes=tuple((tier, size * repeat * weight) for tier, size in phase.tier_bytes))


def pairs_phase(topology: Topology, pairs: tuple[tuple[int, int], ...], size_bytes: float,
                weight: float = 1.0) -> FlowPhase:
    """Concurrent point-to-point transfers of `size_bytes` each as one lock-step phase; over NCCL's
    link kinds with NCCL's send latency, Simple base + one Simple hop of the route's class, the hop
    never below the route's own latency (`nccl.p2p_time_s`)."""
    phase = _pairs_phase(topology, list(pairs), size_bytes, 1)
    if phase.usage and _nccl_links(topology, phase.usage):
        latency_s = max(nccl.candidate_latency_s("ring", "Simple", ((_hop_tier({topology.route_class(s, t)}, 1.0), 1),))
                        for s, t in pairs if s != t)
        phase = replace(phase, latency_s=latency_s, nccl="p2p/Simple")
    return scaled_phase(phase, 1, weight)


def collective_label(algorithm: str, phases) -> str:
    """`algorithm` with the NCCL protocols its phases run, for the summary's algorithm counts:
    "ring/LL128", "nvls/Simple", "hierarchical/LL128+Simple"; plain phases: `algorithm` alone."""
    choices = [phase.nccl.split("/") for phase in phases if phase.nccl]
    if not choices:
        return algorithm
    name = "nvls" if any(chosen == "nvls" for chosen, _ in choices) else algorithm
    return f"{name}/{'+'.join(dict.fromkeys(protocol for _, protocol in choices))}"


# ----------------------------------------------------------------------------- NCCL phases

def _pick(built: list[tuple[FlowPhase, FlowPhase | None]]) -> tuple[FlowPhase, ...]:
    """NCCL's phases when every phase of the collective has one (its routes cross NCCL's link
    kinds only), else the plain ones."""
    if all(chosen is not None for _, chosen in built):
        return tuple(chosen for _, chosen in built)
    return tuple(plain for plain, _ in built)


def _nccl_links(topology: Topology, usage) -> bool:
    return all(topology.links[link].kind in nccl.NCCL_LINK_KINDS for link, _ in usage)


def _rate(topology: Topology, usage) -> float:
    """A sub-flow's rate with the phase alone on the network: its most loaded link's share."""
    return min(topology.links[link].bandwidth_bytes_per_s / count for link, count in usage)


def _hop_tier(classes: set[tuple[str, float]], rate: float) -> nccl.Tier:
    """One hop of routes of these (kind, latency) classes (`Topology.route_class`): the kind of
    largest NCCL hop latency (NVLink <= PCI <= network in every table row) and the largest latency."""
    kind = max((kind for kind, _ in classes), key=lambda k: (nccl.HOP_LATENCY_S[k, "ring", "Simple"], k))
    return nccl.Tier(kind, rate, max(latency for _, latency in classes))


def _nccl_choice(traffic_bytes: float, rate: float, plans: dict, num_nodes: int, ll128: bool, steps: int = 1):
    """NCCL's tuner over `plans` ({algorithm: hops}): ((algorithm, protocol), latency, byte factor)
    of least latency + traffic / bandwidth (+ the pipeline fill of `steps` steps,
    `nccl.pipeline_fill_s`, counted in the returned latency), where bandwidth = the sub-flow's uncontended `rate` x
    protocol efficiency (x NVLS's factor; LL capped at llMaxBw). Sub-flows carry traffic x byte
    factor (rate / bandwidth), so alone they take exactly the predicted time and under contention
    they slow down as plain flows do (an LL sub-flow sharing a link keeps its cap-derived factor,
    slightly pessimistic). Tree phases get no 0.92 factor: the flow model plays the tree itself."""
    latency, bandwidth, times = {}, {}, {}
    for algorithm, hops in plans.items():
        for protocol in nccl.ALGORITHM_PROTOCOLS[algorithm]:
            if protocol == "LL128" and not ll128:
                continue
            key = (algorithm, protocol)
            latency[key] = nccl.candidate_latency_s(algorithm, protocol, hops)
            bandwidth[key] = nccl.candidate_bandwidth_bytes_per_s(rate, "nvls" if algorithm == "nvls" else "ring",
                                                                  protocol, num_nodes)
            latency[key] += nccl.pipeline_fill_s(algorithm, protocol, steps, traffic_bytes / steps, bandwidth[key])
            times[key] = latency[key] + traffic_bytes / bandwidth[key]
    choice = nccl.choose(times)
    key = (choice.algorithm, choice.protocol)
    return key, latency[key], rate / bandwidth[key]


def _ring_phase(topology: Topology, rings: list[tuple[int, ...]], size_bytes: float, passes: float,
                nvls: bool = False) -> tuple[FlowPhase, FlowPhase | None]:
    """Concurrent rings; `passes` = 2 for allreduce (reduce-scatter + allgather), 1 for either.
    (plain phase, NCCL phase or None when a route crosses another link kind); `nvls`: an allreduce
    that may run NVLS. The routes' structure comes from `_ring_routes`, only the sizes are new."""
    usage, tier_counts, latency_s, tuner = _ring_routes(topology, tuple(rings), passes, nvls)
    ring_size = len(rings[0])
    per_subflow = passes * (ring_size - 1) / ring_size * size_bytes
    # tier bytes summed sub-flow by sub-flow, as before the cache (bit-identical byte counts)
    tier_bytes = tuple((tier, reduce(float.__add__, repeat(per_subflow, count), 0.0)) for tier, count in tier_counts)
    plain = FlowPhase(passes * (ring_size - 1) * latency_s, per_subflow, usage, tier_bytes)
    if tuner is None:
        return plain, (plain if not usage else None)
    key, latency, factor = _nccl_choice(per_subflow, *tuner)  # rate, plans, num_nodes, ll128, fill steps
    return plain, replace(plain, latency_s=latency, bytes_per_subflow=per_subflow * factor, nccl="/".join(key))


# Topology -> {(rings, passes, nvls): `_ring_routes`}; its links are final once built (`degrade` runs in
# `fabrics.build_topology`).
_RING_ROUTES: WeakKeyDictionary = WeakKeyDictionary()


def _ring_routes(topology: Topology, rings: tuple[tuple[int, ...], ...], passes: float, nvls: bool) -> tuple:
    """(usage, (tier, sub-flows) in first-seen order, largest route latency, NCCL's tuner inputs
    (rate, plans, num_nodes, ll128, fill steps) or None for a plain-only phase), cached."""
    cache = _RING_ROUTES.setdefault(topology, {})
    if (rings, passes, nvls) in cache:
        return cache[rings, passes, nvls]
    usage, tier_counts = Counter(), Counter()
    classes: dict[str, set] = defaultdict(set)
    latency_s, ring_size = 0.0, len(rings[0])
    route, route_shape, per_node = topology.route, topology.route_shape, topology.gpus_per_node
    for ring in rings:
        for source, target in zip(ring, ring[1:] + ring[:1]):
            tier = INTRA if source // per_node == target // per_node else INTER  # `Topology.route_tier`
            tier_counts[tier] += 1
            if source == target:
                continue
            usage.update(route(source, target))
            hop_latency_s, route_class = route_shape(source, target)
            if hop_latency_s > latency_s:
                latency_s = hop_latency_s
            classes[tier].add(route_class)
    usage_items, tuner, steps = tuple(usage.items()), None, passes * (ring_size - 1)
    links = topology.links
    kinds = {links[link].kind for link, _ in usage_items}
    if usage_items and kinds.issubset(nccl.NCCL_LINK_KINDS):  # NCCL's ring: 2(n-1) steps for allreduce
        # (n-1 for either half), passes x (N-1) of them between its N nodes (tuning.cc, NCCL >= 2.21).
        num_nodes = len({topology.node_of(device) for device in rings[0]})
        inter_steps = int(passes * (num_nodes - 1))
        rate = _rate(topology, usage_items)
        intra = _hop_tier(classes[INTRA] or classes[INTER], rate)
        hops = ((intra, int(steps) - inter_steps), (_hop_tier(classes[INTER] or classes[INTRA], rate), inter_steps))
        plans = {"ring": hops}  # the whole single-node NVLS latency is one "hop" (nccl.py):
        if nvls and num_nodes == 1 and all(topology.links[link].nvls for link, _ in usage_items):
            plans["nvls"] = ((intra, 1),)
        fill = nccl.fills(kinds, num_nodes)
        tuner = (rate, plans, num_nodes, kinds.issubset(nccl.LL128_LINK_KINDS), int(steps) if fill else 1)
    cache[rings, passes, nvls] = (usage_items, tuple(tier_counts.items()), latency_s, tuner)
    return cache[rings, passes, nvls]


def _tree_phases(topology: Topology, ordered: tuple[int, ...], size_bytes: float) -> tuple[FlowPhase, ...]:
    """NCCL's tree (as `nccl.py`): a chain through each node's ranks, a double binary tree (the second
    mirrored) over the nodes' first ranks, each tree half the data (NCCL 2.4); reduce, then broadcast,
    pipelined over the depth, the protocol chosen for the whole tree, the base latency in the reduce."""
    chains = [[d for d in ordered if topology.node_of(d) == n] for n in sorted({topology.node_of(d) for d in ordered})]
    leaders = [chain[0] for chain in chains]  # (parent, child) edges; a chain edge carries both halves
    edges = [(a, b) for chain in chains for a, b in zip(chain, chain[1:])] * 2 + [
        (order[(i - 1) // 2], order[i]) for order in (leaders, leaders[::-1]) for i in range(1, len(order))]
    depth = max(1, max(len(chain) for chain in chains) - 1 + math.ceil(math.log2(len(chains))))
    reduce = _pairs_phase(topology, [(child, parent) for parent, child in edges], size_bytes / 2, depth)
    broadcast = _pairs_phase(topology, edges, size_bytes / 2, depth)
    usage = reduce.usage + broadcast.usage
    if not _nccl_links(topology, usage):
        return (reduce, broadcast)
    rate = min(_rate(topology, reduce.usage), _rate(topology, broadcast.usage))
    tier = _hop_tier({topology.route_class(a, b) for a, b in edges}, rate)
    ll128 = all(topology.links[link].kind in nccl.LL128_LINK_KINDS for link, _ in usage)
    (_, protocol), _, factor = _nccl_choice(2 * size_bytes, rate, {"tree": ((tier, 2 * depth),)}, len(chains), ll128)
    hops_s = nccl.candidate_latency_s("tree", protocol, ((tier, depth),), base=False)
    return tuple(replace(phase, latency_s=latency_s, bytes_per_subflow=size_bytes / 2 * factor, nccl=f"tree/{protocol}")
                 for phase, latency_s in ((reduce, nccl.BASE_LATENCY_S["tree", protocol] + hops_s),
                                          (broadcast, hops_s)))


def _hierarchical_phases(topology: Topology, ordered: tuple[int, ...], size_bytes: float) -> tuple[FlowPhase, ...]:
    node_rings, cross_rings = _node_and_rail_rings(topology, ordered)
    per_node = len(node_rings[0])
    phases = []
    if per_node > 1:
        phases.append(_ring_phase(topology, node_rings, size_bytes, 1.0))
    phases.append(_ring_phase(topology, cross_rings, size_bytes / per_node, 2.0))
    if per_node > 1:
        phases.append(_ring_phase(topology, node_rings, size_bytes, 1.0))
    return _pick(phases)


def _parameter_server_phases(topology: Topology, ordered: tuple[int, ...], size_bytes: float,
                             num_servers: int) -> tuple[FlowPhase, ...]:
    """Sharded parameter server co-located with the first rank of each shard's slice: every worker
    pushes S/k to each of k shards, then pulls S/k back (Li et al., OSDI 2014)."""
    num_servers = min(num_servers, len(ordered))
    servers = [ordered[s * len(ordered) // num_servers] for s in range(num_servers)]
    push = [(worker, server) for server in servers for worker in ordered if worker != server]
    shard_bytes = size_bytes / num_servers
    return (_pairs_phase(topology, push, shard_bytes, 1),
            _pairs_phase(topology, [(s, w) for w, s in push], shard_bytes, 1))


def _pairs_phase(topology: Topology, pairs: list[tuple[int, int]], size_bytes: float,
                 latency_steps: int) -> FlowPhase:
    usage: Counter = Counter()
    tier_bytes: dict[str, float] = defaultdict(float)
    latency_s = 0.0
    for source, target in pairs:
        usage.update(topology.route(source, target))
        latency_s = max(latency_s, topology.route_latency_s(source, target))
        tier_bytes[topology.route_tier(source, target)] += size_bytes
    return FlowPhase(latency_steps * latency_s, size_bytes, tuple(usage.items()), tuple(tier_bytes.items()))
