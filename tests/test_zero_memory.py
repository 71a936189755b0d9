"""Sharded data parallelism's memory (simulator/strategies/zero.py): the model states of ZeRO's
Fig. 1 by stage, the per-unit transients the memory walk times (ZeRO-3's gathered units, FSDP
SHARD_GRAD_OP's shard beside its gathered units, FSDP2's gradient buffers), Megatron's fp32
gradients under bf16, and the LLaMA-3 70B FSDP scenario's fit. The toy plans are tests/test_zero.py's."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from tests.test_zero import ELEMENT, LAYERS, PARAMS, STATES, collectives, run


@pytest.mark.parametrize("stage, closed_form", [
    (0, lambda psi, nd: 16 * psi),
    (1, lambda psi, nd: 4 * psi + 12 * psi / nd),
    (2, lambda psi, nd: 2 * psi + 14 * psi / nd),
    (3, lambda psi, nd: 16 * psi / nd),
])
def test_model_states_follow_zero_figure_1(stage, closed_form):
    """Mixed-precision Adam, K = 12: (2 + 2 + K) Psi bytes of model states, sharded by stage."""
    psi, nd = LAYERS * PARAMS, 4
    plain, sharded = run(0).summary, run(stage).summary
    for row, row0 in zip(sharded["devices"], plain["devices"]):
        breakdown = row["memory_breakdown_bytes"]
        assert sum(breakdown[key] for key in STATES) == pytest.approx(closed_form(psi, nd))
        # the sharded states leave the peak; ZeRO-2 adds one bucket of gradients, ZeRO-3 two gathered
        # units (comm_buffers: the one computing at the activation peak and the one prefetched; a
        # unit's gradient forms later, as its activations go)
        transient = {0: 0, 1: 0, 2: psi * ELEMENT, 3: 2 * PARAMS * ELEMENT}[stage]
        assert breakdown["comm_buffers"] == pytest.approx(transient)
        saved = sum(row0["memory_breakdown_bytes"][key] for key in STATES) - closed_form(psi, nd)
        assert row["peak_memory_bytes"] == pytest.approx(row0["peak_memory_bytes"] - saved + transient)


def test_zero3_transients_are_timed_at_the_computes_they_serve():
    """Each gathered unit lives from the issue of its allgather (the end of the computes it waits
    for: the unit before it starts) to the end of its own pass; each unit's full gradient from the
    end of its backward to the end of the rank's next compute. Two gathered units at most at once."""
    from simulator.strategies.zero import unit_transient_events
    result = run(3, micro=2)
    plan, spans = result.plan, result.spans
    computes = sorted(zip(spans[(spans["rank"] == 0) & (spans["stream"] == "compute")]["start_s"],
                          spans[(spans["rank"] == 0) & (spans["stream"] == "compute")]["end_s"]))
    boundaries = {t for span in computes for t in span} | {0.0}
    events = unit_transient_events(plan, spans)[0]
    gathers = [a for a in collectives(result) if a.op == "allgather"]
    reduces = [a for a in collectives(result) if a.op == "reduce_scatter"]
    assert len(events) == 2 * (len(gathers) + len(reduces))
    assert all(time_s in boundaries for time_s, _delta, _category in events)
    assert sorted({delta for _t, delta, _c in events if delta > 0}) == [PARAMS * ELEMENT]  # a unit, fp16
    ordered = [a for a in collectives(result) if a.op in ("allgather", "reduce_scatter")]  # events' order
    for kinds, most in ((("allgather",), 2), (("allgather", "reduce_scatter"), 3)):
        chosen = [event for action, pair in zip(ordered, zip(events[0::2], events[1::2]))
                  if action.op in kinds for event in pair]
        live, worst = 0.0, 0.0
        for _time_s, delta, _category in sorted(chosen, key=lambda event: (event[0], event[1] > 0)):
            live += delta
            worst = max(worst, live)
        assert worst == most * PARAMS * ELEMENT and live == 0.0  # a gradient beside the next unit's pair
    assert unit_transient_events(run(2, micro=2).plan, spans) == {}  # ZeRO-2 adds its buffers at the peak


def test_shard_grad_op_keeps_the_shard_and_every_gathered_unit_until_its_backward():
    """FSDP SHARD_GRAD_OP keeps each rank's parameter shard all step (FSDP2's sharded parameters,
    FSDP1's local shard) and each unit's gathered parameters from its forward's allgather to the end
    of its backward: at the activation peak (the first backward) every unit is gathered, the whole
    weights beside the shard, W / d + W, and no unit's gradient has formed yet."""
    psi, nd = LAYERS * PARAMS, 4
    plain, result = run(0).summary, run(2, fsdp_sharding="shard_grad_op")
    breakdown = result.summary["devices"][0]["memory_breakdown_bytes"]
    assert breakdown["weights"] == pytest.approx(psi * ELEMENT / nd)
    assert breakdown["comm_buffers"] == pytest.approx(psi * ELEMENT)
    states = sum(breakdown[key] for key in STATES)
    assert states == pytest.approx(2 * psi / nd + 14 * psi / nd)  # ZeRO-2's sharded states, the weights too
    saved = sum(plain["devices"][0]["memory_breakdown_bytes"][key] for key in STATES) - states
    assert result.summary["devices"][0]["peak_memory_bytes"] == pytest.approx(
        plain["devices"][0]["peak_memory_bytes"] - saved + psi * ELEMENT)
    gathers, gradients = transient_events(result)
    assert len(gathers) == LAYERS and len(gradients) == LAYERS
    assert peak_of([event for pair in gathers for event in pair]) == LAYERS * PARAMS * ELEMENT


def transient_events(result) -> tuple[list, list]:
    """Rank 0's walk events (`unit_transient_events`), split per allgather (one pair) and per
    reduce-scatter (FSDP2: the unsharded gradient's pair, then the reduce-scatter buffer's)."""
    from simulator.strategies.zero import unit_transient_events
    events = iter(unit_transient_events(result.plan, result.spans)[0])
    gathers, gradients = [], []
    for action in collectives(result):
        if action.op == "allgather":
            gathers.append([next(events), next(events)])
        elif action.op == "reduce_scatter":
            gradients.append([next(events) for _ in range(4 if result.plan.meta["tensor"].get("fsdp_version") == 2 else 2)])
    assert next(events, None) is None
    return gathers, gradients


def peak_of(events) -> float:
    """Most bytes the events hold at once (frees before allocations at the same instant); all freed."""
    live = worst = 0.0
    for _time_s, delta, _category in sorted(events, key=lambda event: (event[0], event[1] > 0)):
        live += delta
        worst = max(worst, live)
    assert live == pytest.approx(0.0)
    return worst


def test_fsdp2_holds_the_unit_gradient_its_reduce_scatter_buffer_and_the_one_before_at_each_copy_in():
    """FSDP2 copies a unit's unsharded gradient into the reduce-scatter buffer after its backward, and
    keeps the previous unit's buffer until this reduce-scatter is issued: three gradient-sized
    buffers at once (torch `_fsdp_param_group.py`, `post_backward`); flat buffers (version 1) hold
    one unit's gradient at a time."""
    gradients2 = transient_events(run(3, fsdp_version=2, micro=2))[1]
    gradients1 = transient_events(run(3, fsdp_version=1, micro=2))[1]
    assert peak_of([event for group in gradients2 for event in group]) == 3 * PARAMS * ELEMENT
    assert peak_of([event for group in gradients1 for event in group]) == PARAMS * ELEMENT
    for (alloc, size, _), (copied, freed, _), (buffer_at, buffer, _), (buffer_freed, _, _) in gradients2:
        assert size == -freed == buffer == PARAMS * ELEMENT and alloc == buffer_at < copied < buffer_freed


@pytest.mark.parametrize("stage, closed_form", [(0, lambda psi, d: 18 * psi), (1, lambda psi, d: 6 * psi + 12 * psi / d)])
def test_megatron_keeps_and_reduces_fp32_gradients_under_bf16(stage, closed_form):
    """Megatron-LM's table of bytes a parameter (docs/distrib_optimizer.md), bf16 parameters with fp32
    gradients: 18 without the distributed optimizer, 6 + 12 / d with it; the gradients are reduced
    in fp32 (4 bytes a parameter), the updated bf16 parameters allgathered (2)."""
    psi, d = LAYERS * PARAMS, 4
    result = run(stage, dtype="bf16", overlap_backward=False)
    breakdown = result.summary["devices"][0]["memory_breakdown_bytes"]
    assert breakdown["weight_gradients"] == 4 * psi
    assert sum(breakdown[key] for key in STATES) == pytest.approx(closed_form(psi, d))
    reduced = [c for c in collectives(result) if c.op in ("allreduce", "reduce_scatter")]
    assert sum(c.size_bytes for c in reduced) == 4 * psi
    gathered = [c for c in collectives(result) if c.op == "allgather"]
    assert sum(c.size_bytes for c in gathered) == (2 * psi / d if stage else 0)


def test_llama3_70b_fsdp_scenario_fits_as_real_runs_do():
    from pathlib import Path
    scenario = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "llama3_70b_fsdp_h100.yaml")
    assert scenario.strategy.zero_stage == 3 and scenario.num_gpus == 64
    result = simulate(scenario)
    summary, psi = result.summary, result.workload.num_params
    assert psi == pytest.approx(70.6e9, rel=1e-2)
    row = summary["devices"][0]["memory_breakdown_bytes"]
    assert sum(row[key] for key in STATES) == pytest.approx(16 * psi / 64, rel=1e-3)
    assert summary["fits_in_memory"] and 0.3 < summary["mfu"] < 0.6
