"""A rank's memory over one step as a table: the running sum of its allocation events
(`simulator.memory.rank_memory`) per category, frees at an instant applied before allocations."""

from __future__ import annotations

from simulator.memory import CATEGORIES, RankMemory


def memory_timeline(memory: RankMemory, end_s: float | None = None):
    """Bytes in use per category over time (pandas DataFrame: time_s, CATEGORIES..., total_bytes)."""
    import pandas as pd
    current = dict.fromkeys(CATEGORIES, 0.0)
    rows = []
    for time_s, delta, category in sorted(memory.events, key=lambda event: (event[0], event[1] > 0)):
        current[category] += delta
        if rows and rows[-1]["time_s"] == time_s:
            rows[-1].update(current)
        else:
            rows.append({"time_s": time_s, **current})
    if end_s is not None and rows and end_s > rows[-1]["time_s"]:
        rows.append({**rows[-1], "time_s": end_s})
    frame = pd.DataFrame(rows, columns=["time_s", *CATEGORIES])
    frame["total_bytes"] = frame[list(CATEGORIES)].sum(axis=1)
    return frame
