"""Compute inside the asynchronous cycle over the processor-sharing expectation (`cycle_compute`):
the expectation's closed forms, the profile section and its errors, the cost model's factor, the
engine playing it for asynchronous pipelines only, and the microbenchmark on two real ranks."""

import copy

import pytest

from simulator.document_reader import DocumentReader
from simulator.cycle_compute import (CycleCompute, asynchronous_compute_factor, cycle_efficiency,
                                     expected_steps, parse_cycle_compute)
from simulator.errors import ScenarioError
from simulator.host_sharing import PoolCurve
from simulator.profile import profile_from_dict
from simulator.profile_costs import ProfileCosts
from simulator.profile_host import ranks_have_own_cores, ranks_outnumber_cores
from tests.test_pipeline_plans import Costs, run
from tests.test_profile import document, workload

SECTION = {"efficiency": 0.8, "round_efficiencies": [0.78, 0.8, 0.83], "hop_compute_s": 0.008,
           "host_parallelism": 1.7}


def test_windows_apart_each_run_at_the_alone_rate():
    # two ranks, never computing at once: 0.5 s + 0.25 s at 100 steps/s alone
    windows = [[(0.0, 0.5, 40)], [(1.0, 1.25, 20)]]
    assert expected_steps(windows, 100.0, 2.0) == pytest.approx(75.0)
    assert cycle_efficiency(windows, 100.0, 2.0) == pytest.approx(60 / 75)


def test_windows_at_once_share_the_pools_parallelism():
    # four ranks computing 1 s together on a pool of 2: each at half the alone rate
    windows = [[(0.0, 1.0, 40)] for _ in range(4)]
    assert expected_steps(windows, 100.0, 2.0) == pytest.approx(4 * 100 * 0.5)
    # overlapping in part: [0, 1) alone, [1, 2) with the other (P = 1: half each), [2, 3) alone
    windows = [[(0.0, 2.0, 0)], [(1.0, 3.0, 0)]]
    assert expected_steps(windows, 10.0, 1.0) == pytest.approx(10 * (1 + 0.5 + 0.5 + 1))


def test_a_window_free_record_cannot_be_scored():
    with pytest.raises(ValueError, match="no steps"):
        cycle_efficiency([[], []], 100.0, 2.0)


def test_profile_reads_the_section_and_shared_hosts_scale_by_its_inverse():
    doc = copy.deepcopy(document())
    doc["cycle_compute"] = SECTION
    profile = profile_from_dict(doc)
    assert profile.cycle_compute.efficiency == 0.8
    assert profile.cycle_compute.round_efficiencies == (0.78, 0.8, 0.83)
    assert ProfileCosts(profile, workload(), shared_host=True).asynchronous_compute_factor == pytest.approx(1.25)
    # without `pass_jitter` levels the profile does not say whether each rank had a core: 1 / efficiency
    assert not ranks_have_own_cores(profile)
    # a dedicated device (no shared cores) and an older profile: no factor
    assert ProfileCosts(profile, workload()).asynchronous_compute_factor == 1.0
    assert ProfileCosts(profile_from_dict(document()), workload(), shared_host=True).asynchronous_compute_factor == 1.0


def _with_jitter_levels(levels: list[int]) -> dict:
    doc = copy.deepcopy(document())  # 4 ranks, compute_slowdown[4] = 2: the engine's pool P = 2
    doc["cycle_compute"] = SECTION  # the rounds' own P_round = 1.7, efficiency 0.8
    doc["pass_jitter"] = {"batch_size": 16,
                          "levels": {str(k): [[0.01] * k, [0.012] * k] for k in levels}}
    return doc


def test_ranks_outnumbering_cores_put_the_rounds_rate_on_the_pools_curve():
    # a calibration that also timed passes with 2 ranks at once (its host's cores) had more ranks
    # than cores: asynchronous compute x 1 / efficiency, and the pool's P for compute runs from
    # min(P, cores) = 2 at 2 threads to the rounds' P_round = 1.7 at all 4
    oversubscribed = profile_from_dict(_with_jitter_levels([2, 4]))
    assert ranks_outnumber_cores(oversubscribed)
    costs = ProfileCosts(oversubscribed, workload(), shared_host=True)
    assert costs.asynchronous_compute_factor == pytest.approx(1.25)
    assert costs.pool_curve == PoolCurve(cores=2, parallelism_at_cores=2.0, parallelism_all=1.7, world_size=4)
    assert costs.pool_curve.parallelism(3, costs.host_parallelism) == pytest.approx(1.85)
    # a core per rank (only the all-ranks level): no factor (since the thirtieth session), no curve
    own_cores = profile_from_dict(_with_jitter_levels([4]))
    assert not ranks_outnumber_cores(own_cores) and ranks_have_own_cores(own_cores)
    own = ProfileCosts(own_cores, workload(), shared_host=True)
    assert own.asynchronous_compute_factor == 1.0 and own.pool_curve is None
    # no rounds' pool recorded (older profiles): 1 / efficiency, no curve
    older = copy.deepcopy(_with_jitter_levels([2, 4]))
    del older["cycle_compute"]["host_parallelism"]
    costs = ProfileCosts(profile_from_dict(older), workload(), shared_host=True)
    assert costs.asynchronous_compute_factor == pytest.approx(1.25) and costs.pool_curve is None
    assert asynchronous_compute_factor(CycleCompute(efficiency=0.8)) == pytest.approx(1.25)
    assert asynchronous_compute_factor(CycleCompute(efficiency=0.8), core_per_rank=True) == 1.0


@pytest.mark.parametrize("field,bad", [("efficiency", 0.05), ("efficiency", "fast"), ("efficiency", -1),
                                       ("round_efficiencies", "0.8"), ("hop_compute_s", -0.1)])
def test_malformed_section_names_the_field(field, bad):
    doc = copy.deepcopy(document())
    doc["cycle_compute"] = {**SECTION, field: bad}
    with pytest.raises(ScenarioError, match=f"cycle_compute.{field}"):
        profile_from_dict(doc)


def test_missing_efficiency_names_the_field():
    doc = copy.deepcopy(document())
    doc["cycle_compute"] = {k: v for k, v in SECTION.items() if k != "efficiency"}
    with pytest.raises(ScenarioError, match="cycle_compute.efficiency"):
        profile_from_dict(doc)


class SharedHostCosts(Costs):
    """`Costs` on a shared host of 8 cores (more than the ranks: every pass at rate 1) whose
    asynchronous cycle computes at 1 / `factor` of the pool's rate."""

    def __init__(self, factor: float):
        super().__init__()
        self.host_parallelism = 8.0
        self.asynchronous_compute_factor = factor


@pytest.mark.parametrize("kind", ["pipedream", "spectrain", "delayed_gradient"])
def test_asynchronous_steps_stretch_by_the_factor(kind):
    # 3 stages of 2 layers, free links, no weight passes: the step is compute only, all of it scaled
    p, m = 3, 6
    plain = run(kind, p, m, [2] * p, costs=SharedHostCosts(1.0))
    slowed = run(kind, p, m, [2] * p, costs=SharedHostCosts(1.25))
    assert slowed.step_time_s == pytest.approx(1.25 * plain.step_time_s, rel=1e-9)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_synchronous_steps_ignore_the_factor(kind):
    p, m = 3, 6
    assert run(kind, p, m, [2] * p, costs=SharedHostCosts(1.25)).step_time_s == pytest.approx((m + p - 1) * 12)


def test_the_microbenchmark_on_two_real_ranks():
    """Two ranks on this host: the cycle's windows scored against the pool of the same rounds."""
    pytest.importorskip("torch")
    from validator.launch import LaunchConfig, spawn
    section = spawn(_measure_tiny_cycle, (), LaunchConfig(world_size=2))[0]
    parsed = parse_cycle_compute(DocumentReader("<test>"), {"cycle_compute": section})
    assert len(parsed.round_efficiencies) == 3 and parsed.hop_compute_s == 0.004
    assert 0.3 < parsed.efficiency < 1.7  # a broken integration is off by the number of ranks or more
    assert 0.5 < parsed.host_parallelism <= 2.0  # at most the ranks, even when the alone window ran slow


def _measure_tiny_cycle(rank):
    import torch
    from validator.cycle_compute_bench import measure_cycle_compute
    weight = torch.randn(128, 128)

    def step():
        torch.mm(weight, weight)
    return measure_cycle_compute([step], hop_compute_s=0.004, rounds=3, num_microbatches=10)
