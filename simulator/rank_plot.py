"""The planner's ranking as a horizontal bar plot (matplotlib, Agg): step time per candidate,
fastest on top, candidates that do not fit in device memory hatched, heuristic picks marked; and
several cluster sizes as time against cost, with their Pareto front."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from simulator.output import write_figure_atomic  # noqa: E402
from simulator.units import plural  # noqa: E402

MAX_BARS = 40


def write_rank_plot(results, path, title: str, top: int | None = None) -> Path:
    """`rank --plot`: for several cluster sizes the Pareto plot of those where a layout fits, for one
    its ranking's bars (the `top` best, and each heuristic's pick, marked) (`results`: (ranking,
    heuristic rows, why no layout fits or None) per size)."""
    if len(results) > 1:
        fitting = [ranking for ranking, _, why in results if why is None]
        return write_pareto_plot(fitting, path, f"{fitting[0].scenario.name}: every layout that fits, by cluster size")
    ranking, heuristics, _ = results[0]
    picks: dict[str, list[str]] = {}
    for row in heuristics:
        if row["label"]:
            picks.setdefault(row["label"], []).append(row["heuristic"])
    frame = ranking.frame()
    if top is not None:  # the K best, and the heuristics' picks wherever they ranked
        frame = frame[(frame["rank"] <= top) | frame["label"].isin(picks)]
    frame, picks = _twins_joined(frame, picks)
    return write_ranking_plot(frame, path, title, {label: ", ".join(names) for label, names in picks.items()})


def _twins_joined(frame: pd.DataFrame, picks: dict[str, list[str]]) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """One bar for a layout's two placements where they simulate alike, as the table's one row
    (`simulator.rank_reasons.shown_rows`); the heuristics' picks follow their row's new label."""
    from simulator.rank_reasons import shown_rows
    rows, joined = [], {}
    for position, row, label in shown_rows(frame.to_dict("records")):
        if label != row["label"] and row["label"] in picks:
            joined[label] = picks[row["label"]]
        rows.append({**row, "rank": position, "label": label})
    return pd.DataFrame(rows, columns=frame.columns), {**picks, **joined}


def plot_ranking(frame: pd.DataFrame, axis, picks: dict[str, str] | None = None) -> None:
    """Bars of `frame` (planner rows, ranked) on `axis`; `picks` maps a label to the heuristics
    that chose it (written after its bar)."""
    shown = frame.head(MAX_BARS)
    positions = range(len(shown))
    colors = ["tab:blue" if fits else "lightgrey" for fits in shown["fits_in_memory"]]
    scale, unit = (1, "s") if shown["step_time_s"].max() > 10 else (1e3, "ms")  # not "20000" ms
    bars = axis.barh(list(positions), shown["step_time_s"] * scale, color=colors, edgecolor="black", linewidth=0.4)
    for bar, fits in zip(bars, shown["fits_in_memory"]):
        if not fits:
            bar.set_hatch("//")
    if not shown["fits_in_memory"].all():  # what the hatching means
        axis.legend(handles=[Patch(facecolor="lightgrey", edgecolor="black", hatch="//", label="does not fit in memory")],
                    fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2)  # above the bars
    axis.set_yticks(list(positions))
    axis.set_yticklabels([f"{rank}. {label}" for rank, label in zip(shown["rank"], shown["label"])], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel(f"simulated step time ({unit})")
    for position, (label, step_s) in enumerate(zip(shown["label"], shown["step_time_s"])):
        note = (picks or {}).get(label)  # each bar's value, so close bars are told apart; a pick in red
        axis.text(step_s * scale, position, f" {step_s * scale:,.4g}" + (f"  <- {note}" if note else ""),
                  va="center", fontsize=7 if note else 6, color="tab:red" if note else "black")
    if len(frame) > MAX_BARS:
        axis.set_title(f"first {MAX_BARS} of {len(frame)} candidates", fontsize=8)


def _save(figure, path: str | Path, title: str) -> Path:
    """Title, lay out and write `figure` as a PNG atomically (temp file + rename; cropped to everything drawn,
    so labels running past the axes stay whole), then close it."""
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    try:
        return write_figure_atomic(path, figure, dpi=120, bbox_inches="tight")  # annotations past the axes kept
    finally:
        plt.close(figure)


def write_ranking_plot(frame: pd.DataFrame, path: str | Path, title: str, picks: dict[str, str] | None = None) -> Path:
    """Draw `plot_ranking` into a PNG, written atomically (temp file + rename)."""
    height = 1.2 + 0.22 * min(len(frame), MAX_BARS)
    figure, axis = plt.subplots(figsize=(8, height))
    plot_ranking(frame, axis, picks)
    return _save(figure, path, title)


def _plain_number(value: float, _position=None) -> str:
    """A tick as a plain number (1,200,000, not 1.2 under a 1e6 offset)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:g}"


def write_pareto_plot(rankings, path: str | Path, title: str) -> Path:
    """Every simulated layout that fits, one colour per cluster size: time to train (or step time)
    against cost (or GPU-hours), the Pareto front of all of them drawn as a line."""
    from simulator.rank_reasons import pareto_front, row_cost
    figure, axis = plt.subplots(figsize=(7, 5))
    planned = all("time_to_train_s" in row for ranking in rankings for row in ranking.rows)
    priced = planned and all(row.get("cost") is not None for ranking in rankings for row in ranking.rows)
    points = []
    for ranking in rankings:
        rows = [row for row in ranking.rows if row["fits_in_memory"]]
        xs = [row["time_to_train_s"] / 3600 if planned else row["step_time_s"] for row in rows]
        ys = [row_cost(row, ranking) * (1 if planned else 3600) for row in rows]  # per step: GPU-seconds
        axis.scatter(xs, ys, s=18, label=plural(ranking.scenario.num_gpus, "GPU"))
        points += [(x, y, row["label"], ranking.scenario.num_gpus) for x, y, row in zip(xs, ys, rows)]
    front = sorted({point for point, on in zip(points, pareto_front([(x, y) for x, y, _, _ in points])) if on})
    axis.plot([x for x, *_ in front], [y for _, y, *_ in front], color="black", linewidth=0.8, marker="o",
              markerfacecolor="none", markersize=8, label="Pareto front")  # a ring: seen where the front is one point
    for number, (x, y, _, _) in enumerate(front, start=1):  # a number at each point, its layout listed below
        axis.annotate(str(number), (x, y), fontsize=7, xytext=(5, 5), textcoords="offset points",
                      bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
    axis.text(0.0, -0.14, "Pareto front:\n" + "\n".join(f"{number}. {plural(gpus, 'GPU')}: {label}" for number, (_, _, label, gpus)
                                                        in enumerate(front, start=1)),
              transform=axis.transAxes, va="top", fontsize=6.5)
    for values, scale in (([x for x, *_ in points], axis.set_xscale), ([y for _, y, *_ in points], axis.set_yscale)):
        if values and min(values) > 0 and max(values) >= 10 * min(values):  # sizes spanning a decade: log
            scale("log")
    axis.set_xlabel("time to train (h)" if planned else "step time (s)")
    axis.set_ylabel("cost (--price-per-gpu-hour x GPU-hours)" if priced else
                    "GPU-hours" if planned else "GPU-seconds per step")
    axis.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    axis.legend(fontsize=7)
    return _save(figure, path, title)
