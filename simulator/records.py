"""Analysis of the engine's span records: the span table, per-device time split and the summary.

Per device: compute_s is the busy time of its compute stream; comm_s is the time communication
(collectives or sends of this rank) was running while compute was not (exposed communication);
idle_s is the rest of the step. The three add up to the step time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.spans import SPAN_FIELDS


def span_table(spans: list[tuple]) -> pd.DataFrame:
    """Spans as a DataFrame (columns SPAN_FIELDS plus duration_s), sorted by rank and start."""
    frame = pd.DataFrame(spans, columns=list(SPAN_FIELDS))
    frame["duration_s"] = frame["end_s"] - frame["start_s"]
    return frame.sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(drop=True)


def union_length_s(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i]), `starts` ascending: each adds
    what it reaches beyond the furthest end before it."""
    if len(starts) == 0:
        return 0.0
    reach = np.maximum.accumulate(ends)
    before = np.concatenate(([-np.inf], reach[:-1]))
    return float(np.clip(ends - np.maximum(starts, before), 0.0, None).sum())


def device_breakdown(spans: list[tuple], num_ranks: int, step_time_s: float) -> list[dict]:
    """Per-rank compute_s, comm_s (exposed), idle_s and comm_busy_s."""
    if spans:
        ranks, streams, _names, _kinds, starts, ends, *_rest = zip(*spans)
    else:
        ranks = streams = starts = ends = ()
    ranks, starts, ends = np.array(ranks, dtype=np.int64), np.array(starts, dtype=float), np.array(ends, dtype=float)
    computing = np.array([stream == "compute" for stream in streams], dtype=bool)
    order = np.lexsort((ends, starts, ranks))
    ranks, starts, ends, computing = ranks[order], starts[order], ends[order], computing[order]
    bounds = np.searchsorted(ranks, np.arange(num_ranks + 1))
    rows = []
    for rank in range(num_ranks):
        own = slice(bounds[rank], bounds[rank + 1])
        rank_starts, rank_ends, compute = starts[own], ends[own], computing[own]
        compute_s = union_length_s(rank_starts[compute], rank_ends[compute])
        busy_s = union_length_s(rank_starts, rank_ends)
        rows.append({
            "rank": rank,
            "compute_s": compute_s,
            "comm_s": busy_s - compute_s,
            "idle_s": max(step_time_s - busy_s, 0.0),
            "comm_busy_s": union_length_s(rank_starts[~compute], rank_ends[~compute]),
        })
    return rows


def stage_time_split(devices: list[dict], step_time_s: float) -> dict[int, dict[str, float]]:
    """Per pipeline stage, the mean over its ranks (`devices` rows with "stage") of the shares of the
    step: "bubble_fraction", idle with neither compute nor communication running (waiting for
    work: the pipeline bubble, (p - 1) / (m + p - 1) of GPipe and 1F1B on uniform stages, Huang et
    al., GPipe, NeurIPS 2019), and "exposed_comm_fraction", communicating while not computing
    (`device_breakdown`'s idle_s and comm_s, the latter's rounding below 0 clipped). Their sum is the
    share of the step the stage's compute is idle."""
    shares: dict[int, list[tuple[float, float]]] = {}
    for row in devices:
        shares.setdefault(row["stage"], []).append(
            (row["idle_s"] / step_time_s, max(row["comm_s"], 0.0) / step_time_s) if step_time_s > 0 else (0.0, 0.0))
    return {stage: {"bubble_fraction": sum(idle for idle, _ in pairs) / len(pairs),
                    "exposed_comm_fraction": sum(comm for _, comm in pairs) / len(pairs)}
            for stage, pairs in shares.items()}
