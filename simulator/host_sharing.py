"""Shared host processors: compute and communication threads of the ranks of one CPU host.

On a calibrated CPU host (a profile measured on a CPU) the ranks of a node are processes on the
same cores. Each rank's compute pass is one thread; each rank taking part in a collective or in a
point-to-point transfer is one communication thread. A job holds `work_s` seconds of work, the
time it takes at rate 1, and runs at a rate that is the product of two terms:

- sharing within a class: the threads of one class share the host's parallelism P equally
  (processor sharing, Kleinrock, Queueing Systems vol. 2, 1976, ch. 4): a compute thread runs at
  min(1, P / n_compute), a communication thread at min(1, P / n_comm);
- interference between the classes (`Interference`, measured by the validator's overlap
  microbenchmark): with all W ranks computing while all W ranks communicate, compute ran s_c
  times and communication s_m times slower than each class alone. With n threads of the other
  class active the slowdown is 1 + (s - 1) x min(1, n / W): linear in the other class's share of
  the calibration's threads (an interpolation, not a derived law).

Without interference factors (profiles older than the overlap microbenchmark) both classes share
one pool, every thread at min(1, P / (n_compute + n_comm)).

Where a calibration's ranks outnumbered its host's cores, P for compute threads depends on how many
are open (`PoolCurve`, since the twenty-sixth session): the layers' block medians give P for any
number up to the cores, the asynchronous cycle's rounds (all W ranks computing for 0.4 s,
`simulator.cycle_compute`) give P_round for W, and the curve is linear in between.

Memory-bound passes (a rank's update and weight passes: `memory_contention` jobs) also slow each
other: a 2-rank calibration times them both with rank 0 alone and with every rank at once, and
their ratio s (`ProfileCosts.memory_contention`) is what a pass pays while the host's other ranks run
theirs. The engine plays the alone time as its work, and with m other such jobs open on its host a
job runs 1 + (s - 1) x min(1, m / (W_s - 1)) times slower (W_s: the ranks of those timings), linear
in the other ranks' share as for `Interference`. Why: in a 2-stage pipeline the ranks' passes
overlap only in part; played at the at-once timing throughout, the MLP's 2-stage PipeDream update
cost 1.15-1.32x what the runtime's step spans measured, the alone timing 0.9-1.0x
(`reports/diagnostics/memory_contention/`).

A job on several hosts (a collective across nodes) runs at its slowest host's rate. Rates change
only when a job starts or ends; finish times sit in one heap under one armed timer, as in
`simulator.network.FlowNetwork`.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field

COMPUTE, COLLECTIVE, P2P = "compute", "collective", "p2p"
COMM_CLASSES = (COLLECTIVE, P2P)


@dataclass(frozen=True)
class Interference:
    """Measured slowdowns of each class while the other runs (all `world_size` ranks at once)."""

    world_size: int
    compute_slowdown: dict[str, float] = field(default_factory=dict)
    """{comm class: s_c}: compute's slowdown while every rank runs that kind of communication."""
    comm_slowdown: dict[str, float] = field(default_factory=dict)
    """{comm class: s_m}: that communication's slowdown while every rank computes."""


@dataclass(frozen=True)
class PoolCurve:
    """A host's parallelism for compute threads where its ranks outnumber its cores: P (the pool's
    own) for up to `cores` threads; `parallelism_all` (the cycle rounds' P_round, measured with
    `world_size` ranks computing at once) for `world_size`; linear from min(P, cores) at `cores` to
    it in between (an interpolation between two measured points, not a derived law).

    Why: the rounds count every scheduler slice a rank loses while all W compute, which the block
    medians behind P drop; before this curve asynchronous plans paid P / P_round on every pass,
    also while only some ranks computed. On the Intel Xeon host (P_round 1.24 against P 2.29 for 4
    ranks on 2 cores) that constant charged the MLP's 4-stage PipeDream passes 2x, where the
    runtime's step spans measured 1.0-1.3x their 1F1B time (`reports/diagnostics/pool_curve/`)."""

    cores: int
    parallelism_at_cores: float
    parallelism_all: float
    world_size: int

    def parallelism(self, num_compute: int, pool_parallelism: float) -> float:
        """P for `num_compute` compute threads open on a host whose pool has `pool_parallelism`."""
        if num_compute <= self.cores:
            return pool_parallelism
        share = min(1.0, (num_compute - self.cores) / max(1, self.world_size - self.cores))
        return self.parallelism_at_cores + (self.parallelism_all - self.parallelism_at_cores) * share


class _Job:
    __slots__ = ("id", "remaining", "kind", "threads", "rate", "since_s", "done", "version", "contention")

    def __init__(self, job_id, work_s, kind, threads, now_s, done, contention=None):
        self.id, self.remaining, self.kind, self.threads = job_id, work_s, kind, threads
        self.rate, self.since_s, self.done, self.version = 0.0, now_s, done, 0
        self.contention = contention


class HostPool:
    """Jobs of compute and communication threads on hosts of parallelism `parallelism` each."""

    def __init__(self, env, parallelism: float, num_hosts: int, interference: Interference | None = None,
                 curve: PoolCurve | None = None, contention_ranks: int = 2):
        self.env = env
        self.parallelism = parallelism
        self.interference = interference
        self.curve = curve
        self.contention_ranks = contention_ranks
        """Ranks that ran the at-once timings behind the memory-bound jobs' contention (module docstring)."""
        self._memory_jobs = [0] * num_hosts
        self._threads = [defaultdict(int) for _ in range(num_hosts)]  # host -> {kind: active threads}
        self._jobs = [dict() for _ in range(num_hosts)]                # host -> {job id: job}
        self._finishes: list[tuple[float, int, int, _Job]] = []
        self._timer_at_s = math.inf
        self._next_id = 0

    def run(self, work_s: float, kind: str, threads: tuple[tuple[int, int], ...],
            memory_contention: float | None = None):
        """Start a job of `work_s` seconds at rate 1 with `threads` = ((host, count), ...); returns
        an event that succeeds when its work is done. `memory_contention`: a memory-bound pass's
        slowdown s while the host's other ranks run theirs (module docstring); None: not one."""
        done = self.env.event()
        if work_s <= 0 or not threads:
            done.succeed()
            return done
        job = _Job(self._next_id, work_s, kind, threads, self.env.now, done, memory_contention)
        self._next_id += 1
        for host, count in threads:
            self._threads[host][kind] += count
            self._jobs[host][job.id] = job
            if memory_contention is not None:
                self._memory_jobs[host] += 1
        self._reschedule({host for host, _ in threads})
        return done

    def active_threads(self, host: int, kind: str) -> int:
        """Threads of class `kind` active on `host` now."""
        return self._threads[host][kind]

    def thread_rate(self, host: int, kind: str) -> float:
        """Rate of one thread of class `kind` on `host` given the threads active there now."""
        active = self._threads[host]
        parallelism = self.parallelism
        num_compute = active[COMPUTE]
        if kind == COMPUTE and self.curve is not None:
            parallelism = self.curve.parallelism(num_compute, parallelism)
        num_comm = sum(active[c] for c in COMM_CLASSES)
        if self.interference is None:
            return min(1.0, parallelism / max(num_compute + num_comm, 1))
        world = self.interference.world_size
        if kind == COMPUTE:
            slowdown = 1.0 + sum((self.interference.compute_slowdown.get(c, 1.0) - 1.0) * min(1.0, active[c] / world)
                                 for c in COMM_CLASSES)
            return min(1.0, parallelism / max(num_compute, 1)) / slowdown
        slowdown = 1.0 + (self.interference.comm_slowdown.get(kind, 1.0) - 1.0) * min(1.0, num_compute / world)
        return min(1.0, parallelism / max(num_comm, 1)) / slowdown

    def _contention_slowdown(self, job: _Job) -> float:
        """1 + (s - 1) x min(1, m / (W_s - 1)) for a memory-bound job with m others on its host."""
        if job.contention is None or job.contention <= 1.0:
            return 1.0
        others = max(self._memory_jobs[host] - 1 for host, _ in job.threads)
        return 1.0 + (job.contention - 1.0) * min(1.0, others / max(1, self.contention_ranks - 1))

    # ------------------------------------------------------------------ internals
    def _reschedule(self, hosts) -> None:
        now = self.env.now
        jobs = {job.id: job for host in hosts for job in self._jobs[host].values()}
        for job in sorted(jobs.values(), key=lambda j: j.id):
            rate = min(self.thread_rate(host, job.kind) for host, _ in job.threads) / self._contention_slowdown(job)
            if rate == job.rate:
                continue
            job.remaining -= job.rate * (now - job.since_s)
            job.since_s, job.rate = now, rate
            job.version += 1
            heapq.heappush(self._finishes, (now + max(job.remaining, 0.0) / rate, job.id, job.version, job))
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
        now, finishes, ended = self.env.now, self._finishes, []
        while finishes:
            finish_s, _, version, job = finishes[0]
            if version != job.version:
                heapq.heappop(finishes)
                continue
            if finish_s - now > 1e-12 * (1.0 + now):
                break
            heapq.heappop(finishes)
            job.version += 1
            ended.append(job)
        hosts = set()
        for job in ended:
            for host, count in job.threads:
                self._threads[host][job.kind] -= count
                del self._jobs[host][job.id]
                if job.contention is not None:
                    self._memory_jobs[host] -= 1
                hosts.add(host)
        for job in ended:
            job.done.succeed()
        self._reschedule(hosts)
