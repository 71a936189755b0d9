"""Symmetric runs: simulate one representative rank per pipeline stage, expand to every device.

In a megatron plan (`simulator.strategies.tensor`) on a homogeneous cluster the d data-parallel
replicas, and the t tensor-parallel ranks inside each, run identical actions at identical times.
`strategy.symmetry: auto` then simulates only the p ranks of replica 0's TP rank 0; each action of
a representative is played with the flows of every copy it stands for, on the full topology:

- a TP collective: the flow phases of replica 0's whole TP group (its t devices);
- a pipeline send: the t lock-step sub-flows of replica 0's TP ranks to their counterparts;
- a data-parallel collective (allreduce, ZeRO-1 reduce-scatter / allgather) of stage j: the t
  concurrent rings of all d replicas, as one flow set, so the cross-replica collective is timed on
  the real links with its real contention (`simulator.collectives.collective_phases`);
- with expert parallelism (e replicas a group, `simulator.strategies.experts`), a dispatch or combine
  all-to-all: every EP group's of the stage at once, and an expert gradient's reduction or ZeRO-1
  allgather: every expert-data-parallel group's (the replicas e apart), each one flow set as the
  rings are, its links all kept (the rings keep theirs too: `_links_of_others`);
- under ZeRO-3 `hybrid_shard` (s replicas a node share the states, `simulator.strategies.zero`), a
  unit's gather or reduce-scatter: every shard group's of the stage at once, and its gradient shard's
  allreduce: every replica group's (the replicas s apart), kept whole as the expert groups are;
- with context parallelism (c CP ranks per replica, d counting d x c copies), a CP ring hop (the
  plan's send to itself, `simulator.strategies.context`): every rank's hop of the stage at once,
  one flow set like the data-parallel rings, since hops land on other copies' links.

A TP ring's or a send's links count with multiplicity (`Symmetry.fold`): a link crossed by the
sub-flows of several replicas' copies (replicas side by side behind one NIC, node uplink or core
link) carries all of them, so each copy gets the fair share it gets in the full run.

Bytes per tier count every replica's copy (`weight` d for replica-local traffic). The summary's
per-device rows are the representative's rows copied to every device of its stage
(`expand_summary`); spans and memory timelines are the representatives' (ranks 0..p-1).

When the reduced run equals the full one: when every replica sees the same loads. Refused (full
simulation, with the reason in `summary["tensor"]["symmetry"]`) when `strategy.symmetry` is off,
when the cluster is heterogeneous (mixed GPUs, stragglers, degraded links: `cluster.heterogeneous`),
and when two replicas' own traffic (TP rings, pipeline transfers) shares a link and the link-by-link
check of `simulator.symmetry_check` cannot show that every copy of every flow meets the loads of the
flow played for it; the reason names the copy, the flow and the link (e.g. a fat-tree whose edge
switches or pods straddle replicas: k not matched to the node size). Where replicas' own traffic
shares no link the run folds as before: traffic of other replicas that shares links only with the
data-parallel rings is not simulated; on a fabric that treats every replica alike (fat-tree with
D-mod-k routing, rail-optimised, two-tier) each ring hop then meets the same load on every
replica's links as on replica 0's, so the ring's bottleneck and the step time are unchanged (the
symmetric == full tests). Concurrent copies are merged into lock-step flow sets, which is exact
when their paths are alike.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from weakref import WeakKeyDictionary

from simulator.collectives import choose_algorithm, collective_phases, gather_algorithm, pairs_phase
from simulator.strategies.zero import GATHER_KEY, HYBRID_ALLREDUCE_KEY, REDUCE_KEY, replicated, shard_degree
from simulator.symmetry_check import (cached_fold_refusal, cp_hop_pairs, multiplicity_of, replicas_on_separate_nodes,
                                      ring_pairs)
from simulator.topology import Topology


@dataclass
class Symmetry:
    """What each representative rank (stage j = rank j) of a symmetric megatron run stands for."""

    num_replicas: int
    tp_groups: tuple[tuple[int, ...], ...]
    """Stage j -> devices of replica 0's TP ranks 0..t-1 of stage j."""
    dp_groups: tuple[tuple[tuple[int, ...], ...], ...]
    """Stage j -> for each TP rank, the devices of its d data-parallel copies."""
    rank_to_device: tuple[int, ...]
    """Device of every plan rank of the full run (rank = g p + j)."""
    num_stages: int
    collective: str = "auto"
    """strategy.collective: the data-parallel allreduce algorithm asked for."""
    cp_hops: tuple = ()
    """Stage j -> every rank's hop to the next rank of its CP ring (`symmetry_check.cp_hop_pairs`)."""
    private_links: bool = False
    """Copies on separate nodes of a fabric with node-private links
    (`symmetry_check.replicas_on_separate_nodes`): replica 0's links carry only its own copy."""
    ep: int = 1
    """Expert-parallel degree e: EP groups are e consecutive replicas, expert copies every e-th."""
    shard: int = 0
    """ZeRO-3 hybrid_shard's s < d: shard groups are s consecutive replicas, replica groups every s-th
    (0: no such groups)."""
    _shared: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, config, rank_to_device: tuple[int, ...], private_links: bool = False) -> "Symmetry":
        p, t, d = config.pp, config.tp, config.dp
        tp_groups = tuple(tuple(config.device_of(0, j, i) for i in range(t)) for j in range(p))
        dp_groups = tuple(tuple(tuple(config.device_of(e, j, i) for e in range(d)) for i in range(t))
                          for j in range(p))
        cp_hops = tuple(cp_hop_pairs(config, j) for j in range(p)) if config.cp > 1 else ()
        shard = shard_degree(config) if replicated(config) else 0
        return cls(d, tp_groups, dp_groups, rank_to_device, p, config.collective, cp_hops, private_links, config.ep,
                   shard)

    def device_groups(self, action) -> tuple[tuple[tuple[int, ...], ...], int]:
        """(device groups, tier-byte weight) of a representative's collective: its TP group; with
        expert parallelism (`simulator.strategies.experts`), every EP group's all-to-all of its
        stage or every expert-data-parallel group's collective; under hybrid_shard every shard
        group's gather or reduce-scatter, or every replica group's allreduce; else the stage's rings."""
        stage = action.ranks[0] % self.num_stages
        if action.key[0] == "tp":
            return (self.tp_groups[stage],), self.num_replicas
        if action.key[0] == "ep":
            return self.blocks(stage, self.ep), 1
        if action.key[0].startswith("expert_"):
            return self.strides(stage, self.ep), 1
        if self.shard and action.key[0] in (GATHER_KEY, REDUCE_KEY):
            return self.blocks(stage, self.shard), 1
        if self.shard and action.key[0] == HYBRID_ALLREDUCE_KEY:
            return self.strides(stage, self.shard), 1
        return self.dp_groups[stage], 1

    def blocks(self, stage: int, size: int) -> tuple[tuple[int, ...], ...]:
        """Every group of `size` consecutive replicas of `stage` (EP groups, hybrid shard groups), each
        TP rank's apart."""
        return tuple(ring[first:first + size] for ring in self.dp_groups[stage] for first in range(0, len(ring), size))

    def strides(self, stage: int, size: int) -> tuple[tuple[int, ...], ...]:
        """Every group of the replicas `size` apart of `stage` (expert copies, hybrid replica groups),
        each TP rank's apart."""
        return tuple(ring[r::size] for ring in self.dp_groups[stage] for r in range(size))

    def _kept_whole(self, key: str) -> bool:
        """Collectives of groups other than a stage's rings (EP, expert copies, hybrid shard and replica
        groups): every link kept, as the rings keep theirs (`_links_of_others`)."""
        return key == "ep" or key.startswith("expert_") or bool(self.shard) and key in (
            GATHER_KEY, REDUCE_KEY, HYBRID_ALLREDUCE_KEY)

    def send_pairs(self, rank: int, dst: int) -> tuple[tuple[tuple[int, int], ...], int]:
        """(device pairs, tier-byte weight) of a representative's pipeline send."""
        return tuple(zip(self.tp_groups[rank], self.tp_groups[dst])), self.num_replicas

    def send_phase(self, topology: Topology, rank: int, dst: int, size_bytes: float):
        """A representative's pipeline send: its t sub-flows, each link counted by multiplicity
        (`fold`), tier bytes x d. A send to itself is its CP ring hop
        (`simulator.strategies.context.ring_exchange`): every rank's hop of the stage at once, one
        lock-step flow as a data-parallel ring's copies are (and pruned as they are), so TP rings and
        pipeline transfers meet it on every link it crosses."""
        known = self._shared.get(("send phase", rank, dst, size_bytes))  # every engine of this layout
        if known is not None:
            return known
        if rank == dst:
            phase = self._pruned(topology, "cp", rank, (pairs_phase(topology, self.cp_hops[rank], size_bytes),))[0]
        else:
            pairs, weight = self.send_pairs(rank, dst)
            phase = self.fold(topology, ("send", rank, dst), (pairs_phase(topology, pairs, size_bytes, weight),))[0]
        self._shared["send phase", rank, dst, size_bytes] = phase
        return phase

    def fold(self, topology: Topology, key: tuple, phases: tuple) -> tuple:
        """Phases of a replica-local flow (`key`: ("tp", stage) or ("send", stage, stage)) with each link
        of the representative's routes counted by multiplicity: the sub-flows of all d replicas'
        copies crossing it. Where copies share a link each gets its fair share of it, as in the full
        run; exact when every copy meets the same loads (`simulator.symmetry_check`)."""
        multiplicity = self._shared.get(key)
        if multiplicity is None:
            multiplicity = self._shared[key] = self._multiplicity(topology, key)
        if all(multiplicity[link] == count for phase in phases for link, count in phase.usage):
            return phases
        return tuple(replace(phase, usage=tuple((link, multiplicity[link]) for link, _ in phase.usage))
                     for phase in phases)

    def _multiplicity(self, topology: Topology, key: tuple) -> Counter:
        """Sub-flows of all copies on each link; with `private_links` replica 0's copy alone (the
        only one on the links `fold` asks about)."""
        t, d = len(self.tp_groups[0]), 1 if self.private_links else self.num_replicas
        groups = [tuple(self.dp_groups[stage][i][e] for i in range(t)) for stage in key[1:]
                  for e in range(d)]  # replica e's TP group of each stage in key
        copies = ([ring_pairs(group) for group in groups] if key[0] == "tp" else
                  [tuple(zip(groups[e], groups[d + e])) for e in range(d)])
        return multiplicity_of(topology, copies)

    def prune(self, topology: Topology, action, phases: tuple) -> tuple:
        """A data-parallel collective's phases without the links no other flow of the run can cross
        but the tightest of them (most sub-flows per byte/s): exact, since a link only this flow
        crosses bounds only its own rate. The d-replica rings of a stage cross mostly such links,
        and every flow starting or ending next to them would otherwise walk them all."""
        stage = action.ranks[0] % self.num_stages
        if action.key[0] == "tp":
            return self.fold(topology, ("tp", stage), phases)
        if self._kept_whole(action.key[0]):
            return phases
        return self._pruned(topology, "dp", stage, phases)

    def _pruned(self, topology: Topology, kind: str, stage: int, phases: tuple) -> tuple:
        shared = self._shared.get((kind, stage))
        if shared is None:
            shared = self._shared[kind, stage] = self._links_of_others(topology, kind, stage)
        crossed, own = shared
        pruned = []
        for phase in phases:
            usage = self._shared.get((kind, stage, phase.usage))  # the same links at every size
            if usage is None:
                usage = self._shared[kind, stage, phase.usage] = _pruned_usage(topology, phase.usage, crossed, own)
            pruned.append(replace(phase, usage=usage))
        return tuple(pruned)

    def _links_of_others(self, topology: Topology, kind: str, stage: int) -> tuple[set[int], set[int]]:
        """(crossed, own): the links that flows other than stage `stage`'s data-parallel collectives
        (`kind` "dp") or CP ring hops ("cp") may cross are those in `crossed` and not in `own`:
        replica 0's TP rings and transfers between any two stages, and the other kind's flows and
        this kind's of the other stages (two sets shared by the stages and a small one per stage,
        not a copy of the large one per stage)."""
        if "common" not in self._shared:  # built once for all stages (p stages: O(p^2) routes, not O(p^3))
            links: Counter = Counter()
            for group in self.tp_groups:
                for a in group:
                    for b in group:
                        links.update(topology.route(a, b))
            for j, group in enumerate(self.tp_groups):
                for other in self.tp_groups[:j]:
                    for a, b in zip(group, other):
                        links.update(topology.route(a, b))
                        links.update(topology.route(b, a))
            # the EP groups' and expert copies' links, which the rings share (a hybrid shard's collectives,
            # kept whole too, are its only data-parallel ones: nothing is pruned beside them)
            for stage in range(self.num_stages) if self.ep > 1 else ():
                copies = self.strides(stage, self.ep)
                for op, groups in (("alltoall", self.blocks(stage, self.ep)), ("allreduce", copies),
                                   ("allgather", copies)):
                    algorithm = "pairwise" if op == "alltoall" else "ring"
                    links.update(link for phase in collective_phases(topology, groups, op, 1.0, algorithm)
                                 for link, _ in phase.usage)
            algorithms = sorted({"ring", choose_algorithm(topology, self.dp_groups[0][0], self.collective),
                                 gather_algorithm(topology, self.dp_groups[0][0])})  # ZeRO's gathers
            per_stage = {"dp": [{link for algorithm in algorithms
                                 for phase in collective_phases(topology, groups, "allreduce", 1.0, algorithm)
                                 for link, _ in phase.usage} for groups in self.dp_groups],
                         "cp": [{link for a, b in hops for link in topology.route(a, b)} for hops in self.cp_hops]}
            stages_on = {name: Counter(link for links_j in sets for link in links_j)  # link -> stages crossing it
                         for name, sets in per_stage.items()}
            crossed = {name: set(counts) for name, counts in stages_on.items()}
            self._shared["common"] = (set(links), per_stage, stages_on, crossed)
        common, per_stage, stages_on, crossed = self._shared["common"]
        other_kind = "cp" if kind == "dp" else "dp"
        if ("any", kind) not in self._shared:
            self._shared["any", kind] = (common | crossed[other_kind], common | crossed[other_kind] | crossed[kind])
        elsewhere, anywhere = self._shared["any", kind]
        on = stages_on[kind]
        return anywhere, {link for link in per_stage[kind][stage] if on[link] == 1 and link not in elsewhere}


def _pruned_usage(topology: Topology, usage: tuple, crossed: set[int], own: set[int]) -> tuple:
    """`usage` without the links in `own` or outside `crossed` but the tightest of them (`Symmetry.prune`)."""
    kept = [(link, count) for link, count in usage if link in crossed and link not in own]
    private = [(link, count) for link, count in usage if link not in crossed or link in own]
    if private:
        links = topology.links
        kept.append(max(private, key=lambda entry: (entry[1] / links[entry[0]].bandwidth_bytes_per_s, -entry[0])))
    return tuple(kept)


_FOLDS: WeakKeyDictionary = WeakKeyDictionary()
"""Topology -> {layout: Symmetry}: a plan compiled twice on one topology (a long pipeline's few
micro-batches, then all of them when its cycle has not settled) reuses the links worked out once."""


def symmetry_for(config, topology: Topology, rank_to_device: tuple[int, ...]) -> Symmetry:
    """`Symmetry.of` the layout on `topology`, one per topology and layout."""
    key = (config.tp, config.pp, config.dp, config.cp, config.ep, config.zero_stage, config.fsdp_sharding,
           config.placement, config.collective, rank_to_device)
    folds = _FOLDS.setdefault(topology, {})
    if key not in folds:
        if len(folds) >= 16:  # `rank` plays many layouts on one cached topology: keep the latest
            del folds[next(iter(folds))]
        folds[key] = Symmetry.of(config, rank_to_device, replicas_on_separate_nodes(config, topology))
    return folds[key]


def symmetry_decision(scenario, config, topology: Topology, costs) -> tuple[bool, str]:
    """(simulate representatives only?, why) for a megatron TensorConfig (module docstring). The
    groups a representative knows are TP groups and one data-parallel group per stage, and its
    flows are priced on the topology: other groups, or a profile's per-rank prices, need every rank."""
    if config.symmetry == "off":
        return False, "strategy.symmetry is off"
    if scenario.cluster.heterogeneous:
        return False, "heterogeneous cluster (mixed GPUs, stragglers or degraded links) breaks the symmetry"
    if config.dp == 1 and config.tp == 1:
        return False, "nothing to fold: one replica, one TP rank per stage"
    unlike = cached_fold_refusal(scenario.cluster, config, topology)
    if unlike:
        return False, unlike
    if costs.communication is not None:  # a calibration profile: priced per rank, not per flow
        return False, ("a calibration profile prices each collective by its ranks and shares the host's "
                       "processors among them: a lone representative would be priced alone")
    return True, (f"the {config.pp} stage ranks each stand for their {config.dp} x {config.tp} copies" if config.pp > 1
                  else f"the one stage rank stands for its {config.dp} x {config.tp} copies")




def expand_summary(summary: dict, rank_to_device: tuple[int, ...], num_stages: int, topology: Topology) -> None:
    """Per-device rows of every rank (rank = pipeline x num_stages + stage) from the representatives'
    rows, one per stage (in place): a symmetric megatron run's, or a folded data-parallel run's
    (`simulator.grid_symmetry`, one stage)."""
    p = num_stages
    rows = []
    for rank, device in enumerate(rank_to_device):
        pipeline, stage = divmod(rank, p)
        row = dict(summary["devices"][stage])
        row.update(rank=rank, device=device, node=topology.node_of(device), group=pipeline, stage=stage)
        rows.append(row)
    summary["devices"] = rows
    summary["num_gpus"] = len(rows)
    summary["num_groups"] = len(rows) // p
