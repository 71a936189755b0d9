"""The discrete-event engine (the only module that imports simpy): plays a plan on a topology.

Per rank there is a compute stream (Compute actions in order) and a comm stream (Collectives in
order; one with `cycle_s` > 0, issued by a background thread that wakes every cycle_s, starts at
the first multiple of cycle_s after its dependencies are done, or behind the stream's previous
collective: `simulator.strategies.fusion`); sends run as soon as their dependencies are done. All data movement goes through one flow-level network
(`simulator.network.FlowNetwork`): each active flow is a phase of lock-step sub-flows, links are
shared max-min fairly (progressive filling), and rates are recomputed whenever a flow starts or
ends (a fluid model as in SimGrid's, Velho et al., TOMACS 2013).

The engine knows devices, streams, links and flows, nothing of any particular machine. Two optional
parts of the cost model (`simulator.costs.CostModel`) change how it plays work: `communication` (a
calibrated profile's measured point-to-point and collective times, which already hold the contention
of the machine they were measured on, in place of the flow model) and `shared_processors` (ranks
that share a host's processors, or a GPU's SMs with NCCL's kernels: every rank's work is a thread on
that pool, and collectives played on the flow network hold their threads there while they run,
`simulator.host_sharing`). A pass with a host time (`ActionDurations.parts`: the kernel model's
kernels x host time per kernel) is issued by its rank's asynchronous host right after the previous
pass's kernels, from the step's start, never waiting for the device, except for a received input
(Megatron-LM synchronizes the device after each point-to-point exchange, `p2p_communication.py`):
the pass ends no earlier than its last kernel is issued, and a host that ran ahead during long
device work costs nothing. The engine appends immutable span tuples; the rest is analysis of the
span table (`simulator.records`).

Lean: streams and sends are continuations, not SimPy processes; an action's completion is a flag, and
only an action somebody waits for gets waiters (no event per action up front). SimPy holds what
advances time (timeouts, flow and host timers); work ready at this instant runs from a queue. Every
flow phase is built once before the run, its links merged where no flow of the run tells them apart
(`simulator.network.merged_usages`: the same rates with fewer links to walk).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import replace

import simpy

from simulator.action_durations import ActionDurations
from simulator.collectives import choose_algorithm, collective_label, collective_phases, gather_algorithm, pairs_phase
from simulator.costs import CostModel
from simulator.errors import SimulationError
from simulator.host_sharing import COLLECTIVE, COMPUTE, P2P, HostPool
from simulator.network import FlowNetwork, merge_phase_links
from simulator.plan import Collective, Compute, Plan, Recv, Send, message_links, stream_actions
from simulator.spans import EngineResult
from simulator.topology import Topology

class _Stream:
    """A rank's compute or comm stream: its actions in order and the next one's position."""

    __slots__ = ("rank", "actions", "position")

    def __init__(self, rank: int, actions: list):
        self.rank, self.actions, self.position = rank, actions, 0


class Engine:
    """Plays one step of a plan; `run()` returns the span records."""

    def __init__(self, plan: Plan, topology: Topology, costs: CostModel, num_parameter_servers: int = 1):
        self.plan = plan
        self.topology = topology
        self.costs = costs
        self.num_parameter_servers = num_parameter_servers
        self.env = simpy.Environment()
        self.network = FlowNetwork(self.env, [link.bandwidth_bytes_per_s for link in topology.links])
        self.communication = costs.communication
        self._durations = ActionDurations(plan, topology, costs)
        self.hosts: HostPool | None = None
        if costs.shared_processors is not None:
            self.hosts = HostPool.for_topology(self.env, costs.shared_processors, topology,
                                               self._durations.device_processors())
        self._issued_s = [0.0] * len(plan.actions)  # per rank: when its host has issued its passes so far
        self.spans: list[tuple] = []
        self.tier_bytes: dict[str, float] = defaultdict(float)
        self.algorithms: dict[str, int] = defaultdict(int)
        self.count_log: list[tuple] | None = None  # a list: (time, is bytes, key, amount) of each count
        self._finished = [bytearray(len(actions)) for actions in plan.actions]
        self._position = [None if all(a.id == i for i, a in enumerate(actions)) else
                          {a.id: i for i, a in enumerate(actions)} for actions in plan.actions]
        """Per rank: action id -> position, None where ids are positions (every compiled plan)."""
        self._waiters: dict[tuple[int, int], list] = {}
        self._ready: deque = deque()
        self._num_completions = 0
        self._arrivals: dict[tuple, tuple[int, int]] = {}
        self._rendezvous: dict[tuple, list] = {}
        self._ready_at: dict[tuple[int, int], float] = {}  # (rank, id) of a collective with cycle_s -> deps done
        self._phase_cache: dict[tuple, tuple] = {}
        self._phase_keys: dict[tuple, list] = {}
        """A collective's signature (ranks, kind, op, size, algorithm, repeat) -> [its `_phase_cache`
        key, its algorithm label (set when first counted)]."""
        self._labels: dict[int, str] = {}  # id(compute action) -> its label (ranks of a plan share actions)
        self._send_overhead_s, self._receive_overhead_s = (
            self.communication.message_overheads_s if self.communication is not None else (0.0, 0.0))
        self._messages = [message_links(actions, self._receive_overhead_s > 0, self._send_overhead_s > 0)
                          for actions in plan.actions]
        """Per rank: the receives each compute action consumes and the sends it feeds (LogP's o)."""
        self._symmetry = plan.meta.get("symmetry")
        """Symmetric runs (simulator.symmetry): the device groups each representative's flows stand for."""

    def run(self) -> EngineResult:
        self._arrivals.update((action.key, (rank, action.id)) for rank, actions in enumerate(self.plan.actions)
                              for action in actions if type(action) is Recv)
        if self.communication is None:
            self._merge_links()
        for rank, actions in enumerate(self.plan.actions):
            compute, collectives, tensor, sends = stream_actions(actions)
            self._ready.extend((self._note_ready, (rank, c)) for c in collectives if c.cycle_s > 0)  # before the stream
            self._ready.extend((next_action, (_Stream(rank, stream),)) for next_action, stream in (
                (self._compute_next, compute), (self._comm_next, collectives), (self._comm_next, tensor)) if stream)
            self._ready.extend((self._send_next, (rank, send)) for send in sends)
        self._drain()
        self.env.run()
        self._check_finished()
        num_events = next(self.env._eid) + self._num_completions  # SimPy numbers every event it schedules
        return EngineResult(self.spans, dict(self.tier_bytes), num_events, dict(self.algorithms))

    def _drain(self) -> None:
        """Run the work ready at this instant, in the order it became ready."""
        ready = self._ready
        while ready:
            function, args = ready.popleft()
            function(*args)

    def _resume(self, function, args) -> None:
        function(*args)
        self._drain()

    def _later(self, delay_s: float, function, *args) -> None:
        self.env.timeout(delay_s).callbacks.append(lambda _event: self._resume(function, args))

    def _on(self, event: simpy.Event, function, *args) -> None:
        event.callbacks.append(lambda _event: self._resume(function, args))

    def _unfinished(self, rank: int, deps: tuple[int, ...]) -> int | None:
        """The first of `deps` (action ids of `rank`) not done yet, else None."""
        finished, position = self._finished[rank], self._position[rank]
        for dep in deps:
            if not finished[dep if position is None else position[dep]]:
                return dep
        return None

    def _wait_for(self, rank: int, dep: int, function, args) -> None:
        self._waiters.setdefault((rank, dep), []).append((function, args))

    def _complete(self, rank: int, action_id: int) -> None:
        position = self._position[rank]
        self._finished[rank][action_id if position is None else position[action_id]] = 1
        self._num_completions += 1
        self._ready.extend(self._waiters.pop((rank, action_id), ()))

    def _work(self, rank: int, seconds: float, function, *args) -> None:
        """`seconds` of the rank's own thread (on its host's shared processors, if so), then `function(*args)`."""
        if seconds <= 0:
            function(*args)
        elif self.hosts is None:
            self._later(seconds, function, *args)
        else:
            self._host_job(seconds, (rank,), 1, COMPUTE, then=(function, args))

    def _compute_next(self, stream: _Stream) -> None:
        if stream.position == len(stream.actions):
            return
        rank, action = stream.rank, stream.actions[stream.position]
        dep = self._unfinished(rank, action.deps)
        if dep is not None:
            self._wait_for(rank, dep, self._compute_next, (stream,))
            return
        if self._receive_overhead_s == 0:  # no per-message host time (every GPU cost model)
            return self._compute_body(stream, action)
        self._work(rank, len(self._messages[rank][0].get(action.id, ())) * self._receive_overhead_s,
                   self._compute_body, stream, action)

    def _compute_body(self, stream: _Stream, action: Compute) -> None:
        rank, (device_s, host_s) = stream.rank, self._durations.parts(action, stream.rank)
        if host_s:  # issued after the previous pass's kernels, or after a receive (module docstring)
            actions, position = self.plan.actions[rank], self._position[rank]
            received = any(type(actions[d if position is None else position[d]]) is Recv for d in action.deps)
            self._issued_s[rank] = issued = max(self._issued_s[rank], self.env.now if received else 0.0) + host_s
            device_s = max(device_s, issued - self.env.now)
        self._work(rank, device_s, self._compute_end, stream, action, self.env.now)

    def _compute_end(self, stream: _Stream, action: Compute, start: float) -> None:
        label = self._labels.get(id(action)) or self._labels.setdefault(id(action), action.label)  # shared actions
        self.spans.append((stream.rank, "compute", label, action.phase, start, self.env.now, 0.0, action.microbatch))
        if self._send_overhead_s == 0:
            return self._compute_done(stream, action)
        self._work(stream.rank, self._messages[stream.rank][1].get(action.id, 0) * self._send_overhead_s,
                   self._compute_done, stream, action)

    def _compute_done(self, stream: _Stream, action: Compute) -> None:
        self._complete(stream.rank, action.id)
        stream.position += 1
        self._ready.append((self._compute_next, (stream,)))

    def _comm_next(self, stream: _Stream) -> None:
        if stream.position == len(stream.actions):
            return
        rank, action = stream.rank, stream.actions[stream.position]
        dep = self._unfinished(rank, action.deps)
        if dep is not None:
            self._wait_for(rank, dep, self._comm_next, (stream,))
            return
        cycle_s = action.cycle_s  # issued by a background thread at its first tick after the deps were done
        if cycle_s > 0:  # (the stream may reach it later, behind an allreduce of the same tick)
            tick_s = math.ceil(self._ready_at[rank, action.id] / cycle_s - 1e-9) * cycle_s
            self._later(max(tick_s - self.env.now, 0.0), self._comm_arrive, stream, action)
        else:
            self._comm_arrive(stream, action)

    def _note_ready(self, rank: int, action: Collective) -> None:
        """Record when a background-thread collective's dependencies are all done."""
        dep = self._unfinished(rank, action.deps)
        if dep is not None:
            return self._wait_for(rank, dep, self._note_ready, (rank, action))
        self._ready_at[rank, action.id] = self.env.now

    def _comm_arrive(self, stream: _Stream, action: Collective) -> None:
        if len(action.ranks) == 1:  # alone (a symmetric run's representative): nobody to wait for
            self._collective(action, [stream])
            return
        arrived = self._rendezvous.setdefault(action.key, [])
        arrived.append(stream)
        if len(arrived) == len(action.ranks):
            del self._rendezvous[action.key]
            self._collective(action, arrived)

    def _comm_done(self, streams: list[_Stream]) -> None:
        for stream in streams:
            self._complete(stream.rank, stream.actions[stream.position].id)
            stream.position += 1
            self._ready.append((self._comm_next, (stream,)))

    def _collective(self, action: Collective, streams: list[_Stream]) -> None:
        start = self.env.now
        if self.communication is not None:  # measured on the machine (a calibration profile)
            self._count(self.algorithms, "measured", 1)
            self._count_bytes(self._phases(action, count=False))
            duration_s = action.repeat * self.communication.collective_s(action.op, action.size_bytes, len(streams))
            if self.hosts is not None:
                self._on(self._host_job(duration_s, action.ranks, len(action.ranks), COLLECTIVE),
                         self._collective_end, action, streams, start, None)
            else:
                self._later(duration_s, self._collective_end, action, streams, start, None)
        else:
            held = self.hosts.hold(COLLECTIVE, self._host_threads(action.ranks)) if self.hosts else None
            self._play(self._phases(action), 0, self._collective_end, (action, streams, start, held))

    def _collective_end(self, action: Collective, streams: list[_Stream], start: float, held) -> None:
        if held is not None:
            self.hosts.release(held)
        now = self.env.now
        self.spans.extend((rank, "comm", action.label, action.op, start, now, action.size_bytes, -1)
                          for rank in action.ranks)
        self._comm_done(streams)

    def _count_bytes(self, phases) -> None:
        """The bytes a measured transfer moved per tier: the flow model's phases, not played."""
        for tier, size in (entry for phase in phases for entry in phase.tier_bytes):
            self._count(self.tier_bytes, tier, size)

    def _count(self, counts: dict, key: str, amount: float) -> None:
        counts[key] += amount
        if self.count_log is not None:
            self.count_log.append((self.env.now, counts is self.tier_bytes, key, amount))

    def _phases(self, action: Collective, count: bool = True) -> tuple:
        """The flow phases of a collective (built once per distinct collective, `_phase_cache`);
        `count`: add the algorithm it runs to the summary's counts, once per group it stands for."""
        signature = (action.ranks, action.key[0], action.op, action.size_bytes, action.algorithm, action.repeat)
        known = self._phase_keys.get(signature)
        if known is None:
            known = self._phase_keys[signature] = [self._phase_key(action), None]
        cache_key, label = known
        phases = self._phase_cache[cache_key]
        if count:
            if label is None:
                label = known[1] = collective_label(cache_key[3], phases)
            self._count(self.algorithms, label, len(cache_key[0]) * cache_key[5])  # groups x copies each
        return phases

    def _phase_key(self, action: Collective) -> tuple:
        """Build the collective's phases into `_phase_cache` (unless there) and return their key."""
        groups, weight = (tuple(self.plan.rank_to_device[r] for r in action.ranks),), 1
        if self._symmetry is not None:
            groups, weight = self._symmetry.device_groups(action)
        if action.op == "allreduce":
            algorithm = choose_algorithm(self.topology, groups[0], action.algorithm)
        else:  # allgather (sparse top-k, ZeRO, sequence parallelism), reduce_scatter; alltoall: grouped p2p
            algorithm = "pairwise" if action.op == "alltoall" else f"{gather_algorithm(self.topology, groups[0])}_{action.op}"
        cache_key = (groups, action.op, action.size_bytes, algorithm, action.repeat, weight)
        phases = self._phase_cache.get(cache_key)
        if phases is None:
            phases = collective_phases(self.topology, groups, action.op, action.size_bytes, algorithm,
                                       self.num_parameter_servers, action.repeat, weight)
            if self._symmetry is not None:
                phases = self._symmetry.prune(self.topology, action, phases)
            self._phase_cache[cache_key] = phases
        return cache_key

    def _send_phase(self, rank: int, action: Send, source: int, target: int):
        size, messages = action.size_bytes, action.messages
        cache_key = (rank, action.dst, size, messages) if self._symmetry else ((source, target), size, messages)
        phase = self._phase_cache.get(cache_key)
        if phase is None:  # symmetric: the representative's t sub-flows, links counted by multiplicity;
            phase = (self._symmetry.send_phase(self.topology, rank, action.dst, size) if self._symmetry
                     else pairs_phase(self.topology, ((source, target),), size))  # each message: a latency
            phase = self._phase_cache[cache_key] = replace(phase, latency_s=phase.latency_s * messages)
        return phase

    def _send_next(self, rank: int, action: Send) -> None:
        dep = self._unfinished(rank, action.deps)
        if dep is not None:
            self._wait_for(rank, dep, self._send_next, (rank, action))
            return
        start = self.env.now
        source, target = self.plan.rank_to_device[rank], self.plan.rank_to_device[action.dst]
        phase = self._send_phase(rank, action, source, target)
        if self.communication is None:
            self._play((phase,), 0, self._send_end, (rank, action, start, target))
            return
        self._count_bytes((phase,))
        measured_s = action.messages * self.communication.p2p_s(action.size_bytes / action.messages)
        if self.hosts is not None:
            self._on(self._host_job(measured_s, (rank, action.dst), 2, P2P), self._send_end, rank, action, start, target)
        else:
            self._later(measured_s, self._send_end, rank, action, start, target)

    def _send_end(self, rank: int, action: Send, start: float, target: int) -> None:
        self.spans.append((rank, "send", action.label, "send", start, self.env.now, action.size_bytes,
                           action.key[-1] if isinstance(action.key[-1], int) else -1))
        self._complete(rank, action.id)
        arrival = self._arrivals.get(action.key)
        if arrival is None:
            raise SimulationError(f"rank {rank}: send {action.key} to rank {action.dst} has no matching receive")
        if self.hosts is not None and self.hosts.wakeup_s > 0 and self.hosts.computing(self.hosts.host_of(target)):
            self._later(self.hosts.wakeup_s, self._complete, *arrival)  # the receiver waits for a processor
        else:
            self._complete(*arrival)

    def _play(self, phases: tuple, index: int, then, args: tuple) -> None:
        """Phases[index:] one after another (latency, then the flow), then `then(*args)`."""
        if index == len(phases):
            then(*args)
            return
        phase = phases[index]
        if phase.latency_s > 0:
            self._later(phase.latency_s, self._transfer, phases, index, then, args)
        else:
            self._transfer(phases, index, then, args)

    def _transfer(self, phases: tuple, index: int, then, args: tuple) -> None:
        phase = phases[index]
        if phase.bytes_per_subflow <= 0 or not phase.usage:
            self._transferred(phases, index, then, args)
        else:
            self.network.transfer(phase.bytes_per_subflow, phase.usage,
                                  on_done=lambda: self._resume(self._transferred, (phases, index, then, args)))

    def _transferred(self, phases: tuple, index: int, then, args: tuple) -> None:
        self._count_bytes((phases[index],))
        self._play(phases, index + 1, then, args)

    def _host_job(self, measured_s: float, ranks, ranks_when_measured: int, kind: str, then=None):
        """A job of one thread per rank on shared processors (`simulator.host_sharing`): measured at
        `measured_s` with k = `ranks_when_measured` threads busy, it holds min(1, P / k) x measured_s
        seconds of work at rate 1 (processor sharing, Kleinrock 1976). Returns the event of its end;
        with `then` = (function, args), function(*args) is called at its end instead (no event)."""
        work_s, threads = measured_s * min(1.0, self.hosts.parallelism / ranks_when_measured), self._host_threads(ranks)
        if then is None or work_s <= 0:
            event = self.hosts.run(work_s, kind, threads)
            return event if then is None else self._on(event, then[0], *then[1])
        self.hosts.run(work_s, kind, threads, on_done=lambda: self._resume(*then))

    def _host_threads(self, ranks) -> tuple[tuple[int, int], ...]:
        return self.hosts.threads_of(ranks, self.plan.rank_to_device)

    def _merge_links(self) -> None:
        """Every flow phase the plan plays, built (and cached) before the run, with each usage's links
        merged where no flow of the run tells them apart (`simulator.network.merged_usages`)."""
        seen, devices = set(), self.plan.rank_to_device
        for rank, actions in enumerate(self.plan.actions):
            for action in actions:
                kind = type(action)
                if kind is Collective and action.key not in seen:
                    seen.add(action.key)
                    self._phases(action, count=False)
                elif kind is Send:
                    self._send_phase(rank, action, devices[rank], devices[action.dst])
        merge_phase_links(self._phase_cache, self.network.capacities)

    def _check_finished(self) -> None:
        for rank, finished in enumerate(self._finished):
            if 0 in finished:  # a bytearray: searched at C speed
                action = self.plan.actions[rank][finished.index(0)]
                raise SimulationError(
                    f"rank {rank}: action {action.id} ({getattr(action, 'label', action)}) never ran: "
                    "the plan deadlocks or waits for a message nobody sends")
