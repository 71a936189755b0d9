"""Shared processors (simulator.host_sharing): closed-form timelines of compute and communication jobs."""

import pytest
import simpy

from simulator.host_sharing import COLLECTIVE, COMPUTE, P2P, HostPool
from simulator.profile import SharedProcessors
from tests.helpers import FixedCosts, Topology, link, run_grid, toy_workload


def Interference(world_size, compute_slowdown, comm_slowdown):
    """The profile's interference factors (measured with `world_size` ranks)."""
    return world_size, compute_slowdown, comm_slowdown


def _processors(parallelism, interference=None):
    world, compute, comm = interference or (1, {}, {})
    return SharedProcessors(parallelism=parallelism, measured_ranks=world, compute_slowdown_while=compute,
                            comm_slowdown_while_computing=comm)


def _finish_times(pool_args, jobs):
    """Run `jobs` = [(start_s, work_s, kind, threads)] on a HostPool built from
    `pool_args` = (parallelism, num_hosts[, interference]); their finish times in order."""
    env = simpy.Environment()
    parallelism, num_hosts, *interference = pool_args
    pool = HostPool(env, _processors(parallelism, interference[0] if interference else None), num_hosts)
    finished = [None] * len(jobs)

    def job(index, start_s, work_s, kind, threads):
        yield env.timeout(start_s)
        yield pool.run(work_s, kind, threads)
        finished[index] = env.now

    for index, spec in enumerate(jobs):
        env.process(job(index, *spec))
    env.run()
    return finished


def test_without_interference_all_threads_share_one_pool():
    # P = 1: two compute threads and a two-thread collective share one core: 4 threads at 1/4 each
    # until the compute jobs (1 s of work) end at 4 s; the collective (2 s) then runs alone at rate
    # min(1, 1/2) = 1/2 per thread: 1 s of work left -> 2 s more.
    times = _finish_times((1.0, 1), [(0, 1.0, COMPUTE, ((0, 1),)), (0, 1.0, COMPUTE, ((0, 1),)),
                                     (0, 2.0, COLLECTIVE, ((0, 2),))])
    assert times == pytest.approx([4.0, 4.0, 6.0])


def test_interference_slows_each_class_by_its_measured_factor_while_both_run():
    # W = 2, P = 2: two compute threads (1 s each) and a two-thread collective (1 s).
    # Together: compute at 1 / 1.5, the collective at 1 / 3. Compute ends at 1.5 s, when the
    # collective has done 0.5 s of work; alone it runs at 1: it ends at 2.0 s.
    interference = Interference(2, {COLLECTIVE: 1.5, P2P: 1.2}, {COLLECTIVE: 3.0, P2P: 2.0})
    times = _finish_times((2.0, 1, interference), [(0, 1.0, COMPUTE, ((0, 1),)), (0, 1.0, COMPUTE, ((0, 1),)),
                                                   (0, 1.0, COLLECTIVE, ((0, 2),))])
    assert times == pytest.approx([1.5, 1.5, 2.0])


def test_interference_scales_with_the_other_class_share_of_the_calibration_threads():
    # W = 4, P = 2: one compute thread and one two-thread p2p transfer. Compute slowdown
    # 1 + (1.8 - 1) x 2/4 = 1.4; p2p slowdown 1 + (3 - 1) x 1/4 = 1.5 (rate min(1, 2/2) / 1.5).
    interference = Interference(4, {P2P: 1.8}, {P2P: 3.0})
    compute_end, p2p_end = _finish_times((2.0, 1, interference), [(0, 1.0, COMPUTE, ((0, 1),)),
                                                                   (0, 1.0, P2P, ((0, 2),))])
    assert compute_end == pytest.approx(1.4)             # 1 s of work at 1 / 1.4
    assert p2p_end == pytest.approx(1.4 + (1.0 - 1.4 / 1.5))  # 1.4 / 1.5 done by then, the rest at 1


def test_a_job_on_two_hosts_runs_at_its_slowest_host_rate():
    # host 0 has a second compute thread (P = 1: each at 1/2); the two-host collective's thread on
    # host 0 shares with it (one pool: 1/2), on host 1 it is alone (1): it runs at 1/2.
    times = _finish_times((1.0, 2), [(0, 1.0, COLLECTIVE, ((0, 1), (1, 1))), (0, 10.0, COMPUTE, ((0, 1),))])
    assert times[0] == pytest.approx(2.0)


def test_a_job_starting_later_changes_the_rates_of_the_running_ones():
    # P = 1, no interference: a compute job of 2 s alone for 1 s, then a second one joins:
    # both at 1/2; the first has 1 s left -> ends at 3 s; the second has 1 s left then, alone -> 4 s.
    times = _finish_times((1.0, 1), [(0, 2.0, COMPUTE, ((0, 1),)), (1.0, 2.0, COMPUTE, ((0, 1),))])
    assert times == pytest.approx([3.0, 4.0])


def test_a_callback_job_ends_when_its_event_would_and_a_hold_on_an_idle_host_times_nothing():
    # the same timeline as the test above, the first job ending through `on_done` instead of an event
    env = simpy.Environment()
    pool = HostPool(env, _processors(1.0), 2)
    ended = {}
    pool.run(2.0, COMPUTE, ((0, 1),), on_done=lambda: ended.setdefault("callback", env.now))

    def later():
        yield env.timeout(1.0)
        retimed = []
        reschedule, pool._reschedule = pool._reschedule, lambda hosts: retimed.append(list(hosts))
        pool.release(pool.hold(COLLECTIVE, ((1, 1),)))  # host 1 runs no job: nothing to re-time
        pool.release(pool.hold(COLLECTIVE, ((0, 1), (1, 1))))  # host 0 runs the first job
        pool._reschedule = reschedule
        assert retimed == [[0], [0]]
        yield pool.run(2.0, COMPUTE, ((0, 1),))
        ended["event"] = env.now

    env.process(later())
    env.run()
    assert ended == pytest.approx({"callback": 3.0, "event": 4.0})


class _SharedHostCosts(FixedCosts):
    """FixedCosts on a calibrated shared host (P = 2) with measured allreduce times."""

    def __init__(self, interference, allreduce_s: float):
        super().__init__(forward_s_per_sample=0.001)
        self.shared_processors = _processors(2.0, interference)
        self.communication = self
        self.message_overheads_s = (0.0, 0.0)
        self.fixed_allreduce_s = allreduce_s

    def collective_s(self, op: str, size_bytes: float, num_ranks: int) -> float:
        return self.fixed_allreduce_s

    def p2p_s(self, size_bytes: float) -> float:
        return 0.0


def test_data_parallel_step_grows_when_the_overlap_is_measured_to_interfere():
    workload = toy_workload(4, num_params=1000)
    topology = Topology(1, 2, link(0.0, 1e9), link(0.0, 1e9))
    steps = {}
    for name, interference in (("shared pool", None),
                               ("no interference", Interference(2, {COLLECTIVE: 1.0}, {COLLECTIVE: 1.0})),
                               ("interference", Interference(2, {COLLECTIVE: 1.5}, {COLLECTIVE: 4.0}))):
        costs = _SharedHostCosts(interference, allreduce_s=0.004)
        _, spans = run_grid(workload, topology, costs, 2, 1, 16, bucket_size_bytes=2 * 1000 * 4)
        steps[name] = spans["end_s"].max()
    # two buckets: with free overlap the first allreduce hides under the last layers' backward
    assert steps["no interference"] < steps["shared pool"] < steps["interference"]
