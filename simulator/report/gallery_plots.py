"""The gallery's plots: grouped bars and lines with the paper's figures marked, each on a
matplotlib Axes (drawn through `simulator.report.document.figure_png`); every axis says its unit."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

MARKERS = ("o", "s", "D", "^", "v", "P")
STYLES = ("-", "--")
"""Marker and line style cycle per series, so that series with equal values stay visible."""
PAPER_STYLE = {"marker": "*", "color": "#C44E52", "markersize": 13, "linestyle": "none", "zorder": 5}
LEGEND_BESIDE = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
"""A legend beside the axes, where it covers no bar, line or paper mark."""


def log_axis(axis, base: float = 10) -> None:
    """`axis` (an Axes' yaxis or xaxis) on a log scale read as plain numbers (8, 0.5), not 2^3 or 10^-1."""
    axis.axes.set_yscale("log", base=base) if axis is axis.axes.yaxis else axis.axes.set_xscale("log", base=base)
    axis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_grouped_bars(frame: pd.DataFrame, axis, group: str, series: str, value: str, ylabel: str,
                      reference: float | None = None) -> None:
    """A cluster of bars per `group` value, one bar per `series` value (frame order), height
    `value`, the value written over each bar; a dotted line at `reference`."""
    groups = list(dict.fromkeys(frame[group]))
    names = list(dict.fromkeys(frame[series]))
    width = 0.8 / len(names)
    for position, name in enumerate(names):
        rows = frame[frame[series] == name].set_index(group)
        xs = [index + (position - (len(names) - 1) / 2) * width for index, g in enumerate(groups) if g in rows.index]
        heights = [float(rows.loc[g, value]) for g in groups if g in rows.index]
        bars = axis.bar(xs, heights, width=width, label=str(name))
        for bar, height in zip(bars, heights):
            axis.text(bar.get_x() + bar.get_width() / 2, height, f"{height:.2f}", ha="center", va="bottom", fontsize=7)
    if reference is not None:
        axis.axhline(reference, color="grey", linestyle=":", linewidth=1)
    axis.set_xticks(range(len(groups)), [str(g) for g in groups], fontsize=8)
    axis.set_ylabel(ylabel)
    axis.legend(**LEGEND_BESIDE)


def plot_lines(frame: pd.DataFrame, axis, x: str, y: str, series: str, *, xlabel: str, ylabel: str,
               log2_x: bool = False, ideal: bool = False, paper_points: list[tuple[float, float, str]] = (),
               hline: tuple[float, str] | None = None, hollow: str | None = None) -> None:
    """A line per `series` value of `y` against `x` (own marker, solid/dashed alternating).
    `ideal`: the y = x line; `paper_points`:
    the paper's figures as red stars (x, y, label); `hline`: a dashed (y, label) line; `hollow`:
    a boolean column, False drawn as hollow markers (e.g. does not fit in memory)."""
    for index, (name, rows) in enumerate(frame.groupby(series, sort=False)):
        rows = rows.sort_values(x)
        marker, style = MARKERS[index % len(MARKERS)], STYLES[index % len(STYLES)]
        line, = axis.plot(rows[x], rows[y], marker=marker, linestyle=style, label=str(name))
        if hollow is not None:
            empty = rows[~rows[hollow].astype(bool)]
            axis.plot(empty[x], empty[y], marker=marker, linestyle="none", color=line.get_color(),
                      markerfacecolor="white", zorder=4)
    if ideal:
        xs = sorted(set(frame[x]))
        axis.plot(xs, xs, color="grey", linestyle=":", linewidth=1, label="linear (ideal)")
    for index, (px, py, label) in enumerate(paper_points):
        axis.plot([px], [py], label=label, **PAPER_STYLE)
    if hline is not None:
        axis.axhline(hline[0], color="#C44E52", linestyle="--", linewidth=1, label=hline[1])
    if log2_x:
        values = sorted(set(frame[x]))
        axis.set_xscale("log", base=2)
        axis.set_xticks(values, [f"{v:g}" for v in values])
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.legend(**LEGEND_BESIDE)
