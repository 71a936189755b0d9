"""When folding a megatron run's replicas is exact: every copy of every flow meets the same loads.

A symmetric run (`simulator.symmetry`) plays one representative per flow of the full run: replica
0's TP ring and pipeline transfer of a stage, each link of their routes counted with the
multiplicity of all d replicas' copies of that flow (`Symmetry.fold`), and each stage's
data-parallel collective with the t TP ranks' rings merged into one flow. The full run plays every
copy as its own flow. Rates are max-min fair (progressive filling, `simulator.network`): a flow
freezes at the level where the first link of its path fills, and a link's fill level depends only
on its capacity and on how many sub-flows of each flow cross it, while flows move together. So with
every link's *profile* = sub-flows per flow / capacity (all copies counted: the full run; only what
the folded run plays: the folded run), a copy and its representative get the same rate at every
instant if the profiles that can fill first on their paths are the same. A profile P fills no earlier
than P' when P <= P' flow by flow (less load at every level), so only the maximal profiles of a path
(its *tight* set) can bind. The check: for every flow and every copy, tight(full profiles of the
copy's path) == tight(folded profiles of the representative's path). By induction over the
progressive filling and over time (copies start together, move at one rate, end together) the
folded run then has the full run's rates, so its step time is the full one. Copies also need the
same NCCL choice and latency (`_signature`). Profiles are static (every flow that ever crosses a link):
a flow idle at some instant drops out of every profile alike, which keeps the ordering. The check is
sufficient, not necessary: it is run only where replicas' own traffic shares links (`fold_refusal`).
"""

from __future__ import annotations

from collections import Counter
from weakref import WeakKeyDictionary

from simulator.collectives import choose_algorithm, collective_phases, gather_algorithm
from simulator.topology import Topology


def local_flow_copies(config, topology: Topology) -> list[tuple[str, list, list[tuple], Counter]]:
    """(name, each copy's (source, target) pairs or None, each copy's usage ((link, sub-flows), ...),
    the folded run's usage) of the replica-local flows: TP rings and pipeline transfers."""
    flows = []
    for name, copies in _local_flows(config):
        usages = [route_usage(topology, pairs) for pairs in copies]
        multiplicity = multiplicity_of(topology, copies, usages)
        flows.append((name, copies, usages, Counter({link: multiplicity[link] for link, _ in usages[0]})))
    return flows


def cp_hop_pairs(config, stage: int) -> tuple[tuple[int, int], ...]:
    """Every rank's hop to the next rank of its CP ring at `stage` (all d x c copies, each with its t TP
    ranks; CP fastest among the copies): the folded run plays them as one flow, as a data-parallel ring."""
    devices = [[config.device_of(e, stage, i) for i in range(config.tp)] for e in range(config.dp)]
    return tuple(pair for e in range(config.dp) for pair in zip(devices[e], devices[cp_successor(e, config.cp)]))


def _cp_copies(config, topology: Topology) -> list[tuple[str, list, list[tuple], Counter]]:
    """As `local_flow_copies`, for the CP ring hops: per stage, every copy's hop (its t TP ranks' sends) is a copy,
    played merged (`cp_hop_pairs`); checked like the replica-local flows, since they land on other
    copies' links."""
    t, d = config.tp, config.dp
    flows = []
    for j in range(config.pp if config.cp > 1 else 0):
        pairs = cp_hop_pairs(config, j)
        hops = [pairs[e * t:(e + 1) * t] for e in range(d)]
        copies = [route_usage(topology, hop) for hop in hops]
        flows.append((f"stage {j}'s CP ring hops", hops, copies, summed(copies)))
    return flows


def _data_parallel_copies(config, topology: Topology) -> list[tuple[str, None, list[tuple], Counter]]:
    """As `local_flow_copies`, for the data-parallel collectives: per stage, the t TP ranks' rings are the copies."""
    p, t, d = config.pp, config.tp, config.dp
    flows = []
    for j in range(p if d > 1 else 0):  # allreduce: as the engine picks; ZeRO's gathers: `gather_algorithm`
        groups = [tuple(config.device_of(e, j, i) for e in range(d)) for i in range(t)]
        algorithms = {"ring", choose_algorithm(topology, groups[0], config.collective), gather_algorithm(topology, groups[0])}
        for algorithm in sorted(algorithms):
            per_copy = [_collective_usages(topology, group, algorithm) for group in groups]
            for index in range(len(per_copy[0])):
                copies = [usages[index] for usages in per_copy]
                name = f"stage {j}'s data-parallel {algorithm} (phase {index})"
                flows.append((name, None, copies, summed(copies)))
    return flows


def _collective_usages(topology: Topology, group: tuple[int, ...], algorithm: str) -> tuple:
    """Each phase's usage of an allreduce among `group` (a ring's straight from the routes)."""
    if algorithm == "ring":
        return (route_usage(topology, ring_pairs(group)),)
    return tuple(phase.usage for phase in collective_phases(topology, (group,), "allreduce", 1.0, algorithm))


_MULTIPLICITY: WeakKeyDictionary = WeakKeyDictionary()
"""Topology -> {every copy's pairs: link -> sub-flows of all copies}: the check and the folded run share it."""


def multiplicity_of(topology: Topology, copies: list, usages: list | None = None) -> Counter:
    """Link -> how many sub-flows of all these copies (each a tuple of (source, target) pairs) cross it."""
    cache = _MULTIPLICITY.setdefault(topology, {})
    key = tuple(copies)
    found = cache.get(key)
    if found is None:
        found = cache[key] = summed(usages if usages is not None else
                                    (route_usage(topology, pairs) for pairs in copies))
    return found


def summed(usages) -> Counter:
    """Link -> sub-flows of all these usages ((link, sub-flows), ...) together."""
    total: dict[int, int] = {}
    get = total.get
    for usage in usages:
        for link, count in usage:
            total[link] = get(link, 0) + count
    return Counter(total)


def route_usage(topology: Topology, pairs) -> tuple:
    """((link, sub-flows crossing it), ...) of concurrent transfers between (source, target) devices,
    as `simulator.collectives` builds a phase's usage."""
    usage: dict[int, int] = {}
    route = topology.route
    for source, target in pairs:
        for link in route(source, target):
            usage[link] = usage.get(link, 0) + 1
    return tuple(usage.items())


def ring_pairs(group: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The hops of a ring over `group` in device order, as `simulator.collectives` plays rings."""
    ring = sorted(group)
    return tuple(zip(ring, ring[1:] + ring[:1])) if len(ring) > 1 else ()


def _local_flows(config):
    """(name, per-replica (source, target) pairs) of the replica-local flows: TP rings, pipeline
    transfers both ways."""
    groups = [[tuple(config.device_of(e, j, i) for i in range(config.tp)) for j in range(config.pp)]
              for e in range(config.dp)]
    if config.tp > 1:
        for j in range(config.pp):
            yield f"stage {j}'s TP ring", [ring_pairs(replica[j]) for replica in groups]
    for j, k in transfers(config.pp, config.num_virtual_stages):
        yield f"the pipeline transfer stage {j} -> {k}", [tuple(zip(replica[j], replica[k])) for replica in groups]


def cp_successor(copy: int, cp: int) -> int:
    """The data-parallel index (d x c copies, CP fastest) of the next rank on `copy`'s CP ring."""
    return copy - copy % cp + (copy % cp + 1) % cp


def transfers(num_stages: int, num_virtual_stages: int) -> list[tuple[int, int]]:
    """(from stage, to stage) of the pipeline's transfers: neighbours both ways, and last <-> first
    when the stages are interleaved (virtual stages wrap around)."""
    pairs = [(j, j + 1) for j in range(num_stages - 1)]
    if num_virtual_stages > 1 and num_stages > 1:
        pairs.append((num_stages - 1, 0))
    return [pair for a, b in pairs for pair in ((a, b), (b, a))]


NODE_PRIVATE_FABRICS = ("two_tier", "rail_optimized")
"""Fabrics whose routes cross only links that belong to their two end nodes: device links, the
node's uplink to the spine or its NICs' rail cables (a PXN hop stays inside the sending node)."""


def replicas_on_separate_nodes(config, topology: Topology) -> bool:
    """Whether no node holds devices of two copies (replicas, x CP ranks) on a NODE_PRIVATE_FABRICS
    fabric: then no two copies' own traffic can share a link, and a copy's links carry its own
    sub-flows only."""
    if topology.kind not in NODE_PRIVATE_FABRICS:
        return False
    if not isinstance(config.placement, tuple) and config.cp == 1:  # copy e: devices e pt .. (e + 1) pt - 1
        return config.dp == 1 or (config.pp * config.tp) % topology.gpus_per_node == 0
    owner: dict[int, int] = {}
    for copy in range(config.dp):
        for stage in range(config.pp):
            for rank in range(config.tp):
                if owner.setdefault(topology.node_of(config.device_of(copy, stage, rank)), copy) != copy:
                    return False
    return True


def fold_refusal(config, topology: Topology) -> str:
    """Why the folded run would differ from the full one (module docstring), or '' when it folds.

    Replicas whose own traffic (TP rings, transfers) shares no link fold without the profile check,
    as they always have: each copy of a transfer or TP ring then meets only its own replica's flows
    and the data-parallel rings, alike on fabrics that treat replicas alike, and the symmetric ==
    full tests hold there. The check's static profiles would refuse many of those runs where the
    loads that differ (a data-parallel ring hop on one copy's NIC and not on another's) never meet
    in time; it is the proof asked for where replicas' own traffic does share links."""
    if config.cp == 1 and replicas_on_separate_nodes(config, topology):
        return ""  # what `_replicas_share_a_link` answers below, without every copy's routes
    flows = local_flow_copies(config, topology)
    hops = _cp_copies(config, topology)
    unlike = _unlike(topology, hops)  # a CP ring mixing hops inside and between nodes: its ranks differ
    if unlike:
        return unlike
    flows += hops
    if not _replicas_share_a_link(flows):
        return ""
    flows += _data_parallel_copies(config, topology)
    full: dict[int, dict[int, int]] = {}
    folded: dict[int, dict[int, int]] = {}
    for kind, (_, _, usages, played) in enumerate(flows):
        for usage in usages:
            for link, count in usage:
                loads = full.setdefault(link, {})
                loads[kind] = loads.get(kind, 0) + count
        for link, count in played.items():
            folded.setdefault(link, {})[kind] = count
    interned: dict[tuple, int] = {}
    full_id = _intern(full, topology, interned)
    folded_id = _intern(folded, topology, interned)
    profiles = {index: {kind: count / capacity for kind, count in loads}  # sub-flows per byte/s
                for (capacity, loads), index in interned.items()}
    tight_cache: dict[frozenset, frozenset] = {}
    for name, _, usages, played in flows:
        reference = _tight(frozenset(folded_id[link] for link in played), profiles, tight_cache)
        for replica, usage in enumerate(usages):
            seen = _tight(frozenset(full_id[link] for link, _ in usage), profiles, tight_cache)
            if seen != reference:
                link = next((link for link, _ in usage if full_id[link] in seen - reference), None)
                if link is None:
                    link = next(link for link in played if folded_id[link] in reference - seen)
                edge = topology.links[link]
                return (f"copy {replica} of {name} meets other loads than the folded run's on link "
                        f"{edge.source}->{edge.target} (their contention needs the full simulation)")
    return _unlike(topology, flows)


_REFUSALS: dict = {}
"""(cluster, layout) -> `fold_refusal`'s answer: `rank` simulates many candidates of one layout (micro-batch,
recompute, ZeRO, ...), and the answer depends on the cluster and the layout alone."""


def cached_fold_refusal(cluster, config, topology: Topology) -> str:
    """`fold_refusal`, remembered per cluster and layout (the last 64)."""
    key = (cluster.model_dump_json(), config.tp, config.pp, config.dp, config.cp, config.placement,
           config.num_virtual_stages > 1, config.collective)
    if key not in _REFUSALS:
        if len(_REFUSALS) >= 64:
            del _REFUSALS[next(iter(_REFUSALS))]
        _REFUSALS[key] = fold_refusal(config, topology)
    return _REFUSALS[key]


def _replicas_share_a_link(flows) -> bool:
    """Whether two replicas' own traffic (their copies of the TP rings and transfers) crosses one link."""
    owner: dict[int, int] = {}
    for _, copies, usages, _ in flows:
        if copies is not None:
            for replica, usage in enumerate(usages):
                for link, _ in usage:
                    if owner.setdefault(link, replica) != replica:
                        return True
    return False


def _intern(loads: dict[int, dict[int, int]], topology: Topology, interned: dict) -> dict[int, int]:
    """Link -> the id of its profile (capacity, sub-flows of each flow). Flows were added in increasing
    order, so each link's loads are already sorted."""
    links = topology.links
    return {link: interned.setdefault((links[link].bandwidth_bytes_per_s, tuple(per_flow.items())), len(interned))
            for link, per_flow in loads.items()}


def _tight(ids: frozenset, profiles: dict, cache: dict) -> frozenset:
    """The maximal profiles: those no other profile of the set carries at least as much of each flow
    (p <= q flow by flow: a link of profile p fills no earlier than one of profile q)."""
    found = cache.get(ids)
    if found is None:
        def below(p, q):
            return all(profiles[q].get(kind, 0.0) >= load for kind, load in profiles[p].items())
        found = cache[ids] = frozenset(p for p in ids if not any(q != p and below(p, q) for q in ids))
    return found


def _unlike(topology: Topology, flows) -> str:
    """A reason if a replica's transfer or TP ring would get another latency or NCCL protocol than
    replica 0's: what those depend on besides the size differs (`_signature`)."""
    kinds = [(link.tier, link.kind, link.latency_s, link.nvls) for link in topology.links]
    for name, copies, usages, _ in flows:
        if copies is not None and len({_signature(topology, kinds, pairs, usage)
                                       for pairs, usage in zip(copies, usages)}) > 1:
            return f"replicas' copies of {name} cross different kinds of links or latencies"
    return ""


def _signature(topology: Topology, kinds: list, pairs, usage) -> tuple:
    """What a phase's latency, NCCL protocol and tier bytes depend on besides its size
    (`simulator.collectives`): each hop's links (tier, kind, latency, NVLS) in order and whether it
    stays in a node (its route class, latency and tier follow); the uncontended rate (the most
    loaded link's share); the number of nodes."""
    per_node, route = topology.gpus_per_node, topology.route
    hops = tuple(sorted((a // per_node == b // per_node, tuple(map(kinds.__getitem__, route(a, b))))
                        for a, b in pairs if a != b))
    rate = min((topology.links[link].bandwidth_bytes_per_s / count for link, count in usage), default=0.0)
    return hops, rate, len({topology.node_of(device) for pair in pairs for device in pair})
