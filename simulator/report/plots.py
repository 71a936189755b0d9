"""The report's plots: one function per plot, each taking a DataFrame and a matplotlib Axes.

Times are drawn in milliseconds, memory in GiB, throughput in samples/s; every axis says its unit.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from simulator.memory_plot import CAPACITY_SHOWN  # noqa: E402

PHASE_COLOURS = {"compute_s": "#4C72B0", "comm_s": "#DD8452", "idle_s": "#C7C7C7"}
PHASE_LABELS = {"compute_s": "compute", "comm_s": "communication (exposed)", "idle_s": "idle"}
KIND_COLOURS = {"F": "#4C72B0", "B": "#55A868", "opt": "#8172B3", "allreduce": "#DD8452",
                "send": "#C44E52", "predict": "#937860", "repredict": "#937860"}
OTHER_COLOURS = ("#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD", "#2F4B7C", "#A05195")
STREAM_ROWS = {"compute": (0.05, 0.5), "comm": (0.55, 0.2), "send": (0.75, 0.2)}
"""Where each stream sits inside a rank's row: (offset from the row top, height), in rank units."""
MIN_SPAN_SHARE = 0.003
"""plot_gantt: a span shorter than this share of the step is drawn this wide (a few pixels), so that
short sends and collectives stay visible."""
GIB = 2**30
MAX_MEMORY_BARS = 512
"""plot_memory: a strategy with more ranks is drawn as a step line, not a bar per rank."""


def plot_step_breakdown(frame: pd.DataFrame, axis) -> None:
    """One horizontal bar per strategy (frame rows: strategy, compute_s, comm_s, idle_s = mean over
    ranks), stacked: the bar's length is the step time."""
    labels = list(frame["strategy"])[::-1]
    left = [0.0] * len(labels)
    for column, colour in PHASE_COLOURS.items():
        widths = list(frame[column] * 1e3)[::-1]
        axis.barh(labels, widths, left=left, color=colour, label=PHASE_LABELS[column])
        left = [a + b for a, b in zip(left, widths)]
    axis.set_xlabel("time per step (ms), mean over ranks")
    axis.set_ylabel("strategy")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def kind_colours(kinds) -> dict[str, str]:
    """A colour per span kind: fixed ones for the known kinds, then a cycle for the others."""
    others = iter(OTHER_COLOURS * (1 + len(kinds) // len(OTHER_COLOURS)))
    known = [kind for kind in KIND_COLOURS if kind in kinds]  # in the step's order: F, B, opt, then communication
    return {kind: KIND_COLOURS[kind] if kind in KIND_COLOURS else next(others)
            for kind in known + sorted(set(kinds) - set(known))}


def plot_gantt(spans: pd.DataFrame, axis, max_ranks: int = 32) -> None:
    """Timeline of one step (span table rows: rank, stream, kind, start_s, end_s): a row per rank
    (the first `max_ranks`), compute as a thick bar, communication and sends as thin bars under it,
    none narrower than `MIN_SPAN_SHARE` of the step."""
    shown = spans[spans["rank"] < max_ranks]
    colours = kind_colours(set(shown["kind"]))
    min_width_ms = MIN_SPAN_SHARE * float(spans["end_s"].max()) * 1e3 if len(spans) else 0.0
    for (rank, stream, kind), group in shown.groupby(["rank", "stream", "kind"], sort=True):
        offset, height = STREAM_ROWS.get(stream, (0.75, 0.2))
        widths = ((group["end_s"] - group["start_s"]) * 1e3).clip(lower=min_width_ms)
        bars = list(zip(group["start_s"] * 1e3, widths))
        axis.broken_barh(bars, (rank + offset, height), facecolors=colours[kind], edgecolor="none")
    for kind, colour in colours.items():
        axis.bar(0, 0, color=colour, label={"F": "forward", "B": "backward", "opt": "optimizer"}.get(kind, kind))
    num_ranks = int(shown["rank"].max()) + 1 if len(shown) else 1
    axis.set_ylim(num_ranks, 0)
    axis.set_yticks([rank + 0.5 for rank in range(num_ranks)], [str(rank) for rank in range(num_ranks)],
                    fontsize=7 if num_ranks <= 16 else 5)
    axis.set_xlim(0, float(spans["end_s"].max()) * 1e3 if len(spans) else 1.0)
    axis.set_xlabel("time since step start (ms)")
    axis.set_ylabel("rank")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="kind", title_fontsize=7)


def plot_memory(frame: pd.DataFrame, axis, capacity_bytes: float | None = None) -> None:
    """Peak memory per rank (frame rows: strategy, rank, peak_memory_bytes), one bar colour per
    strategy (a step line above `MAX_MEMORY_BARS` ranks), against the device capacity (dashed line)."""
    strategies = list(dict.fromkeys(frame["strategy"]))
    width = 0.8 / len(strategies)
    for position, strategy in enumerate(strategies):
        rows = frame[frame["strategy"] == strategy]
        if len(rows) > MAX_MEMORY_BARS:  # one bar (patch) per rank takes seconds for 16,384 ranks
            axis.plot(rows["rank"], rows["peak_memory_bytes"] / GIB, drawstyle="steps-mid", label=strategy)
            continue
        axis.bar(rows["rank"] + (position - (len(strategies) - 1) / 2) * width,
                 rows["peak_memory_bytes"] / GIB, width=width, label=strategy)
    peak = frame["peak_memory_bytes"].max() if len(frame) else 0.0
    if capacity_bytes and capacity_bytes <= CAPACITY_SHOWN * peak:
        axis.axhline(capacity_bytes / GIB, color="black", linestyle="--", linewidth=1,
                     label=f"capacity {capacity_bytes / GIB:g} GiB")
    elif capacity_bytes:  # far above the bars: named, so they keep the scale (as `simulate --memory-plot`)
        axis.plot([], [], " ", label=f"capacity {capacity_bytes / GIB:g} GiB (off the scale)")
    axis.set_xlabel("rank")
    axis.set_ylabel("peak memory (GiB)")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, off the line


def plot_throughput_scaling(frame: pd.DataFrame, axis) -> None:
    """Throughput vs number of GPUs, a line per strategy (frame rows: strategy, num_gpus,
    throughput_samples_per_s)."""
    for strategy, rows in _lines(frame):
        rows = rows.sort_values("num_gpus")
        axis.plot(rows["num_gpus"], rows["throughput_samples_per_s"], marker="o", label=str(strategy))
    _gpu_axis(axis, frame)
    axis.set_ylabel("throughput (samples/s)")
    axis.legend(fontsize=7)


def plot_scaling_efficiency(frame: pd.DataFrame, axis) -> None:
    """Scaling efficiency = speedup over one device / number of GPUs, a line per strategy (frame
    rows: strategy, num_gpus, efficiency)."""
    for strategy, rows in _lines(frame):
        rows = rows.sort_values("num_gpus")
        axis.plot(rows["num_gpus"], rows["efficiency"] * 100, marker="o", label=str(strategy))
    axis.axhline(100, color="grey", linewidth=1, linestyle=":")
    _gpu_axis(axis, frame)
    axis.set_ylabel("scaling efficiency (%) = speedup / GPUs")
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=7)


def _lines(frame: pd.DataFrame):
    """(label, rows) per line: in category order for a categorical `strategy` (sweep order, see
    `table_sections.sweep_lines`), else in order of first appearance; never sorted as text."""
    ordered = isinstance(frame["strategy"].dtype, pd.CategoricalDtype)
    return frame.groupby("strategy", sort=ordered, observed=True)


def _axis_values(series: pd.Series) -> list:
    """A field's distinct values in plot order: numbers ascending; a categorical's values in its
    category order; other values in order of first appearance."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        present = set(series.dropna())
        return [value for value in series.cat.categories if value in present]
    if pd.api.types.is_numeric_dtype(series):
        return sorted(set(series.dropna()))
    return list(dict.fromkeys(series))


def _gpu_axis(axis, frame: pd.DataFrame) -> None:
    gpus = sorted(set(frame["num_gpus"]))
    if len(gpus) > 1 and gpus[0] > 0 and gpus[-1] / gpus[0] >= 8:
        axis.set_xscale("log", base=2)
    axis.set_xticks(gpus, [str(int(n)) for n in gpus])
    axis.set_xlabel("number of GPUs")


def plot_sweep_axis(frame: pd.DataFrame, axis, column: str) -> None:
    """Throughput vs one swept field (frame rows: `column`, strategy, throughput_samples_per_s), a
    line per strategy; a non-numeric field is drawn at evenly spaced positions, in its category
    order when it is a categorical (the sweep's order), else in order of first appearance."""
    categorical = isinstance(frame[column].dtype, pd.CategoricalDtype)
    numeric = pd.api.types.is_numeric_dtype(frame[column]) and not categorical
    values = _axis_values(frame[column])
    position = {value: index for index, value in enumerate(values)}
    for strategy, rows in _lines(frame):
        x = (rows[column] if numeric else rows[column].astype(object).map(position)).sort_values(kind="stable")
        rows = rows.loc[x.index]
        axis.plot(x, rows["throughput_samples_per_s"], marker="o", label=str(strategy))
    if not numeric:
        axis.set_xticks(range(len(values)), [str(value) for value in values], fontsize=7)
    elif all(float(value).is_integer() for value in values if not pd.isna(value)):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts: ticks 4, 8, not 2.5, 5.0
    axis.set_xlabel(f"{column} ({axis_unit(column) if numeric else 'category'})")
    axis.set_ylabel("throughput (samples/s)")
    axis.legend(fontsize=7)


def axis_unit(column: str) -> str:
    """The unit of a dotted scenario field, from its name (house style: units in names)."""
    leaf = column.rsplit(".", 1)[-1]
    for suffix, unit in (("_bytes_per_s", "bytes/s"), ("_flops_per_s", "FLOP/s"), ("_bytes", "bytes"),
                         ("_s", "s"), ("_flops", "FLOPs")):
        if leaf.endswith(suffix):
            return unit
    if leaf.startswith("num_") or leaf.endswith(("_size", "_per_node")):
        return "count"
    return "value"


def plot_predicted_vs_measured(frame: pd.DataFrame, axis) -> None:
    """Predicted vs measured step time per case (frame rows: series, predicted_s, measured_s; a
    colour per series), with the exact line and a +-10 % band."""
    measured_ms, predicted_ms = frame["measured_s"] * 1e3, frame["predicted_s"] * 1e3
    top = 1.1 * float(max(measured_ms.max(), predicted_ms.max()))
    axis.plot([0, top], [0, top], color="grey", linewidth=1, label="exact")
    axis.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10 %")
    for series, rows in frame.groupby("series", sort=False):
        axis.scatter(rows["measured_s"] * 1e3, rows["predicted_s"] * 1e3, label=str(series), zorder=3)
    axis.set_xlim(0, top)
    axis.set_ylim(0, top)
    axis.set_xlabel("measured step time (ms)")
    axis.set_ylabel("predicted step time (ms)")
    axis.legend(fontsize=6, loc="upper left")


def plot_validation_error(frame: pd.DataFrame, axis) -> None:
    """Signed prediction error per case (frame rows: case, error_pct), with the +-10 % target."""
    colours = ["#C44E52" if abs(error) > 10 else "#55A868" for error in frame["error_pct"]]
    axis.barh(list(frame["case"])[::-1], list(frame["error_pct"])[::-1], color=colours[::-1])
    for limit in (-10, 10):
        axis.axvline(limit, color="grey", linestyle="--", linewidth=1)
    axis.axvline(0, color="black", linewidth=1)
    axis.set_xlabel("error (%) = (predicted - measured) / measured")
    axis.set_ylabel("case")
    axis.tick_params(axis="y", labelsize=7)
