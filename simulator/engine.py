"""The discrete-event engine (the only module that imports simpy): plays a plan on a topology.

Per rank there is a compute stream (Compute actions in order) and a comm stream (Collectives in
order; one with `cycle_s` > 0, issued by a background thread that wakes every cycle_s, starts at
its next multiple of cycle_s: `simulator.strategies.fusion`); sends run as soon as their
dependencies are done. All data movement goes through one flow-level network
(`simulator.network.FlowNetwork`): each active flow is a phase of lock-step sub-flows, links are
shared max-min fairly (progressive filling), and rates are recomputed whenever a flow starts or
ends (a fluid model as in SimGrid's, Velho et al., TOMACS 2013).

The engine knows devices, streams, links and flows, nothing of any particular machine. Two
optional parts of the cost model (`simulator.costs.CostModel`) change how it plays work:
`communication` (a calibrated profile's measured point-to-point and collective times, which
already hold the contention of the machine they were measured on, in place of the flow model) and
`shared_processors` (ranks that share a host's processors, or a GPU's SMs with NCCL's kernels:
every rank's work is a thread on that pool, and collectives played on the flow network hold their
threads there while they run, `simulator.host_sharing`). The engine appends immutable span tuples;
everything else is analysis of the span table (`simulator.records`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import simpy

from simulator.collectives import choose_algorithm, collective_label, collective_phases, pairs_phase
from simulator.costs import WEIGHT_PASS_WORDS, CostModel
from simulator.errors import SimulationError
from simulator.heterogeneity import DeviceCosts
from simulator.host_sharing import COLLECTIVE, COMPUTE, P2P, HostPool
from simulator.network import FlowNetwork
from simulator.plan import OPTIMIZER, Collective, Compute, Plan, Recv, Send, message_links
from simulator.sparse import SELECTION_PHASE
from simulator.topology import Topology

SPAN_FIELDS = ("rank", "stream", "name", "kind", "start_s", "end_s", "size_bytes", "microbatch")


@dataclass
class EngineResult:
    spans: list[tuple]
    """Tuples in SPAN_FIELDS order."""
    tier_bytes: dict[str, float]
    num_events: int
    collective_algorithms: dict[str, int]


class _CountingEnvironment(simpy.Environment):
    def __init__(self):
        super().__init__()
        self.num_events = 0

    def step(self):
        self.num_events += 1
        super().step()


class Engine:
    """Plays one step of a plan; `run()` returns the span records."""

    def __init__(self, plan: Plan, topology: Topology, costs: CostModel, num_parameter_servers: int = 1):
        self.plan = plan
        self.topology = topology
        self.costs = costs
        self.num_parameter_servers = num_parameter_servers
        self.env = _CountingEnvironment()
        self.network = FlowNetwork(self.env, [link.bandwidth_bytes_per_s for link in topology.links])
        self.communication = costs.communication
        self.hosts: HostPool | None = None
        if costs.shared_processors is not None:
            self.hosts = HostPool.for_topology(self.env, costs.shared_processors, topology)
        device_costs = DeviceCosts(costs, topology)
        self._rank_costs = [device_costs.model_of(device) for device in plan.rank_to_device]
        # G > 1 replicas of a stage average the reduced gradients before the update (megatron plans
        # count TP x DP pipelines as groups, and ZeRO shards the update: not charged there)
        self._averages_gradients = plan.num_groups > 1 and "tensor" not in plan.meta
        self.spans: list[tuple] = []
        self.tier_bytes: dict[str, float] = defaultdict(float)
        self.algorithms: dict[str, int] = defaultdict(int)
        self._done = [{a.id: self.env.event() for a in actions} for actions in plan.actions]
        self._arrivals: dict[tuple, simpy.Event] = {}
        self._rendezvous: dict[tuple, list] = {}
        self._duration_cache: dict[tuple, float] = {}
        self._phase_cache: dict[tuple, tuple] = {}
        self._send_overhead_s, self._receive_overhead_s = (
            self.communication.message_overheads_s if self.communication is not None else (0.0, 0.0))
        self._messages = [message_links(actions, self._receive_overhead_s > 0, self._send_overhead_s > 0)
                          for actions in plan.actions]
        """Per rank: the receives each compute action consumes and the sends it feeds (LogP's o)."""
        self._symmetry = plan.meta.get("symmetry")
        """Symmetric runs (simulator.symmetry): the device groups each representative's flows stand for."""

    def run(self) -> EngineResult:
        self._register_receives()
        for rank, actions in enumerate(self.plan.actions):
            compute = [a for a in actions if isinstance(a, Compute)]
            collectives = [a for a in actions if isinstance(a, Collective) and a.key[0] != "tp"]
            tensor = [a for a in actions if isinstance(a, Collective) and a.key[0] == "tp"]
            if compute:
                self.env.process(self._compute_stream(rank, compute))
            for stream in (collectives, tensor):  # TP collectives: their own stream (communicator)
                if stream:
                    self.env.process(self._comm_stream(rank, stream))
            for send in (a for a in actions if isinstance(a, Send)):
                self.env.process(self._send(rank, send))
        self.env.run()
        self._check_finished()
        return EngineResult(self.spans, dict(self.tier_bytes), self.env.num_events, dict(self.algorithms))

    # ------------------------------------------------------------------ streams
    def _wait(self, rank: int, deps: tuple[int, ...]):
        done = self._done[rank]
        for dep in deps:
            event = done[dep]
            if not event.processed:
                yield event

    def _compute_stream(self, rank: int, actions: list[Compute]):
        receives, sends = self._messages[rank]
        for action in actions:
            yield from self._wait(rank, action.deps)
            yield from self._rank_work(rank, len(receives.get(action.id, ())) * self._receive_overhead_s)
            start = self.env.now
            yield from self._rank_work(rank, self._duration_s(action, rank))
            self.spans.append((rank, "compute", action.label, action.phase, start, self.env.now, 0.0,
                               action.microbatch))
            yield from self._rank_work(rank, sends.get(action.id, 0) * self._send_overhead_s)
            self._done[rank][action.id].succeed()

    def _rank_work(self, rank: int, seconds: float):
        """`seconds` of the rank's own thread (on its host's processors when they are shared)."""
        if seconds <= 0:
            return
        if self.hosts is None:
            yield self.env.timeout(seconds)
        else:
            yield self._host_job(seconds, (rank,), 1, COMPUTE)

    def _comm_stream(self, rank: int, actions: list[Collective]):
        for action in actions:
            yield from self._wait(rank, action.deps)
            cycle_s = getattr(action, "cycle_s", 0.0)  # fused by a background thread: its next tick
            if cycle_s > 0:
                yield self.env.timeout(max(math.ceil(self.env.now / cycle_s - 1e-9) * cycle_s - self.env.now, 0.0))
            if len(action.ranks) == 1:  # alone (a symmetric run's representative): nobody to wait for
                yield from self._collective(action, None)
            else:
                entry = self._rendezvous.setdefault(action.key, [0, self.env.event()])
                entry[0] += 1
                if entry[0] == len(action.ranks):
                    self.env.process(self._collective(action, entry[1]))
                yield entry[1]
            self._done[rank][action.id].succeed()

    def _collective(self, action: Collective, finished: simpy.Event | None):
        devices = tuple(self.plan.rank_to_device[r] for r in action.ranks)
        start = self.env.now
        if self.communication is not None:  # measured on the machine (a calibration profile)
            self.algorithms["measured"] += 1
            self._count_bytes(self._phases(devices, action, count=False))
            duration_s = self.communication.collective_s(action.op, action.size_bytes, len(action.ranks))
            if self.hosts is not None:
                yield self._host_job(duration_s, action.ranks, len(action.ranks), COLLECTIVE)
            else:
                yield self.env.timeout(duration_s)
        else:
            held = self.hosts.hold(COLLECTIVE, self._host_threads(action.ranks)) if self.hosts else None
            for phase in self._phases(devices, action):
                yield from self._play(phase)
            if held is not None:
                self.hosts.release(held)
        for rank in action.ranks:
            self.spans.append((rank, "comm", action.label, action.op, start, self.env.now,
                               action.size_bytes, -1))
        if finished is not None:
            finished.succeed()

    def _count_bytes(self, phases) -> None:
        """The bytes a measured transfer moved per tier: the flow model's phases, not played."""
        for phase in phases:
            for tier, size in phase.tier_bytes:
                self.tier_bytes[tier] += size

    def _phases(self, devices: tuple[int, ...], action: Collective, count: bool = True) -> tuple:
        groups, weight = (devices,), 1
        if self._symmetry is not None:
            groups, weight = self._symmetry.device_groups(action)
        if action.op == "allreduce":
            algorithm = choose_algorithm(self.topology, groups[0], action.algorithm)
        else:  # allgather (sparse top-k, ZeRO-1 parameters, sequence parallelism), reduce_scatter: rings
            algorithm = f"ring_{action.op}"
        cache_key = (groups, action.op, action.size_bytes, algorithm, action.repeat, weight)
        phases = self._phase_cache.get(cache_key)
        if phases is None:
            phases = collective_phases(self.topology, groups, action.op, action.size_bytes, algorithm,
                                       self.num_parameter_servers, action.repeat, weight)
            if self._symmetry is not None:
                phases = self._symmetry.prune(self.topology, action, phases)
            self._phase_cache[cache_key] = phases
        if count:
            self.algorithms[collective_label(algorithm, phases)] += 1
        return phases

    def _send_phase(self, rank: int, action: Send, source: int, target: int):
        pairs, weight = ((source, target),), 1
        if self._symmetry is not None:
            pairs, weight = self._symmetry.send_pairs(rank, action.dst)
        cache_key = (pairs, action.size_bytes, weight)
        phase = self._phase_cache.get(cache_key)
        if phase is None:
            phase = self._phase_cache[cache_key] = pairs_phase(self.topology, pairs, action.size_bytes, weight)
        return phase

    def _send(self, rank: int, action: Send):
        yield from self._wait(rank, action.deps)
        start = self.env.now
        source, target = self.plan.rank_to_device[rank], self.plan.rank_to_device[action.dst]
        if self.communication is None:
            yield from self._play(self._send_phase(rank, action, source, target))
        else:
            self._count_bytes((self._send_phase(rank, action, source, target),))
            if self.hosts is not None:
                yield self._host_job(self.communication.p2p_s(action.size_bytes), (rank, action.dst), 2, P2P)
            else:
                yield self.env.timeout(self.communication.p2p_s(action.size_bytes))
        self.spans.append((rank, "send", action.label, "send", start, self.env.now, action.size_bytes,
                           action.key[-1] if isinstance(action.key[-1], int) else -1))
        self._done[rank][action.id].succeed()
        arrival = self._arrivals.get(action.key)
        if arrival is None:
            raise SimulationError(f"rank {rank}: send {action.key} to rank {action.dst} has no matching receive")
        if self.hosts is not None and self.hosts.wakeup_s > 0 and self.hosts.computing(self.hosts.host_of(target)):
            yield self.env.timeout(self.hosts.wakeup_s)  # the receiver waits for a processor
        arrival.succeed()

    def _play(self, phase):
        if phase.latency_s > 0:
            yield self.env.timeout(phase.latency_s)
        yield self.network.transfer(phase.bytes_per_subflow, phase.usage)
        for tier, size in phase.tier_bytes:
            self.tier_bytes[tier] += size

    def _host_job(self, measured_s: float, ranks, ranks_when_measured: int, kind: str) -> simpy.Event:
        """A job of threads on shared processors (`simulator.host_sharing`): each participating
        rank is one thread of its host. A job measured at `measured_s` while `ranks_when_measured`
        threads of its class were busy holds min(1, P / k) x measured_s seconds of work at rate 1
        (processor sharing, Kleinrock 1976)."""
        work_s = measured_s * min(1.0, self.hosts.parallelism / ranks_when_measured)
        return self.hosts.run(work_s, kind, self._host_threads(ranks))

    def _host_threads(self, ranks) -> tuple[tuple[int, int], ...]:
        """((host, threads), ...): one thread per rank on its device's host."""
        per_host: dict[int, int] = defaultdict(int)
        for rank in ranks:
            per_host[self.hosts.host_of(self.plan.rank_to_device[rank])] += 1
        return tuple(sorted(per_host.items()))

    # ------------------------------------------------------------------ bookkeeping
    def _register_receives(self) -> None:
        for rank, actions in enumerate(self.plan.actions):
            for action in actions:
                if isinstance(action, Recv):
                    self._arrivals[action.key] = self._done[rank][action.id]

    def _duration_s(self, action: Compute, rank: int = 0) -> float:
        costs = self._rank_costs[rank]  # this rank's GPU type and straggler slowdown (simulator.heterogeneity)
        if action.phase == OPTIMIZER:
            layers = (action.layer_start, action.layer_end)  # per-layer costs where the profile has them
            average_s = (costs.weight_pass_s("average", action.num_params, layers=layers)
                         if self._averages_gradients else 0.0)
            return costs.optimizer_s(action.num_params, layers=layers) + average_s
        if action.phase in WEIGHT_PASS_WORDS:  # asynchronous pipelines' stash / predict / accumulate
            return costs.weight_pass_s(action.phase, action.num_params, layers=(action.layer_start, action.layer_end))
        if action.phase == SELECTION_PHASE:  # top-k selection over num_params gradient elements (simulator.sparse)
            return costs.topk_s(action.num_params, self.plan.meta["topk"]["density"])
        key = (id(costs), action.phase, action.layer_start, action.layer_end, action.batch)
        duration = self._duration_cache.get(key)
        if duration is None:
            duration = self._duration_cache[key] = sum(
                costs.compute_s(layer, action.phase, action.batch) for layer in range(action.layer_start, action.layer_end))
        return duration

    def _check_finished(self) -> None:
        for rank, done in enumerate(self._done):
            for action in self.plan.actions[rank]:
                if not done[action.id].triggered:
                    raise SimulationError(
                        f"rank {rank}: action {action.id} ({getattr(action, 'label', action)}) never ran: "
                        "the plan deadlocks or waits for a message nobody sends")
