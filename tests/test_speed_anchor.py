"""validator.speed_anchor and ProfileCosts.speed_factor: the machine's speed in a launch relative
to its calibration, and the prediction rescaled to it."""

import copy
import statistics

import pytest

from simulator.compare import with_strategy
from simulator.model_source import resolve_workload
from simulator.pass_jitter import PassJitter
from simulator.profile_costs import profile_costs
from simulator.scenario import load_scenario
from simulator.simulate import simulate

pytest.importorskip("torch")

from validator.speed_anchor import calibration_anchor_s, launch_speed_ratio  # noqa: E402

PROFILE = "reports/profiles/mlp_cpu_ws2.json"


def _costs():
    scenario = load_scenario("scenarios/validation/mlp_cpu.yaml", ["cluster.gpus_per_node=2"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    return scenario, workload, profile_costs(PROFILE, workload)


def test_calibration_anchor_is_the_median_pass_with_all_ranks_at_once():
    rows = ((0.010, 0.030), (0.020, 0.050), (0.012, 0.014))
    jitter = PassJitter(batch_size=16, levels={2: ((1.0, 1.0),) * 3}, times_s={2: rows, 1: ((9.0,),)})
    assert calibration_anchor_s(jitter, 2) == pytest.approx(statistics.median([0.010, 0.030, 0.020, 0.050,
                                                                                0.012, 0.014]))
    assert calibration_anchor_s(jitter, 4) is None  # not measured at that world size
    assert calibration_anchor_s(None, 2) is None    # a profile without pass jitter


def test_launch_ratio_pools_every_rank_and_is_above_one_when_slower_than_calibration():
    assert launch_speed_ratio([[0.02, 0.03], [0.04]], calibration_s=0.02) == pytest.approx(1.5)
    assert launch_speed_ratio([[0.01], [0.01, 0.012]], calibration_s=0.02) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        launch_speed_ratio([[], []], calibration_s=0.02)


def test_speed_factor_scales_compute_update_and_weight_passes_but_not_communication():
    _, _, costs = _costs()
    scaled = copy.copy(costs)
    scaled.speed_factor = 1.7
    for phase in "FB":
        assert scaled.compute_s(1, phase, 16) == pytest.approx(1.7 * costs.compute_s(1, phase, 16))
    assert scaled.optimizer_s(100_000) == pytest.approx(1.7 * costs.optimizer_s(100_000))
    assert scaled.weight_pass_s("stash", 100_000) == pytest.approx(1.7 * costs.weight_pass_s("stash", 100_000))
    assert scaled.p2p_s(65536) == costs.p2p_s(65536)
    assert scaled.allreduce_s(1 << 20, 2) == costs.allreduce_s(1 << 20, 2)


@pytest.mark.parametrize("kind", ["dp", "mp"])
def test_a_slower_machine_predicts_a_slower_step(kind):
    scenario, workload, costs = _costs()
    variant = with_strategy(scenario, kind, None)
    base_s = simulate(variant, costs=costs, workload=workload).step_time_s
    slower = copy.copy(costs)
    slower.speed_factor = 2.0
    slow_s = simulate(variant, costs=slower, workload=workload).step_time_s
    assert slow_s > 1.3 * base_s
    if kind == "dp":  # its allreduce keeps its calibrated time: less than twice the step
        assert slow_s < 2.0 * base_s
