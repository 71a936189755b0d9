"""Issue 73's fast paths give bit-identical results: the host pool's re-timing (no sort, memoized
rates, a job alone on its host timed directly) against the original re-timing, and the cached ring
routes (`collectives._ring_routes`) against routes built afresh for every size."""

import heapq
import random

import pytest
import simpy

from simulator import collectives, load_scenario, simulate
from simulator.collectives import collective_phases
from simulator.hardware import LinkSpec
from simulator.host_sharing import COLLECTIVE, COMPUTE, P2P, HostPool, _Job, sm_sharing
from simulator.profile import SharedProcessors
from simulator.topology import Topology


class _ReferencePool(HostPool):
    """The pool as it was before issue 73: every change re-times all jobs of the hosts it touches,
    deduplicated and sorted by id, with `thread_rate` computed afresh."""

    def run(self, work_s, kind, threads):
        done = self.env.event()
        if work_s <= 0 or not threads:
            done.succeed()
            return done
        job = _Job(self._next_id, work_s, kind, threads, self.env.now, done)
        self._next_id += 1
        for host, count in threads:
            self._threads[host][kind] += count
            self._jobs[host][job.id] = job
        self._reschedule({host for host, _ in threads})
        return done

    def _reschedule(self, hosts):
        now = self.env.now
        jobs = {job.id: job for host in hosts for job in self._jobs[host].values()}
        for job in sorted(jobs.values(), key=lambda j: j.id):
            rate = min(self.thread_rate(host, job.kind) for host, _ in job.threads)
            if rate == job.rate:
                continue
            job.remaining -= job.rate * (now - job.since_s)
            job.since_s, job.rate = now, rate
            job.version += 1
            heapq.heappush(self._finishes, (now + max(job.remaining, 0.0) / rate, job.id, job.version, job))
        self._arm()


def _timeline(pool_type, processors, num_hosts: int, seed: int):
    """Finish time and order of a random mix of compute jobs, multi-host jobs and held collectives."""
    rng, env = random.Random(seed), simpy.Environment()
    pool = pool_type(env, processors, num_hosts)
    finished = []

    def job(index, start_s, work_s, kind, threads):
        yield env.timeout(start_s)
        yield pool.run(work_s, kind, threads)
        finished.append((index, env.now))

    def held(start_s, hold_s, threads):
        yield env.timeout(start_s)
        token = pool.hold(COLLECTIVE, threads)
        yield env.timeout(hold_s)
        pool.release(token)

    for index in range(300):
        start_s, work_s = rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 5)]), rng.choice([1.0, 0.1, rng.uniform(0, 2)])
        hosts = sorted(rng.sample(range(num_hosts), rng.choice([1, 1, 1, 2, 3])))
        kind = COMPUTE if len(hosts) == 1 and rng.random() < 0.8 else rng.choice([COLLECTIVE, P2P])
        env.process(job(index, start_s, work_s, kind, tuple((h, rng.choice([1, 1, 2])) for h in hosts)))
        if rng.random() < 0.3:
            hosts = sorted(rng.sample(range(num_hosts), rng.randint(1, num_hosts)))
            env.process(held(rng.uniform(0, 5), rng.choice([0.0, rng.uniform(0, 1)]), tuple((h, 1) for h in hosts)))
    env.run()
    return finished, next(env._eid)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("processors", [
    sm_sharing(108),
    SharedProcessors(parallelism=2.0, measured_ranks=4, compute_slowdown_while={P2P: 1.8, COLLECTIVE: 1.3},
                     comm_slowdown_while_computing={P2P: 3.0}),
    SharedProcessors(parallelism=1.0, measured_ranks=1),
], ids=["sm", "interference", "plain"])
def test_host_pool_fast_paths_match_the_reference_bit_for_bit(processors, seed):
    assert _timeline(HostPool, processors, 6, seed) == _timeline(_ReferencePool, processors, 6, seed)


@pytest.mark.parametrize("kinds", [("ethernet", "ethernet"), ("nvlink", "infiniband")])
@pytest.mark.parametrize("op,algorithm", [("allreduce", "ring"), ("allreduce", "hierarchical"),
                                          ("allgather", "ring"), ("reduce_scatter", "ring")])
@pytest.mark.parametrize("groups", [(tuple(range(16)),), ((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 5, 9, 14),)])
def test_cached_ring_routes_give_the_phases_built_afresh(kinds, op, algorithm, groups):
    intra = LinkSpec(latency_s=1e-6, bandwidth_bytes_per_s=100e9, kind=kinds[0], nvls=kinds[0] == "nvlink")
    inter = LinkSpec(latency_s=5e-6, bandwidth_bytes_per_s=10e9, kind=kinds[1])
    topology = Topology(4, 4, intra, inter, nics_per_node=2)
    for size_bytes in (1.0, 12345.678, 25 * 2**20 + 3, 1e9 / 7):
        warm = collective_phases(topology, groups, op, size_bytes, algorithm)  # cache built by earlier sizes
        collectives._RING_ROUTES.pop(topology, None)
        fresh = collective_phases(topology, groups, op, size_bytes, algorithm)
        assert repr(warm) == repr(fresh)
    assert topology in collectives._RING_ROUTES


def test_the_span_table_is_built_when_first_asked_for():
    """simulate() keeps the engine's span tuples; the DataFrame comes on first access, once."""
    from simulator.records import span_table
    result = simulate(load_scenario("scenarios/demo.yaml"))
    assert "spans" not in vars(result)
    table = result.spans
    assert table is result.spans
    assert table.equals(span_table(result.span_records))
    assert float(table["end_s"].max()) == result.step_time_s
