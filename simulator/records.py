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
    frame = pd.DataFrame(spans if isinstance(spans, list) else list(spans), columns=list(SPAN_FIELDS))
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


def makespan_s(spans) -> float:
    """The latest span end (0 without spans); an extended run's (`ExtendedSpans`) without building it."""
    known = getattr(spans, "makespan_s", None)
    return known if known is not None else max((span[5] for span in spans), default=0.0)


def device_breakdown(spans, num_ranks: int, step_time_s: float) -> list[dict]:
    """Per-rank compute_s, comm_s (exposed), idle_s and comm_busy_s. An extended run
    (`simulator.steady_extension.ExtendedSpans`) covers what its played spans cover plus, `periods`
    times, what they cover in one steady period (its spans are those copies), so it is measured on
    the played spans and that period alone."""
    parts = getattr(spans, "periodic_parts", None)
    played = spans if parts is None else parts[0]
    compute, busy, comm = _coverage_s(played, num_ranks)
    if parts is not None:
        _, window_s, period_s, periods = parts
        start_s, end_s = window_s + period_s, window_s + 2 * period_s
        clipped = [(span[0], span[1], None, None, max(span[4], start_s), min(span[5], end_s))
                   for span in played if span[4] < end_s and span[5] > start_s]
        compute, busy, comm = (total + periods * added
                               for total, added in zip((compute, busy, comm), _coverage_s(clipped, num_ranks)))
    return [{"rank": rank, "compute_s": float(compute[rank]), "comm_s": float(busy[rank] - compute[rank]),
             "idle_s": max(step_time_s - float(busy[rank]), 0.0), "comm_busy_s": float(comm[rank])}
            for rank in range(num_ranks)]


def _coverage_s(spans, num_ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank, the time covered by its compute spans, by all its spans and by the others."""
    if spans:
        ranks, streams, _names, _kinds, starts, ends, *_rest = zip(*spans)
    else:
        ranks = streams = starts = ends = ()
    ranks, starts, ends = np.array(ranks, dtype=np.int64), np.array(starts, dtype=float), np.array(ends, dtype=float)
    computing = np.array([stream == "compute" for stream in streams], dtype=bool)
    order = np.lexsort((ends, starts, ranks))
    ranks, starts, ends, computing = ranks[order], starts[order], ends[order], computing[order]
    bounds = np.searchsorted(ranks, np.arange(num_ranks + 1))
    covered = np.zeros((3, num_ranks))
    for rank in range(num_ranks):
        own = slice(bounds[rank], bounds[rank + 1])
        rank_starts, rank_ends, compute = starts[own], ends[own], computing[own]
        covered[:, rank] = (union_length_s(rank_starts[compute], rank_ends[compute]),
                            union_length_s(rank_starts, rank_ends),
                            union_length_s(rank_starts[~compute], rank_ends[~compute]))
    return covered[0], covered[1], covered[2]


def compute_busy_s(spans, num_ranks: int) -> list[float]:
    """Per rank, the summed durations of its compute spans (an extended run's as `device_breakdown`
    measures it: the played spans plus `periods` times the spans that start in one period)."""
    parts = getattr(spans, "periodic_parts", None)
    busy = [0.0] * num_ranks
    for rank, stream, _name, _kind, start, end, *_rest in (spans if parts is None else parts[0]):
        if stream == "compute":
            busy[rank] += end - start
    if parts is not None:
        played, start_s, period_s, periods = parts
        for rank, stream, _name, _kind, start, end, *_rest in played:
            if stream == "compute" and start_s <= start < start_s + period_s:
                busy[rank] += periods * (end - start)
    return busy


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
