"""Shared CPU hosts (simulator.host_sharing): closed-form timelines of compute and communication jobs."""

import pytest
import simpy

from simulator.host_sharing import COLLECTIVE, COMPUTE, P2P, HostPool, Interference, PoolCurve
from tests.helpers import FixedCosts, Topology, link, run_grid, toy_workload


def _finish_times(pool_args, jobs, **pool_options):
    """Run `jobs` = [(start_s, work_s, kind, threads[, memory_contention])] on a HostPool; their
    finish times in order."""
    env = simpy.Environment()
    pool = HostPool(env, *pool_args, **pool_options)
    finished = [None] * len(jobs)

    def job(index, start_s, work_s, kind, threads, memory_contention=None):
        yield env.timeout(start_s)
        yield pool.run(work_s, kind, threads, memory_contention)
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


class _SharedHostCosts(FixedCosts):
    """FixedCosts on a calibrated shared host with measured allreduce times."""

    def __init__(self, interference, allreduce_s: float):
        super().__init__(forward_s_per_sample=0.001)
        self.host_parallelism = 2.0
        self.interference = interference
        self.fixed_allreduce_s = allreduce_s

    def allreduce_s(self, size_bytes: float, num_ranks: int) -> float:
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


def test_bucket_allreduces_queued_behind_one_another_take_the_streamed_factor():
    workload = toy_workload(4, num_params=1000)  # 250 parameters a layer: one 1000-byte bucket each
    topology = Topology(1, 2, link(0.0, 1e9), link(0.0, 1e9))
    durations = {}
    for factor in (1.0, 0.5):
        costs = _SharedHostCosts(Interference(2, {COLLECTIVE: 1.0}, {COLLECTIVE: 1.0}), allreduce_s=0.004)
        costs.forward_s_per_sample = 0.0001  # a layer's backward (1.6 ms) is shorter than an allreduce
        costs.streamed_allreduce_factor = factor
        _, spans = run_grid(workload, topology, costs, 2, 1, 16, bucket_size_bytes=1000)
        reduces = spans[(spans["kind"] == "allreduce") & (spans["rank"] == 0)].sort_values("start_s")
        durations[factor] = list((reduces["end_s"] - reduces["start_s"]) * 1e3)
    assert durations[1.0] == pytest.approx([4.0] * 4)
    # the first bucket's allreduce waits for nothing; the three after it were ready while it ran
    assert durations[0.5] == pytest.approx([4.0, 2.0, 2.0, 2.0])


CURVE = PoolCurve(cores=2, parallelism_at_cores=2.0, parallelism_all=1.24, world_size=4)
"""4 ranks on 2 cores: the pool's P = 2.29 from the block medians, the rounds' P_round = 1.24."""


@pytest.mark.parametrize("threads,finish_s", [(2, 1.0), (3, 1 / (1.62 / 3)), (4, 1 / (1.24 / 4))])
def test_the_pools_curve_sets_compute_parallelism_by_threads_open(threads, finish_s):
    # up to the cores the pool's own P (2.29: each at rate 1); 4 threads at P_round (1.24 / 4 each);
    # 3 halfway between min(P, cores) = 2 and P_round: 1.62 / 3 each
    times = _finish_times((2.29, 1, None, CURVE), [(0, 1.0, COMPUTE, ((0, 1),))] * threads)
    assert times == pytest.approx([finish_s] * threads)


def test_the_curve_follows_threads_as_they_end():
    # 4 jobs (one of 0.5 s work): all at 0.31 until the short one ends at 0.5 / 0.31 s, then the
    # other three at 1.62 / 3 = 0.54 for the 0.5 s they have left
    first_s = 0.5 / 0.31
    times = _finish_times((2.29, 1, None, CURVE), [(0, 0.5, COMPUTE, ((0, 1),))] + [(0, 1.0, COMPUTE, ((0, 1),))] * 3)
    assert times == pytest.approx([first_s] + [first_s + 0.5 / 0.54] * 3)


def test_the_curve_leaves_communication_threads_on_the_pools_own_parallelism():
    # 4 compute threads (on the curve: 0.31 each) and a 4-thread collective at min(1, 2.29 / 4)
    interference = Interference(4, {COLLECTIVE: 1.0}, {COLLECTIVE: 1.0})
    times = _finish_times((2.29, 1, interference, CURVE),
                          [(0, 1.0, COMPUTE, ((0, 1),))] * 4 + [(0, 1.0, COLLECTIVE, ((0, 4),))])
    assert times == pytest.approx([1 / 0.31] * 4 + [1 / (2.29 / 4)])


def test_the_engine_plays_a_costs_pool_curve_for_every_plan():
    # 4 data-parallel ranks on one host of P = 2 compute every pass at once (free links keep them in
    # step), so with the curve (P_round 1.0 at 4 threads) each pass takes twice what the pool gives
    workload = toy_workload(4, num_params=1000)
    topology = Topology(1, 4, link(0.0, 1e9), link(0.0, 1e9))
    compute_s = {}
    for name, curve in (("pool", None), ("curve", PoolCurve(2, 2.0, 1.0, 4))):
        costs = _SharedHostCosts(Interference(4, {COLLECTIVE: 1.0}, {COLLECTIVE: 1.0}), allreduce_s=0.0)
        costs.pool_curve = curve
        _, spans = run_grid(workload, topology, costs, 4, 1, 64)
        passes = spans[spans["stream"] == "compute"]
        compute_s[name] = (passes["end_s"] - passes["start_s"]).sum()
    assert compute_s["curve"] == pytest.approx(2 * compute_s["pool"])


def _memory_finish_times(jobs, contention_ranks=2):
    """Run `jobs` = [(start_s, work_s, memory_contention)] as one-thread compute jobs on a host with
    cores to spare (P = 4); their finish times in order."""
    return _finish_times((4.0, 1), [(start_s, work_s, COMPUTE, ((0, 1),), contention)
                                    for start_s, work_s, contention in jobs], contention_ranks=contention_ranks)


def test_a_memory_bound_pass_runs_at_its_alone_time_while_no_other_runs():
    # beside a plain compute job (not memory-bound) it keeps rate 1
    assert _memory_finish_times([(0, 1.0, 1.5), (0, 2.0, None)]) == pytest.approx([1.0, 2.0])


def test_memory_bound_passes_at_once_each_pay_their_contention():
    assert _memory_finish_times([(0, 1.0, 1.5), (0, 1.0, 1.5)]) == pytest.approx([1.5, 1.5])
    # a pass measured not to slow (s = 1) still counts as the other's contender
    assert _memory_finish_times([(0, 1.0, 2.0), (0, 3.0, 1.0)]) == pytest.approx([2.0, 3.0])


def test_contention_follows_the_overlap_of_staggered_passes():
    # s = 2: A alone for 0.5 s (0.5 left), then both at 1/2: A ends at 1.5, B has done 0.5 and
    # finishes alone at rate 1 by 2.0
    assert _memory_finish_times([(0, 1.0, 2.0), (0.5, 1.0, 2.0)]) == pytest.approx([1.5, 2.0])


def test_contention_scales_with_the_share_of_the_ranks_that_timed_it():
    # timed with 3 ranks at once: one other pass open gives half the slowdown, 1 + (2 - 1) / 2
    assert _memory_finish_times([(0, 1.0, 2.0), (0, 10.0, None), (0, 2.0, 1.0)], contention_ranks=3) == \
        pytest.approx([1.5, 10.0, 2.0])


class _ContendedCosts(_SharedHostCosts):
    """A shared host whose update was timed 1.5x slower with both ranks at once than alone."""

    def __init__(self):
        super().__init__(Interference(2, {COLLECTIVE: 1.0}, {COLLECTIVE: 1.0}), allreduce_s=0.0)
        self.fixed_optimizer_s = 0.003
        self.memory_contention_ranks = 2

    def memory_contention(self, phase, num_params, layers):
        return 1.5


def test_the_engine_plays_a_memory_bound_update_alone_unless_another_runs_with_it():
    # two model-parallel ranks (G = 1 x W = 2) update at different times: each plays the alone
    # time, 3 ms / 1.5; two data-parallel replicas (G = 2) update together: each the played 3 ms
    workload = toy_workload(4, num_params=1000)
    topology = Topology(1, 2, link(0.0, 1e9), link(0.0, 1e9))
    for groups, workers, update_s in ((1, 2, 0.002), (2, 1, 0.003)):
        _, spans = run_grid(workload, topology, _ContendedCosts(), groups, workers, 16)
        updates = spans[spans["kind"] == "opt"]
        assert len(updates) == 2
        assert (updates["end_s"] - updates["start_s"]).tolist() == pytest.approx([update_s] * 2)
