"""Per-stage properties of a schedule, read off its per-rank order (no timing needed).

- microbatches_in_flight: the most (chunk, micro-batch) pairs whose forward is done and whose
  backward is not, at any point of the rank's order (activations held at once).
- weight_staleness: the most updates ("U") between a micro-batch's forward and its backward on
  the rank (steady state of the asynchronous kinds: p - 1 - k on stage k; 0 with a flush).
- stashed_weight_versions: with weight stashing (PipeDream), the most weight versions kept besides
  the current weights: distinct versions used by in-flight forwards that are no longer current
  (p - 1 - k on stage k; PipeDream holds p - k versions in all). 0 without stashing.
- extra_weight_copies: SpecTrain's one buffer of predicted weights per stage, else 0.

Also the whole steps an asynchronous run replays to measure its steady state
(`steady_state_steps`, `simulator.schedules.steady_state`).
"""

from __future__ import annotations

import math
from collections import Counter

from simulator.schedules.ir import BACKWARD, FORWARD, UPDATE, Schedule


def in_flight_counts(schedule: Schedule) -> dict[str, list[int]]:
    """Per stage (rank of `schedule`), at the worst point of its order: `microbatches_in_flight`, the
    most distinct micro-batches some chunk of which has run its forward and not yet its backward,
    and `chunk_passes_in_flight`, the most such (chunk, micro-batch) pairs (`stage_metrics`' count,
    what activation memory follows). They differ only with v > 1 chunks a rank (interleaved 1F1B,
    Narayanan et al. SC'21 sec. 2.2), where a micro-batch can be in flight in up to v chunks."""
    counts: dict[str, list[int]] = {"microbatches_in_flight": [], "chunk_passes_in_flight": []}
    for ops in schedule.ranks:
        in_flight: set[tuple[int, int]] = set()
        chunks_of: dict[int, int] = {}  # micro-batch -> its chunks in flight
        most_microbatches = most_passes = 0
        for op in ops:
            key = (op.chunk, op.microbatch)
            if op.phase == FORWARD and key not in in_flight:
                in_flight.add(key)
                chunks_of[op.microbatch] = chunks_of.get(op.microbatch, 0) + 1
            elif op.phase == BACKWARD and key in in_flight:
                in_flight.discard(key)
                chunks_of[op.microbatch] -= 1
                if not chunks_of[op.microbatch]:
                    del chunks_of[op.microbatch]
            most_passes = max(most_passes, len(in_flight))
            most_microbatches = max(most_microbatches, len(chunks_of))
        counts["microbatches_in_flight"].append(most_microbatches)
        counts["chunk_passes_in_flight"].append(most_passes)
    return counts


def stage_metrics(schedule: Schedule, weight_stashing: bool) -> dict[str, list[int]]:
    """Lists indexed by stage (rank): see the module docstring."""
    metrics = {"microbatches_in_flight": [], "stashed_weight_versions": [], "extra_weight_copies": [],
               "weight_staleness": []}
    for ops in schedule.ranks:
        version = 0
        in_flight: dict[tuple[int, int], int] = {}
        in_flight_per_version: Counter[int] = Counter()  # weight version -> micro-batches using it
        most_in_flight = staleness = stashed = 0
        for op in ops:
            key = (op.chunk, op.microbatch)
            if op.phase == FORWARD:
                in_flight[key] = version
                in_flight_per_version[version] += 1
            elif op.phase == BACKWARD:
                used = in_flight.pop(key)
                staleness = max(staleness, version - used)
                in_flight_per_version[used] -= 1
                if not in_flight_per_version[used]:
                    del in_flight_per_version[used]
            elif op.phase == UPDATE:
                version += 1
            most_in_flight = max(most_in_flight, len(in_flight))
            stashed = max(stashed, len(in_flight_per_version) - (version in in_flight_per_version))
        metrics["microbatches_in_flight"].append(most_in_flight)
        metrics["weight_staleness"].append(staleness)
        metrics["stashed_weight_versions"].append(stashed if weight_stashing else 0)
        metrics["extra_weight_copies"].append(1 if schedule.kind == "spectrain" else 0)
    return metrics


MEASURED_MICROBATCHES_PER_STAGE = 4
"""The steady-state window holds at least this many micro-batches a stage (`measured_steps`)."""


def measured_steps(num_stages: int, num_microbatches: int) -> int:
    """J: the whole steps the steady-state window spans, at least 4p micro-batches (J = 1 once m >=
    4p). Where forward and backward streams share links the completions need not settle into one
    step's rhythm (16 stages over 10 GbE at m = 1: intervals of 59, 519, 59, 407 ... ms), so one
    step's m completions would measure chance; J steps' mean does not."""
    return max(1, math.ceil(MEASURED_MICROBATCHES_PER_STAGE * num_stages / num_microbatches))


def steady_state_steps(num_stages: int, num_microbatches: int) -> int:
    """K: whole steps of m micro-batches back to back with n = K m >= 3p + J m + 1 (a fill of 2p, the
    J steps measured, a drain of p + 1), what `simulator.schedules.steady_state` simulates; 1 where
    one step holds the fill, a window of 4p micro-batches and the drain (`steady_window`)."""
    p, m = num_stages, num_microbatches
    if m >= (MEASURED_MICROBATCHES_PER_STAGE + 3) * p + 1:
        return 1
    return math.ceil((3 * p + 1) / m) + measured_steps(p, m)


def steady_window(num_stages: int, num_microbatches: int) -> tuple[int, int]:
    """(a, b): the steady-state step is m x (completion(b) - completion(a)) / (b - a), a = 2p - 1
    after the fill. b = a + J m (J whole steps, `measured_steps`) in a run of `steady_state_steps`;
    where one step of m >= 7p + 1 holds the fill, 4p micro-batches and the drain, b = a + 4p inside
    that step (every micro-batch of an asynchronous pipeline is alike: it updates on its own, no
    flush nor step boundary), so the step's own play is measured and no longer run is needed."""
    p, m = num_stages, num_microbatches
    first = 2 * p - 1
    if steady_state_steps(p, m) == 1:
        return first, first + MEASURED_MICROBATCHES_PER_STAGE * p
    return first, first + measured_steps(p, m) * m
