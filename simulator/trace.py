"""Chrome/Perfetto trace-event JSON from a span table (open in ui.perfetto.dev or chrome://tracing).

One process per rank, one thread per stream; times in microseconds (the format's unit).
Trace Event Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import pandas as pd

STREAM_ORDER = {"compute": 0, "comm": 1, "send": 2}


def trace_events(spans: pd.DataFrame, rank_labels: dict[int, str] | None = None) -> dict:
    """Trace-event document for a span table (see `simulator.records.span_table`)."""
    events = []
    rank_labels = rank_labels or {}
    for rank in sorted(spans["rank"].unique()):
        label = rank_labels.get(int(rank), f"rank {rank}")
        events.append({"ph": "M", "name": "process_name", "pid": int(rank), "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(rank), "args": {"sort_index": int(rank)}})
        for stream, tid in STREAM_ORDER.items():
            events.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": tid, "args": {"name": stream}})
    for row in spans.itertuples(index=False):
        events.append({
            "ph": "X", "name": row.name, "cat": row.kind, "pid": int(row.rank),
            "tid": STREAM_ORDER.get(row.stream, 3),
            "ts": row.start_s * 1e6, "dur": (row.end_s - row.start_s) * 1e6,
            "args": {"size_bytes": row.size_bytes, "microbatch": int(row.microbatch)},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
