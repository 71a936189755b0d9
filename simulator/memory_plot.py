"""Memory timeline per device (matplotlib, Agg): bytes in use by category over one step."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from simulator.memory import CATEGORIES, memory_config, rank_memory  # noqa: E402
from simulator.memory_timeline import memory_timeline  # noqa: E402
from simulator.output import figure_bytes, write_bytes_atomic  # noqa: E402
from simulator.records import span_table  # noqa: E402

MAX_PANELS = 8
GIB, MIB = 2**30, 2**20
CAPACITY_SHOWN = 3.0
"""The capacity line is drawn where the device holds at most this many times the step's peak."""
CATEGORY_COLOURS = dict(zip(CATEGORIES, plt.get_cmap("tab10").colors))
"""One colour per memory category in every figure (the peak line is dark grey, the capacity black)."""


def plot_memory_timeline(frame: pd.DataFrame, axis, capacity_bytes: float | None = None) -> None:
    """Stacked step plot of `frame` (`simulator.memory_timeline.memory_timeline`: time_s, categories)
    on `axis`, in GiB (MiB where the peak is under 1 GiB). The device's capacity is drawn where it
    is within `CAPACITY_SHOWN` x the peak; else named in the legend, so the step's own bytes keep
    the scale (a CPU host's 24 GiB beside a 20 MiB peak)."""
    shown = [c for c in CATEGORIES if c in frame and frame[c].abs().max() > 0]
    peak = frame["total_bytes"].max()
    unit, scale = ("GiB", GIB) if peak >= GIB else ("MiB", MIB)
    seconds = frame["time_s"].max() > 10  # long steps in s, not "17500" ms
    times = frame["time_s"] * (1 if seconds else 1e3)
    axis.stackplot(times, *[frame[c] / scale for c in shown], labels=shown, step="post", alpha=0.85,
                   colors=[CATEGORY_COLOURS[c] for c in shown])
    if capacity_bytes is not None and capacity_bytes < float("inf"):
        if capacity_bytes <= CAPACITY_SHOWN * peak:
            axis.axhline(capacity_bytes / scale, color="black", linestyle="--", linewidth=1, label="capacity")
        else:
            axis.plot([], [], " ", label=f"capacity {capacity_bytes / GIB:.0f} GiB (off the scale)")
    axis.axhline(peak / scale, color="0.25", linewidth=0.8, label=f"peak {peak / scale:.2f} {unit}")
    axis.set_xlabel(f"time in step ({'s' if seconds else 'ms'})")
    axis.set_ylabel(unit)


def write_memory_plot(result, path: str | Path) -> Path:
    """One panel per device (the first MAX_PANELS ranks) of a `SimulationResult`, as a PNG."""
    return write_bytes_atomic(path, memory_plot_bytes(result, path))


def memory_plot_bytes(result, path: str | Path) -> bytes:
    """`write_memory_plot`'s figure in memory, in the format of `path`'s suffix."""
    config = memory_config(result.scenario)
    spans = result.spans if result.played_spans is None else span_table(result.played_spans)  # the plan's own
    if "rank_workload" in result.plan.meta:  # megatron: the ranks' shares, as the summary counts them
        from simulator.strategies.tensor_summary import tensor_rank_memory
        ranks = tensor_rank_memory(result.plan, spans, config)[:MAX_PANELS]
    else:
        ranks = rank_memory(result.plan, result.workload, spans, config)[:MAX_PANELS]
    end_s = float(spans["end_s"].max()) if len(spans) else 0.0
    figure, axes = plt.subplots(len(ranks), 1, figsize=(9.5, 2.4 * len(ranks)), squeeze=False, layout="constrained")
    legend: dict[str, object] = {}  # one legend for the figure: the categories, the capacity
    for axis, memory in zip(axes[:, 0], ranks):
        plot_memory_timeline(memory_timeline(memory, end_s), axis, config.capacity_bytes)
        handles, labels = axis.get_legend_handles_labels()
        peak = next((label for label in labels if label.startswith("peak ")), "")
        axis.set_title(f"rank {memory.rank}, {peak}", fontsize=8)
        legend.update((label, handle) for handle, label in zip(handles, labels) if not label.startswith("peak "))
    order = {category: position for position, category in enumerate(CATEGORIES)}
    labels = sorted(legend, key=lambda label: order.get(label, len(order)))
    figure.legend([legend[label] for label in labels], labels, loc="outside right upper", fontsize=7)
    meta = result.plan.meta
    played = f"; {meta['played_microbatches']} of {meta['num_microbatches']} micro-batches played" \
        if result.played_spans is not None else ""
    drawn = f"; {len(ranks)} of {result.plan.num_ranks} ranks drawn" if result.plan.num_ranks > len(ranks) else ""
    figure.suptitle(f"{result.summary['scenario']}: memory per device "
                    f"(policy {config.memory_policy}, recompute {config.recompute}{played}{drawn})", fontsize=9)
    try:
        return figure_bytes(path, figure, dpi=110)
    finally:
        plt.close(figure)
