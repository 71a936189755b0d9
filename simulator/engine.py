"""The discrete-event engine (the only module that imports simpy): plays a plan on a topology.

Per rank there is a compute stream (Compute actions in order) and a comm stream (Collectives in
order); sends run as soon as their dependencies are done. All data movement goes through one
flow-level network (`simulator.network.FlowNetwork`): each active flow is a phase of lock-step
sub-flows, links are shared max-min fairly (progressive filling), and rates are recomputed whenever
a flow starts or ends (a fluid model as in SimGrid's, Velho et al., TOMACS 2013). A calibrated cost
model (`simulator.profile_costs.ProfileCosts`) that measures communication itself (`allreduce_s`,
`allgather_s`, `p2p_s`) replaces the flow model for those actions: its fits already contain the
contention of the machine they were measured on. The engine appends immutable span tuples;
everything else is analysis of the span table (`simulator.records`).

A cost model with a `cold_start` section (`simulator.cold_start`) makes a pass slower the longer the
rank has not run its layers: `simulator.layer_ages` keeps each rank's layer ages and hands them
to the model when the pass starts.

On a calibrated shared host (`ProfileCosts.streamed_allreduce_factor`), an allreduce that every
participant had ready while its previous collective still ran (a stream of asynchronous bucket
allreduces) takes the profile's fit times that factor: gloo runs such allreduces on several worker
threads at once, so their latencies overlap (`validator.overlap_bench` times the stream).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import simpy

from simulator.collectives import choose_algorithm, collective_phases, pairs_phase
from simulator.copy_backward import copy_ages
from simulator.costs import WEIGHT_PASS_WORDS, CostModel
from simulator.errors import SimulationError
from simulator.heterogeneity import DeviceCosts
from simulator.host_sharing import COLLECTIVE, COMPUTE, P2P, HostPool
from simulator.layer_ages import LayerAges
from simulator.network import FlowNetwork
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan, Recv, Send, message_links
from simulator.sparse import SELECTION_PHASE
from simulator.stage_loop import stage_loop_factor
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
        self.host_parallelism = getattr(costs, "host_parallelism", None)
        self.hosts: HostPool | None = None
        if self.host_parallelism is not None:  # shared host processors (a calibrated CPU host)
            self.hosts = HostPool(self.env, self.host_parallelism, topology.num_nodes,
                                  getattr(costs, "interference", None), getattr(costs, "pool_curve", None),
                                  getattr(costs, "memory_contention_ranks", 2))
        device_costs = DeviceCosts(costs, topology)
        self._rank_costs = [device_costs.model_of(device) for device in plan.rank_to_device]
        # G > 1 replicas of a stage average the reduced gradients before the update (megatron plans
        # count TP x DP pipelines as groups, and ZeRO shards the update: not charged there)
        self._averages_gradients = plan.num_groups > 1 and "tensor" not in plan.meta
        self._cold = LayerAges(self._rank_costs)
        self.spans: list[tuple] = []
        self.tier_bytes: dict[str, float] = defaultdict(float)
        self.algorithms: dict[str, int] = defaultdict(int)
        self._done = [{a.id: self.env.event() for a in actions} for actions in plan.actions]
        self._arrivals: dict[tuple, simpy.Event] = {}
        self._rendezvous: dict[tuple, list] = {}
        self._duration_cache: dict[tuple, float] = {}
        self._phase_cache: dict[tuple, tuple] = {}
        self._contention_cache: dict[tuple, float] = {}
        preposted = plan.meta.get("receives") == "preposted"
        self._handoff_s = getattr(costs, "handoff_preposted_s" if preposted else "handoff_s", 0.0)
        """Waking a waiting receiver on a busy shared host (`ProfileCosts`), by how its receives are posted."""
        self._send_post_s = getattr(costs, "send_post_s", 0.0) if preposted else 0.0
        self._ready_receive_s = getattr(costs, "ready_receive_s", 0.0) if preposted else 0.0
        """The runtime's own time per message on the rank's thread (`ProfileCosts.send_post_s`, `ready_receive_s`)."""
        self._send_post_tail_s = getattr(costs, "send_post_tail_s", 0.0) if preposted else 0.0
        self._ready_receive_tail_s = getattr(costs, "ready_receive_tail_s", 0.0) if preposted else 0.0
        """Their tails (mean over median): a delay on the rank's path that uses no core."""
        cycling = getattr(costs, "asynchronous_messages", None) if self._messages_as_in_cycle(plan) else None
        if plan.meta.get("asynchronous") and getattr(costs, "runtime_messages", None) is not None:
            cycling = costs.runtime_messages  # timed in the runtime itself (`ProfileCosts.runtime_messages`)
        if preposted and cycling is not None:  # every stage computing and messaging at once
            self._handoff_s, self._send_post_s, self._send_post_tail_s = (
                cycling.handoff_s, cycling.send_post_s, cycling.send_post_tail_s)
            self._ready_receive_s, self._ready_receive_tail_s = cycling.ready_receive_s, cycling.ready_receive_tail_s
        self._compute_factor = (getattr(costs, "asynchronous_compute_factor", 1.0)
                                if plan.meta.get("asynchronous") and self.host_parallelism is not None else 1.0)
        """Compute work of an asynchronous plan on a shared host over the pool's (`simulator.cycle_compute`),
        times its weight mode's stage loop factor where the profile timed one (`simulator.stage_loop`)."""
        self._compute_factor *= stage_loop_factor(plan, getattr(costs, "stage_loops", {}))
        self._backward_factor = (getattr(costs, "asynchronous_backward_factor", 1.0)
                                 if plan.meta.get("asynchronous") else 1.0)
        """An asynchronous plan's backward on a weight copy over the modules' (`simulator.copy_backward`)."""
        self._aged_backward_factors = self._copy_age_factors(plan, getattr(costs, "copy_backward", None))
        """Per rank, backward id -> the factor at its copy's age, where the profile timed the copy's growth."""
        self._messages = [message_links(actions, self._ready_receive_s + self._ready_receive_tail_s > 0,
                                        self._send_post_s + self._send_post_tail_s > 0)
                          for actions in plan.actions]
        self._symmetry = plan.meta.get("symmetry")
        """Symmetric runs (simulator.symmetry): the device groups each representative's flows stand for."""

    @staticmethod
    def _copy_age_factors(plan: Plan, section) -> list[dict[int, float]]:
        """An asynchronous plan's backwards at their copies' ages (`simulator.copy_backward.copy_ages`,
        `CopyBackward.at_age`); empty where the plan is synchronous or the profile timed no growth."""
        if not plan.meta.get("asynchronous") or section is None or not section.copy_age_factors:
            return [{} for _ in plan.actions]
        return [{action_id: section.at_age(age) for action_id, age in copy_ages(actions).items()}
                for actions in plan.actions]

    def _messages_as_in_cycle(self, plan: Plan) -> bool:
        """Whether a message costs what `handoff.cycle` measured (`ProfileCosts.asynchronous_messages`)
        rather than the chain's figures: in asynchronous plans, and on a shared host in synchronous
        plans whose ranks interleave forwards and backwards (1F1B, interleaved 1F1B; not GPipe).

        Why the latter: in a 2-stage 1F1B ResNet-20 run on the 2-core host (2026-11-24, `ghpsim
        validate --step-spans`) stage 0's isend calls averaged 0.44 ms (median 0.05 ms, a heavy tail)
        as in PipeDream's (0.53 ms) and the cycle's (0.33 ms), against the chain's 0.09 ms. Three
        committed CPU pipeline runs re-predicted: the largest within-profile error (levels removed)
        fell from 34.4 / 22.3 / 19.5 % to 27.9 / 18.3 / 16.3 %. The committed GPU runs (own cores per
        rank) got worse with it (pipelines MAPE 9.8 -> 11.3 %), so it holds on shared hosts only."""
        if plan.meta.get("asynchronous"):
            return True
        return self.host_parallelism is not None and bool(plan.meta.get("interleaves_passes"))

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
        delay_s = self.topology.start_delays_s.get(self.plan.rank_to_device[rank], 0.0)
        if delay_s > 0:  # this rank leaves the step's starting barrier late
            yield self.env.timeout(delay_s)
        receives, sends = self._messages[rank]
        exit_delay_s = self.topology.exit_delays_s.get(self.plan.rank_to_device[rank], 0.0)
        collective_ids = ({a.id for a in self.plan.actions[rank] if isinstance(a, Collective)}
                          if exit_delay_s > 0 else frozenset())
        for action in actions:
            arrived = sum(1 for dep in receives.get(action.id, ()) if self._done[rank][dep].triggered)
            waits_for_collective = bool(collective_ids) and any(
                dep in collective_ids and not self._done[rank][dep].processed for dep in action.deps)
            yield from self._wait(rank, action.deps)
            if waits_for_collective:  # woken from the collective late (simulator.pass_jitter)
                yield self.env.timeout(exit_delay_s)
            if arrived:
                yield from self._message_work(rank, arrived, self._ready_receive_s, self._ready_receive_tail_s)
            start = self.env.now
            duration_s = self._duration_s(action, rank) * self._cold.factor(action, rank, start) * self._compute_factor
            if action.phase == BACKWARD:
                duration_s *= self._aged_backward_factors[rank].get(action.id, self._backward_factor)
            contention = self._memory_contention(action)
            yield from self._rank_work(rank, duration_s if contention is None else duration_s / contention, contention)
            if self._cold.tracks(rank):
                self._cold.ran(action, rank, self.env.now)
            self.spans.append((rank, "compute", action.label, action.phase, start, self.env.now, 0.0,
                               action.microbatch))
            if sends.get(action.id):
                yield from self._message_work(rank, sends[action.id], self._send_post_s, self._send_post_tail_s)
            self._done[rank][action.id].succeed()

    def _message_work(self, rank: int, messages: int, work_s: float, tail_s: float):
        """The runtime's own time on `messages` messages: the median `work_s` each on the rank's
        thread, then the tail (mean over median) each as a delay that uses no core."""
        yield from self._rank_work(rank, messages * work_s)
        if tail_s > 0:
            yield self.env.timeout(messages * tail_s)

    def _rank_work(self, rank: int, seconds: float, memory_contention: float | None = None):
        """`seconds` of the rank's own thread (played on its host's cores when they are shared;
        `memory_contention`: a memory-bound pass's slowdown while other ranks run theirs)."""
        if self.host_parallelism is None:
            yield self.env.timeout(seconds)
        else:
            yield self._host_job(seconds, [rank], 1, COMPUTE, memory_contention)

    def _memory_contention(self, action: Compute) -> float | None:
        """On a shared host, an update's or weight pass's slowdown s while the host's other ranks run
        theirs (`ProfileCosts.memory_contention`); None for other passes, elsewhere, or cost models
        without it. The engine plays the action's whole duration / s as work (its cold-start factor
        and, with G > 1 replicas, the update's averaging included), and the pool slows it back by up
        to s (`simulator.host_sharing`)."""
        contention = getattr(self.costs, "memory_contention", None)
        if self.hosts is None or contention is None or not (
                action.phase == OPTIMIZER or action.phase in WEIGHT_PASS_WORDS):
            return None
        key = (action.phase, action.layer_start, action.layer_end, action.num_params)
        value = self._contention_cache.get(key)
        if value is None:
            value = self._contention_cache[key] = contention(action.phase, action.num_params,
                                                             (action.layer_start, action.layer_end))
        return value

    def _comm_stream(self, rank: int, actions: list[Collective]):
        for position, action in enumerate(actions):
            previous_end_s = self.env.now
            yield from self._wait(rank, action.deps)
            # queued: ready while this rank's previous collective still ran (an asynchronous
            # stream of them, as a bucketed allreduce after the backward's first buckets)
            queued = position > 0 and self.env.now == previous_end_s
            if len(action.ranks) == 1:  # alone (a symmetric run's representative): nobody to wait for
                yield from self._collective(action, None, queued)
            else:
                entry = self._rendezvous.setdefault(action.key, [0, self.env.event(), True])
                entry[0] += 1
                entry[2] = entry[2] and queued
                if entry[0] == len(action.ranks):
                    self.env.process(self._collective(action, entry[1], entry[2]))
                yield entry[1]
            self._done[rank][action.id].succeed()

    def _collective(self, action: Collective, finished: simpy.Event | None, queued: bool = False):
        devices = tuple(self.plan.rank_to_device[r] for r in action.ranks)
        start = self.env.now
        measured = getattr(self.costs, "allreduce_s", None)
        if measured is not None and action.op == "allgather":  # top-k values + indices: its own fit
            measured = self.costs.allgather_s
        if measured is not None:
            self.algorithms["measured"] += 1
            duration_s = measured(action.size_bytes, len(action.ranks))
            if queued and action.op == "allreduce":  # overlapping its predecessor (calibrated hosts)
                duration_s *= getattr(self.costs, "streamed_allreduce_factor", 1.0)
            if self.host_parallelism is not None:
                yield self._host_job(duration_s, action.ranks, len(action.ranks), COLLECTIVE)
            else:
                yield self.env.timeout(duration_s)
        else:
            for phase in self._phases(devices, action):
                yield from self._play(phase)
        for rank in action.ranks:
            self.spans.append((rank, "comm", action.label, action.op, start, self.env.now,
                               action.size_bytes, -1))
        if finished is not None:
            finished.succeed()

    def _phases(self, devices: tuple[int, ...], action: Collective) -> tuple:
        groups, weight = (devices,), 1
        if self._symmetry is not None:
            groups, weight = self._symmetry.device_groups(action)
        if action.op == "allreduce":
            algorithm = choose_algorithm(self.topology, groups[0], action.algorithm)
        else:  # allgather (sparse top-k, ZeRO-1 parameters, sequence parallelism), reduce_scatter: rings
            algorithm = f"ring_{action.op}"
        self.algorithms[algorithm] += 1
        cache_key = (groups, action.op, action.size_bytes, algorithm, action.repeat, weight)
        phases = self._phase_cache.get(cache_key)
        if phases is None:
            phases = collective_phases(self.topology, groups, action.op, action.size_bytes, algorithm,
                                       self.num_parameter_servers, action.repeat, weight)
            if self._symmetry is not None:
                phases = self._symmetry.prune(self.topology, action, phases)
            self._phase_cache[cache_key] = phases
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
        measured = getattr(self.costs, "p2p_s", None)
        if measured is not None and self.host_parallelism is not None:
            yield self._host_job(measured(action.size_bytes), (rank, action.dst), 2, P2P)
        elif measured is not None:
            yield self.env.timeout(measured(action.size_bytes))
        else:
            yield from self._play(self._send_phase(rank, action, source, target))
        self.spans.append((rank, "send", action.label, "send", start, self.env.now, action.size_bytes,
                           action.key[-1] if isinstance(action.key[-1], int) else -1))
        self._done[rank][action.id].succeed()
        arrival = self._arrivals.get(action.key)
        if arrival is None:
            raise SimulationError(f"rank {rank}: send {action.key} to rank {action.dst} has no matching receive")
        if self._handoff_s > 0 and self._host_busy(action.dst):
            yield self.env.timeout(self._handoff_s)
        arrival.succeed()

    def _host_busy(self, rank: int) -> bool:
        """Whether any rank of `rank`'s host computes now. The handoff delay (`ProfileCosts.handoff_s`)
        was measured with neighbours computing (`validator.handoff_bench`), the point-to-point fit
        with every other rank idle (`validator.comm_bench.time_p2p`): an arrival while no rank of
        the host computes wakes its receiver as in the ping-pong, with no handoff delay."""
        if self.hosts is None:
            return True
        return self.hosts.active_threads(self.topology.node_of(self.plan.rank_to_device[rank]), COMPUTE) > 0

    def _play(self, phase):
        if phase.latency_s > 0:
            yield self.env.timeout(phase.latency_s)
        yield self.network.transfer(phase.bytes_per_subflow, phase.usage)
        for tier, size in phase.tier_bytes:
            self.tier_bytes[tier] += size

    def _host_job(self, measured_s: float, ranks, ranks_when_measured: int, kind: str,
                  memory_contention: float | None = None) -> simpy.Event:
        """A job of threads on calibrated hosts (processes on shared cores, e.g. gloo on a CPU;
        `simulator.host_sharing`): each participating rank is one thread of its node. A job measured
        at `measured_s` while `ranks_when_measured` threads of its class were busy holds
        min(1, P / k) x measured_s seconds of work at rate 1 (processor sharing, Kleinrock 1976).
        """
        work_s = measured_s * min(1.0, self.host_parallelism / ranks_when_measured)
        per_host: dict[int, int] = defaultdict(int)
        for rank in ranks:
            per_host[self.topology.node_of(self.plan.rank_to_device[rank])] += 1
        return self.hosts.run(work_s, kind, tuple(sorted(per_host.items())), memory_contention)

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
        key = (id(costs), action.phase, action.layer_start, action.layer_end, action.batch, action.num_params)
        duration = self._duration_cache.get(key)
        if duration is None:
            duration = sum(costs.compute_s(layer, action.phase, action.batch)
                           for layer in range(action.layer_start, action.layer_end))
            if action.phase == FORWARD and action.num_params > 0:  # a forward on a weight copy
                copy_forward_s = getattr(costs, "copy_forward_s", None)
                duration += (copy_forward_s(action.num_params, layers=(action.layer_start, action.layer_end))
                             if copy_forward_s is not None else 0.0)
            self._duration_cache[key] = duration
        return duration

    def _check_finished(self) -> None:
        for rank, done in enumerate(self._done):
            for action in self.plan.actions[rank]:
                if not done[action.id].triggered:
                    raise SimulationError(
                        f"rank {rank}: action {action.id} ({getattr(action, 'label', action)}) never ran: "
                        "the plan deadlocks or waits for a message nobody sends")
