"""Validation outputs: the predicted-vs-measured table (CSV), its summary figures, its plot (PNG)
and the traces.

Written atomically, and after every finished case, so an interrupted validation keeps what it
measured.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from simulator.output import write_json_atomic, write_text_atomic
from simulator.records import span_table
from simulator.trace import trace_events

MAPE_TARGET_PCT = 10.0
WORST_TARGET_PCT = 20.0


def write_rows_csv(rows: list[dict], path: Path) -> Path:
    return write_text_atomic(path, pd.DataFrame(rows).to_csv(index=False))


def error_summary(rows: list[dict]) -> dict:
    """The figures of a validation's rows (`validator.validate`): the number of cases, the mean
    absolute percentage error, the worst |error| and the mean signed error, in percent."""
    errors = [row["error_pct"] for row in rows]
    return {"cases": len(errors), "mape_pct": sum(map(abs, errors)) / len(errors),
            "worst_pct": max(map(abs, errors)), "mean_signed_pct": sum(errors) / len(errors)}


def summary_line(summary: dict) -> str:
    """`error_summary` in one line, against the targets (MAPE <= 10 %, worst <= 20 %)."""
    return (f"cases {summary['cases']} | MAPE {summary['mape_pct']:.1f} % (target <= {MAPE_TARGET_PCT:.0f}) | "
            f"worst {summary['worst_pct']:.1f} % (target <= {WORST_TARGET_PCT:.0f}) | "
            f"mean signed {summary['mean_signed_pct']:+.1f} %")


def case_line(row: dict) -> str:
    """One case: predicted, measured and the error (and the launches' spread where there were several)."""
    spread = f"  (launches spread {row['launch_spread_pct']:.0f} %)" if row.get("launches", 1) > 1 else ""
    return (f"{row['strategy']:>22s}  predicted {row['predicted_s'] * 1e3:9.2f} ms  measured "
            f"{row['measured_s'] * 1e3:9.2f} ms  error {row['error_pct']:+6.1f} %{spread}")


def plot_predicted_vs_measured(frame: pd.DataFrame, axis) -> None:
    """Scatter of predicted vs measured step time (ms) with the y = x line and +-10 % band; with
    several launches per strategy, a horizontal bar spans their medians (the run-to-run noise)."""
    measured_ms, predicted_ms = frame["measured_s"] * 1e3, frame["predicted_s"] * 1e3
    top = 1.1 * max(measured_ms.max(), predicted_ms.max())
    axis.plot([0, top], [0, top], color="grey", linewidth=1, label="exact")
    axis.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10 %")
    for label, group in frame.groupby("strategy", sort=False):
        points = axis.scatter(group["measured_s"] * 1e3, group["predicted_s"] * 1e3, label=label, zorder=3)
        if "launches" in group and (group["launches"] > 1).any():
            low = (group["measured_s"] - group["launch_median_min_s"]).clip(lower=0) * 1e3
            high = (group["launch_median_max_s"] - group["measured_s"]).clip(lower=0) * 1e3
            axis.errorbar(group["measured_s"] * 1e3, group["predicted_s"] * 1e3, xerr=[low, high], fmt="none",
                          ecolor=points.get_facecolor()[0], elinewidth=1, capsize=2, zorder=2)
    axis.set_xlim(0, top)
    axis.set_ylim(0, top)
    axis.set_xlabel("measured step time (ms)")
    axis.set_ylabel("predicted step time (ms)")
    axis.legend(fontsize=7, loc="upper left")


def write_plot(frame: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib  # only here: validating and summarising need no plotting library

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 5))
    plot_predicted_vs_measured(frame, axis)
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".png.tmp")
    temporary.write_bytes(buffer.getvalue())
    temporary.replace(path)
    return path


def trace_stem(label: str) -> str:
    """A strategy's label as a file name: `1f1b:4 (G=1 x M=2)` -> `1f1b:4_G1xM2`."""
    return label.replace(" ", "").replace("(", "_").replace(")", "").replace("=", "")


def write_traces(label: str, measured_spans: list[tuple], simulated_spans: pd.DataFrame, folder: Path) -> None:
    """Measured and simulated timelines of one plan, as two Perfetto files side by side."""
    stem = trace_stem(label)
    write_json_atomic(folder / f"{stem}.measured.trace.json", trace_events(span_table(measured_spans)))
    write_json_atomic(folder / f"{stem}.simulated.trace.json", trace_events(simulated_spans))


def write_step_spans(label: str, table: pd.DataFrame, folder: Path) -> Path:
    """Every measured step's spans of one plan (`validator.validate.step_span_table`) beside its
    traces, as `<stem>.steps.csv`."""
    return write_text_atomic(folder / f"{trace_stem(label)}.steps.csv", table.to_csv(index=False))
