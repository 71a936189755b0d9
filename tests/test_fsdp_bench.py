"""FSDP2's host work per collective (validator/fsdp_bench.py): the closed form that turns two unit
shapes' measured step-time slopes into the profile's `fsdp` (a + b x tensors), and the benchmark
itself on 2 gloo ranks."""

import pytest

torch = pytest.importorskip("torch")

from simulator.profile import AlphaBeta  # noqa: E402
from validator.fsdp_bench import LINEARS_PER_UNIT, UNIT_COUNTS, WIDTH, host_work, time_fsdp_units  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402

ALLGATHER = AlphaBeta(latency_s=5e-4, bandwidth_bytes_per_s=1e9)
ALLREDUCE = AlphaBeta(latency_s=8e-4, bandwidth_bytes_per_s=5e8)


def shape(tensors: int, params: int, per_collective_s: float) -> dict:
    """A unit whose step time is its collectives as the fits price them plus 3 x `per_collective_s`."""
    bare_s = 2 * ALLGATHER.time_s(4 * params / 2) + ALLREDUCE.time_s(4 * params)
    return {"tensors": tensors, "unit_params": params, "unit_s": bare_s + 3 * per_collective_s}


def test_host_work_is_the_units_slope_less_its_priced_collectives_a_plus_b_per_tensor():
    """u = 2 allgather(4 P / s) + allreduce(4 P) + 3 (a + b T) (full shard; gloo reduce-scatters as an
    allreduce of the whole buffer), P the unit's fp32 parameters, T its tensors, s = 2 ranks."""
    a, b = 1.0e-3, 5e-5
    shapes = [shape(2, 4160, a + 2 * b), shape(8, 16640, a + 8 * b)]
    assert host_work(shapes, 2, ALLGATHER.time_s, ALLREDUCE.time_s) == pytest.approx(
        {"collective_overhead_s": a, "per_tensor_s": b})
    assert host_work(shapes[::-1], 2, ALLGATHER.time_s, ALLREDUCE.time_s) == pytest.approx(
        {"collective_overhead_s": a, "per_tensor_s": b})  # the order of the shapes does not matter


def test_host_work_is_never_negative():
    """Units no slower than their bare collectives, or a wider unit faster per collective than a
    narrow one (noise): no host work, not a negative one."""
    slow_narrow = [shape(2, 4160, 2e-3), shape(8, 16640, 1e-3)]
    assert host_work(slow_narrow, 2, ALLGATHER.time_s, ALLREDUCE.time_s) == pytest.approx(
        {"collective_overhead_s": 2e-3, "per_tensor_s": 0.0})
    nothing = [shape(2, 4160, -1e-3), shape(8, 16640, -1e-3)]
    assert host_work(nothing, 2, ALLGATHER.time_s, ALLREDUCE.time_s) == {"collective_overhead_s": 0.0,
                                                                          "per_tensor_s": 0.0}


def _units(rank):
    return time_fsdp_units("cpu", steps=3, warmup=1, rounds=1)


@pytest.mark.slow
def test_the_benchmark_times_fsdp2_stacks_on_two_ranks_and_every_rank_reports_rank_0s_figures():
    first, second = spawn(_units, (), LaunchConfig(2, timeout_s=120))
    assert first == second
    assert [s["tensors"] for s in first] == [2 * linears for linears in LINEARS_PER_UNIT]
    assert [s["unit_params"] for s in first] == [linears * (WIDTH * WIDTH + WIDTH) for linears in LINEARS_PER_UNIT]
    low, high = UNIT_COUNTS
    for measured in first:
        assert set(measured["fsdp_step_s"]) == set(measured["local_step_s"]) == set(UNIT_COUNTS)
        # which stack is slower is a timing, left to benchmarks/bench_fsdp_validation.py: on a loaded
        # host a 3-step median can invert; here every figure is a real, positive duration
        for step_s in (*measured["fsdp_step_s"].values(), *measured["local_step_s"].values()):
            assert 0 < step_s < 60
        fsdp, local = measured["fsdp_step_s"], measured["local_step_s"]
        assert measured["unit_s"] == pytest.approx(((fsdp[high] - fsdp[low]) - (local[high] - local[low])) / (high - low))


def test_validate_notes_an_fsdp2_plan_predicted_from_a_profile_without_its_host_work():
    from types import SimpleNamespace

    from simulator import load_scenario, simulate
    from tests.test_fsdp_runtime import megatron_scenario
    from validator.validate import _Case, fsdp_profile_notes

    def case(sharding):
        plan = simulate(load_scenario(megatron_scenario(sharding))).plan
        return _Case("megatron", f"megatron:{sharding}", plan, None, None)

    full, ddp = case("full_shard"), case("no_shard")
    (note,) = fsdp_profile_notes([full, ddp], SimpleNamespace(fsdp=None), "p.json")
    assert note.startswith("p.json: no fsdp section, so megatron:full_shard is predicted without")
    assert note.endswith("calibrate with --fsdp to count it")
    assert fsdp_profile_notes([ddp], SimpleNamespace(fsdp=None), "p.json") == []  # DDP has no FSDP2 work
    assert fsdp_profile_notes([full], SimpleNamespace(fsdp=object()), "p.json") == []
