"""FSDP2's host work per collective (validator/fsdp_bench.py): the closed form that turns a unit's
measured step-time slope into the profile's `fsdp.collective_overhead_s`, and the benchmark itself
on 2 gloo ranks."""

import pytest

torch = pytest.importorskip("torch")

from simulator.profile import AlphaBeta  # noqa: E402
from validator.fsdp_bench import UNIT_PARAMS, collective_overhead_s, time_fsdp_unit  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402


def test_the_unit_slope_less_its_collectives_as_the_profile_prices_them_over_three():
    """u = 2 allgather(4 P / s) + allreduce(4 P) + 3 overhead (full shard; gloo reduce-scatters as an
    allreduce of the whole buffer), P = the unit's fp32 parameters, s = 2 ranks."""
    allgather = AlphaBeta(latency_s=5e-4, bandwidth_bytes_per_s=1e9)
    allreduce = AlphaBeta(latency_s=8e-4, bandwidth_bytes_per_s=5e8)
    bare_s = 2 * (5e-4 + 2 * UNIT_PARAMS / 1e9) + 8e-4 + 4 * UNIT_PARAMS / 5e8
    unit_s = bare_s + 3 * 1.2e-3
    assert collective_overhead_s(unit_s, 2, allgather.time_s, allreduce.time_s) == pytest.approx(1.2e-3)
    # a unit no slower than its bare collectives: no host work, not a negative one
    assert collective_overhead_s(0.5 * bare_s, 2, allgather.time_s, allreduce.time_s) == 0.0


def _unit(rank):
    return time_fsdp_unit("cpu", steps=3, warmup=1, rounds=1)


@pytest.mark.slow
def test_the_benchmark_times_fsdp2_stacks_on_two_ranks_and_every_rank_reports_rank_0s_figures():
    first, second = spawn(_unit, (), LaunchConfig(2, timeout_s=120))
    assert first == second
    assert set(first["fsdp_step_s"]) == set(first["local_step_s"]) == {2, 8}
    assert first["unit_params"] == UNIT_PARAMS
    # six more FSDP2 units, each with 3 collectives: a longer step than six more local units
    assert first["fsdp_step_s"][8] - first["fsdp_step_s"][2] > first["local_step_s"][8] - first["local_step_s"][2]
    assert first["unit_s"] > 0
