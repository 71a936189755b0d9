"""Step time and per-stage figures of a simulated pipeline plan (the summary's "pipeline" key).

Analysis of engine output, so it imports the engine (and is not imported by the package).

Step time. Synchronous kinds (gpipe, 1f1b, interleaved_1f1b) flush: a step is the plan's
makespan, from the first forward to the last update. Asynchronous kinds (pipedream, spectrain,
delayed_gradient) never flush, so one step's makespan (fill + drain) is not what a long run
sees. Their step time is the time to process one global batch in steady state: the same pipeline
is simulated on n = K m micro-batches of the same size b (K whole steps back to back, n >= 3p +
J m + 1), micro-batch i completes when its last compute (backward, update) ends, and

    step_time = (completion(2p - 1 + J m) - completion(2p - 1)) / J,

the mean of J whole steps (`analysis.measured_steps`: at least 4p micro-batches, J = 1 once m >=
4p) well after the fill (2p micro-batches) and before the drain (the last p + 1). Where one step
holds all three (m >= 7p + 1) its own play is measured instead, over the 4p micro-batches after
the fill, scaled by m / 4p (`analysis.steady_window`). The device breakdown and the bubble
fractions cover that window, its spans' times so scaled (a mean step; a trace of such a run
shows the window so scaled).

bubble_fraction of a stage: the share of the step in which it neither computes nor communicates
(mean over the G replicas of the stage; `simulator.records.stage_time_split`), exposed_comm_fraction
the share in which it only communicates; with uniform stages and free links GPipe and 1F1B give a
bubble of (p - 1) / (m + p - 1).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.engine import Engine
from simulator.records import compute_busy_s
from simulator.schedules.analysis import steady_state_steps, steady_window
from simulator.strategies.pipeline import compile_pipeline_plan, pipeline_config
from simulator.units import whole

STEP_DEFINITIONS = {
    False: "flush: makespan of one step, first forward to last update",
    True: "steady state: time between the completions of micro-batches 2p-1 and 2p-1+Jm of a run of "
          "whole steps back to back (no flush), over J (J steps of at least 4p micro-batches in all); "
          "with m >= 7p+1, of 2p-1 and 6p-1 of the step's own run, times m/4p",
}


def pipeline_summary(scenario, workload, topology, costs, plan, spans: list[tuple], makespan_s: float):
    """(spans to break down per device, step time, the "pipeline" summary dict)."""
    meta = plan.meta
    asynchronous = meta["asynchronous"]
    window_spans, step_s = spans, makespan_s
    p, m = plan.workers_per_group, meta["num_microbatches"]
    if asynchronous and steady_state_steps(p, m) == 1:  # the step's own play holds the window
        window_spans, step_s = steady_state_window(spans, p, m)
    elif asynchronous:
        window_spans, step_s = _steady_state(scenario, workload, topology, costs, meta.get("symmetry"))
    busy = compute_busy_s(window_spans, plan.num_ranks)
    stages = []
    for j in range(p):  # over the replicas simulated (replica 0 alone in a folded run)
        idle = [1.0 - busy[g * p + j] / step_s if step_s > 0 else 0.0 for g in range(plan.num_ranks // p)]
        stages.append({"stage": j, **{key: meta[key][j] for key in (
            "microbatches_in_flight", "stashed_weight_versions", "extra_weight_copies", "weight_staleness")},
            "bubble_fraction": sum(idle) / len(idle)})
    return window_spans, step_s, {
        "schedule": meta["schedule_kind"],
        "asynchronous": asynchronous,
        "num_microbatches": m,
        "microbatch_size": whole(plan.group_batch * _cp_degree(meta) / m),  # samples; cp splits each one's sequence
        "num_virtual_stages": meta["num_virtual_stages"],
        "weight_stashing": meta["weight_stashing"],
        "step_time_definition": STEP_DEFINITIONS[asynchronous],
        "one_step_makespan_s": makespan_s,
        "steady_state_interval_s": step_s / m if asynchronous else None,
        "stages": stages,
    }


def _cp_degree(meta) -> int:
    """Context-parallel ranks c per sequence of a megatron plan (1 otherwise): its group_batch counts
    each rank's share, B / (d c), while every micro-batch holds whole samples, their sequences split c ways."""
    return meta.get("tensor", {}).get("cp_degree", 1)


def _steady_state(scenario, workload, topology, costs, symmetry) -> tuple[list[tuple], float]:
    """(spans of the steady-state window, shifted to start at 0; its length); `symmetry`: the step
    plan's fold (replica 0 standing for every replica), or None."""
    plan = steady_state_plan(scenario, workload, topology, costs, symmetry)
    spans = Engine(plan, topology, costs, scenario.strategy.num_parameter_servers).run().spans
    return steady_state_window(spans, plan.workers_per_group, scenario.strategy.num_microbatches)


def steady_state_plan(scenario, workload, topology, costs, symmetry=None):
    """The plan of K whole steps back to back (n = K m >= 3p + m + 1 micro-batches of the step's
    size) whose window `steady_state_window` measures; the validator runs this same plan (every
    rank: no `symmetry`)."""
    config = pipeline_config(scenario)
    p, m = config.num_stages, config.num_microbatches
    steps = steady_state_steps(p, m)
    longer = replace(config, num_microbatches=steps * m, global_batch_size=steps * config.global_batch_size)
    return compile_pipeline_plan(longer, workload, topology, costs, symmetry)


def microbatch_completions(spans) -> dict[int, float]:
    """Micro-batch -> end of its last compute span (any rank)."""
    completion: dict[int, float] = {}
    for _rank, stream, _name, _kind, _start, end, _size, microbatch in spans:
        if stream == "compute" and microbatch >= 0:
            completion[microbatch] = max(completion.get(microbatch, 0.0), end)
    return completion


def steady_state_window(spans, num_stages: int, num_microbatches: int) -> tuple[list[tuple], float]:
    """(spans clipped to [completion(a), completion(b)] of `steady_window`, shifted to start at 0 and
    their times scaled by m / (b - a); the mean step, the window's length so scaled)."""
    p, m = num_stages, num_microbatches
    a, b = steady_window(p, m)
    scale = m / (b - a)  # 1 / J for J whole steps
    completion = microbatch_completions(spans)
    first, last = completion[a], completion[b]
    window = []
    for rank, stream, name, kind, start, end, size, microbatch in spans:
        start, end = max(start, first), min(end, last)
        if end > start:
            window.append((rank, stream, name, kind, (start - first) * scale, (end - first) * scale, size, microbatch))
    return window, (last - first) * scale
