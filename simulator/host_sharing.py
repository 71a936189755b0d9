"""Shared processors: ranks that run as processes on the same host's cores (a CPU host).

The one place the engine models ranks sharing processors, configured by a profile's
`shared_processors` section (`simulator.profile.SharedProcessors`). Each rank's compute pass is
one thread; each rank taking part in a collective or a point-to-point transfer is one
communication thread. A job holds `work_s` seconds of work at rate 1 and runs at the product of:

- sharing within a class: the threads of one class share the host's parallelism P equally, each
  at min(1, P / n) (processor sharing, Kleinrock, Queueing Systems vol. 2, 1976, ch. 4);
- interference between the classes: with all W calibrated ranks computing while all of them
  communicate, compute ran s_c and communication s_m times slower than alone; with n threads of
  the other class active the slowdown is 1 + (s - 1) x min(1, n / W) (linear between the two
  measured points). Without those factors both classes share one pool, min(1, P / (n_c + n_m)).

A message that arrives for a rank while its host computes reaches it `wakeup_s` later (the
receiving thread waits for a processor; the engine asks `computing(host)`).

A job on several hosts (a collective across nodes) runs at its slowest host's rate. Rates change
only when a job starts or ends, or a hold is taken or released; finish times sit in one heap under
one armed timer, as in `simulator.network.FlowNetwork`. Re-timing touches only the jobs on the hosts
whose threads changed, and only those whose rate changed (a GPU's compute job at rate 1 is left
alone until a collective is held on its device); rates are memoized per thread counts.

A GPU is the same model with one "host" per device (`SmSharing`, `sm_sharing`): its compute
stream is one thread at P = 1, and while a collective runs on the device (`hold`: its time comes
from the flow network, not from the pool) NCCL's kernels hold one SM per channel, so compute runs
num_sms / (num_sms - channels) slower (`simulator.nccl.compute_slowdown_while_communicating`).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field

from simulator.nccl import NCCL_DEFAULT_NUM_CHANNELS, compute_slowdown_while_communicating

COMPUTE, COLLECTIVE, P2P = "compute", "collective", "p2p"
COMM_CLASSES = (COLLECTIVE, P2P)


@dataclass(frozen=True)
class SmSharing:
    """The `shared_processors` of a GPU cost model: each device is its own pool (`per_device`), its
    compute stream one thread at full speed alone (P = 1, measured with 1 rank), slowed by
    `compute_slowdown_while[COLLECTIVE]` while any collective runs on the device."""

    compute_slowdown_while: dict[str, float]
    parallelism: float = 1.0
    measured_ranks: int = 1
    wakeup_s: float = 0.0
    comm_slowdown_while_computing: dict[str, float] = field(default_factory=dict)
    per_device: bool = True


NO_SM_SHARING = SmSharing({})
"""A device whose compute nothing slows (its SM count unknown, or contention not modelled)."""


def sm_sharing(num_sms: int | None, num_channels: int = NCCL_DEFAULT_NUM_CHANNELS) -> SmSharing | None:
    """A GPU's SMs shared by compute and NCCL's channels (one CTA, so one SM, per channel: NCCL
    docs, NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS; `simulator.nccl.NCCL_DEFAULT_NUM_CHANNELS`):
    compute slows by num_sms / (num_sms - channels) while a collective runs. None (no contention
    modelled) when the SM count is unknown or not above the channel count."""
    if not num_sms or num_sms <= num_channels:
        return None
    return SmSharing({COLLECTIVE: compute_slowdown_while_communicating(num_sms, num_channels)})


class _Job:
    __slots__ = ("id", "remaining", "kind", "threads", "rate", "since_s", "done", "version")

    def __init__(self, job_id, work_s, kind, threads, now_s, done):
        self.id, self.remaining, self.kind, self.threads = job_id, work_s, kind, threads
        self.rate, self.since_s, self.done, self.version = 0.0, now_s, done, 0


class HostPool:
    """Jobs of compute and communication threads on `num_hosts` hosts configured by `processors`
    (a `simulator.profile.SharedProcessors`: parallelism P and the interference factors).
    `host_processors[h]`, where given, configures host h's interference factors instead (a mixed
    GPU cluster: each device's own SM count, `sm_sharing`); P, W and wakeup_s stay `processors`'."""

    def __init__(self, env, processors, num_hosts: int, host_of=None, host_processors=None):
        self.env = env
        self.host_of = host_of or (lambda device: device)
        """Device index -> host index (its node for CPU hosts, itself for a GPU's SMs)."""
        self.parallelism = processors.parallelism
        self.measured_ranks = processors.measured_ranks
        self.wakeup_s = processors.wakeup_s
        factors_of = {}  # (compute slowdowns, comm slowdowns) -> index in self._factors
        self._factors: list[tuple[dict, dict]] = []
        """Per distinct configuration: (compute_slowdown_while, comm_slowdown_while_computing)."""
        self._factors_of_host = [0] * num_hosts
        for host, config in enumerate(host_processors or [processors] * num_hosts):
            key = (tuple(sorted(config.compute_slowdown_while.items())),
                   tuple(sorted(config.comm_slowdown_while_computing.items())))
            if key not in factors_of:
                factors_of[key] = len(self._factors)
                self._factors.append((dict(key[0]), dict(key[1])))
            self._factors_of_host[host] = factors_of[key]
        self._interferes = any(compute or comm for compute, comm in self._factors)
        self._threads = [defaultdict(int) for _ in range(num_hosts)]  # host -> {kind: active threads}
        self._jobs = [dict() for _ in range(num_hosts)]                # host -> {job id: job}
        self._finishes: list[tuple[float, int, int, _Job]] = []
        self._timer_at_s = math.inf
        self._next_id = 0
        self._rates: dict[tuple, float] = {}
        """(host's factors, kind, compute, collective, p2p threads on the host) -> `thread_rate` (a pure function of them)."""
        self._threads_of: dict[tuple, tuple] = {}  # ranks -> threads_of(ranks)

    @classmethod
    def for_topology(cls, env, processors, topology, device_processors=None) -> "HostPool":
        """One pool per node of `topology` (ranks on a host share its processors), or per device
        when `processors.per_device` (a GPU's SMs, `SmSharing`), each device then configured by
        `device_processors[device]` where given."""
        if getattr(processors, "per_device", False):
            return cls(env, processors, topology.num_devices, host_processors=device_processors)
        return cls(env, processors, topology.num_nodes, topology.node_of)

    def threads_of(self, ranks, rank_to_device) -> tuple[tuple[int, int], ...]:
        """((host, threads), ...): one thread per rank on its device's host (one plan's ranks)."""
        ranks = tuple(ranks)
        threads = self._threads_of.get(ranks)
        if threads is None:
            per_host: dict[int, int] = defaultdict(int)
            for rank in ranks:
                per_host[self.host_of(rank_to_device[rank])] += 1
            threads = self._threads_of[ranks] = tuple(sorted(per_host.items()))
        return threads

    def hold(self, kind: str, threads: tuple[tuple[int, int], ...]):
        """Count `threads` ((host, count), ...) of class `kind` as active until `release(token)`:
        work timed elsewhere (a collective played on the flow network) that still slows the other
        class by the interference factors. Returns the token."""
        for host, count in threads:
            self._threads[host][kind] += count
        self._reschedule_busy(threads)
        return kind, threads

    def release(self, token) -> None:
        kind, threads = token
        for host, count in threads:
            self._threads[host][kind] -= count
        self._reschedule_busy(threads)

    def _reschedule_busy(self, threads) -> None:
        """`_reschedule` the hosts of `threads` that run jobs (a hold changes no other job's rate)."""
        busy = [host for host, _ in threads if self._jobs[host]]
        if busy:
            self._reschedule(busy)

    def run(self, work_s: float, kind: str, threads: tuple[tuple[int, int], ...], on_done=None):
        """Start a job of `work_s` seconds at rate 1 with `threads` = ((host, count), ...); returns
        an event that succeeds when its work is done. With `on_done` (a callable, for a job with
        work and threads) nothing is returned and `on_done()` is called instead, once the rates of
        the jobs left are set (no SimPy event per job, as `simulator.network.FlowNetwork.transfer`)."""
        if on_done is not None and work_s > 0 and threads:
            done = on_done
        else:
            done = self.env.event()
            if work_s <= 0 or not threads:
                done.succeed()
                return done
        now = self.env.now
        job = _Job(self._next_id, work_s, kind, threads, now, done)
        self._next_id += 1
        if len(threads) == 1:
            host, count = threads[0]
            self._threads[host][kind] += count
            jobs = self._jobs[host]
            jobs[job.id] = job
            if len(jobs) == 1:  # alone on its host (a GPU's compute job): no other job to re-time
                job.rate = rate = self._rate_of(host, kind)
                job.version = 1
                finish_s = now + work_s / rate  # as `_reschedule` times it: work_s - 0 x 0 left
                heapq.heappush(self._finishes, (finish_s, job.id, 1, job))
                if finish_s < self._timer_at_s:  # else the armed timer still comes first
                    self._arm()
                return done
            self._reschedule((host,))
            return done
        for host, count in threads:
            self._threads[host][kind] += count
            self._jobs[host][job.id] = job
        self._reschedule([host for host, _ in threads])
        return done

    def computing(self, host: int) -> bool:
        """Whether any compute thread is active on `host` (a message for it waits `wakeup_s`)."""
        return self._threads[host][COMPUTE] > 0

    def thread_rate(self, host: int, kind: str) -> float:
        """Rate of one thread of class `kind` on `host` given the threads active there now."""
        active = self._threads[host]
        num_compute = active[COMPUTE]
        num_comm = sum(active[c] for c in COMM_CLASSES)
        if not self._interferes:
            return min(1.0, self.parallelism / max(num_compute + num_comm, 1))
        world = self.measured_ranks
        compute_slowdown_while, comm_slowdown_while_computing = self._factors[self._factors_of_host[host]]
        if kind == COMPUTE:
            slowdown = 1.0 + sum((compute_slowdown_while.get(c, 1.0) - 1.0) * min(1.0, active[c] / world)
                                 for c in COMM_CLASSES)
            return min(1.0, self.parallelism / max(num_compute, 1)) / slowdown
        slowdown = 1.0 + (comm_slowdown_while_computing.get(kind, 1.0) - 1.0) * min(1.0, num_compute / world)
        return min(1.0, self.parallelism / max(num_comm, 1)) / slowdown

    # ------------------------------------------------------------------ internals
    def _rate_of(self, host: int, kind: str) -> float:
        """`thread_rate(host, kind)`, memoized on the host's thread counts."""
        active = self._threads[host]
        key = (self._factors_of_host[host], kind, active[COMPUTE], active[COLLECTIVE], active[P2P])
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = self.thread_rate(host, kind)
        return rate

    def _reschedule(self, hosts) -> None:
        """Re-time the jobs on `hosts` whose rate changed. A job's finish depends on its own rates
        only and the heap orders by (finish, id), so the visiting order is free and a job met twice
        is left alone the second time (its rate is unchanged): no dedup, no sort."""
        now, finishes, jobs_of, rate_of = self.env.now, self._finishes, self._jobs, self._rate_of
        for host in hosts:
            for job in jobs_of[host].values():
                threads = job.threads
                if len(threads) == 1:
                    rate = rate_of(host, job.kind)
                else:
                    rate = min(rate_of(other, job.kind) for other, _ in threads)
                if rate == job.rate:
                    continue
                job.remaining -= job.rate * (now - job.since_s)
                job.since_s, job.rate = now, rate
                job.version += 1
                heapq.heappush(finishes, (now + max(job.remaining, 0.0) / rate, job.id, job.version, job))
        self._arm()

    def _arm(self) -> None:
        finishes = self._finishes
        while finishes and finishes[0][2] != finishes[0][3].version:
            heapq.heappop(finishes)
        if finishes and finishes[0][0] < self._timer_at_s:
            at_s = self._timer_at_s = finishes[0][0]
            timer = self.env.timeout(max(at_s - self.env.now, 0.0))
            timer.callbacks.append(lambda _event: self._on_timer(at_s))

    def _on_timer(self, at_s: float) -> None:
        if at_s == self._timer_at_s:
            self._timer_at_s = math.inf
        now, finishes, ended, pop = self.env.now, self._finishes, [], heapq.heappop
        due_s = 1e-12 * (1.0 + now)
        while finishes:
            finish_s, _, version, job = finishes[0]
            if version != job.version:
                pop(finishes)
                continue
            if finish_s - now > due_s:
                break
            pop(finishes)
            job.version += 1
            ended.append(job)
        hosts, threads_of, jobs_of = set(), self._threads, self._jobs
        for job in ended:
            kind, job_id = job.kind, job.id
            for host, count in job.threads:
                threads_of[host][kind] -= count
                del jobs_of[host][job_id]
                hosts.add(host)
        callbacks = []
        for job in ended:
            if hasattr(job.done, "succeed"):  # an event (SimPy's)
                job.done.succeed()
            else:
                callbacks.append(job.done)
        self._reschedule(hosts)
        for callback in callbacks:
            callback()
