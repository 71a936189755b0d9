"""Analysis of the engine's span records: the span table, per-device time split and the summary.

Per device: compute_s is the busy time of its compute stream; comm_s is the time communication
(collectives or sends of this rank) was running while compute was not (exposed communication);
idle_s is the rest of the step. The three add up to the step time.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from simulator.engine import SPAN_FIELDS


def span_table(spans: list[tuple]) -> pd.DataFrame:
    """Spans as a DataFrame (columns SPAN_FIELDS plus duration_s), sorted by rank and start."""
    frame = pd.DataFrame(spans, columns=list(SPAN_FIELDS))
    frame["duration_s"] = frame["end_s"] - frame["start_s"]
    return frame.sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(drop=True)


def union_length_s(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def device_breakdown(spans: list[tuple], num_ranks: int, step_time_s: float) -> list[dict]:
    """Per-rank compute_s, comm_s (exposed), idle_s and comm_busy_s."""
    compute: dict[int, list] = defaultdict(list)
    communication: dict[int, list] = defaultdict(list)
    for rank, stream, _name, _kind, start, end, *_rest in spans:
        (compute if stream == "compute" else communication)[rank].append((start, end))
    rows = []
    for rank in range(num_ranks):
        compute_s = union_length_s(compute[rank])
        busy_s = union_length_s(compute[rank] + communication[rank])
        rows.append({
            "rank": rank,
            "compute_s": compute_s,
            "comm_s": busy_s - compute_s,
            "idle_s": max(step_time_s - busy_s, 0.0),
            "comm_busy_s": union_length_s(communication[rank]),
        })
    return rows
