"""Validation outputs: the predicted-vs-measured table (CSV), its plot (PNG) and the traces.

Written atomically, and after every finished case, so an interrupted validation keeps what it
measured.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from simulator.output import write_json_atomic, write_text_atomic
from simulator.records import span_table
from simulator.trace import trace_events


def write_rows_csv(rows: list[dict], path: Path) -> Path:
    return write_text_atomic(path, pd.DataFrame(rows).to_csv(index=False))


def headline_column(frame: pd.DataFrame) -> str:
    """The column of the validator's headline prediction: the median step under the profile's pass
    jitter (`predicted_jitter_s`, `simulator.pass_jitter`) when every row has one, else the nominal
    `predicted_s`. Why the jittered one: a synchronous step ends with its slowest rank (a collective,
    a pipeline's last stage), and the expected maximum of jittered ranks exceeds the maximum at their
    median speeds, which is all the nominal prediction plays; on this project's 2-core host the
    jittered prediction was the closer in every DP / MP / GHP validation run since it models the
    exits from collectives (reports/ACCURACY.md)."""
    if "predicted_jitter_s" in frame and not frame["predicted_jitter_s"].isna().any():
        return "predicted_jitter_s"
    return "predicted_s"


def headline_error_column(frame: pd.DataFrame) -> str:
    """The signed-error column (percent) of the headline prediction (`headline_column`)."""
    return "jitter_error_pct" if headline_column(frame) == "predicted_jitter_s" else "error_pct"


def headline_summary(frame: pd.DataFrame) -> str:
    """The benchmarks' headline: MAPE, worst and median |error| of the headline prediction
    (`headline_column`) against the targets, and the nominal prediction's beside it."""
    column = headline_column(frame)
    errors = frame[headline_error_column(frame)].abs()
    what = "median step under pass jitter" if column == "predicted_jitter_s" else "nominal"
    line = (f"cases {len(frame)} | prediction ({what}): MAPE {errors.mean():.1f} % (target <= 10) | worst "
            f"{errors.max():.1f} % (target <= 20) | median |error| {errors.median():.1f} %")
    if column != "predicted_s":
        nominal = frame["error_pct"].abs()
        line += (f"\n  nominal (every rank at its median speed): MAPE {nominal.mean():.1f} %, worst "
                 f"{nominal.max():.1f} %, mean signed {frame['error_pct'].mean():+.1f} %")
    return line


def launch_spread_summary(frame: pd.DataFrame) -> str:
    """One line on the run-to-run noise of the measurements: the median spread between the launches'
    own medians of a case, and the cases whose error is no larger than that spread."""
    if "launch_spread_pct" not in frame or not (frame["launches"] > 1).any():
        return "one launch per case: no run-to-run spread measured"
    spread = frame["launch_spread_pct"]
    within = int((frame["error_pct"].abs() <= spread).sum())
    line = (f"run-to-run spread of the launches' medians: median {spread.median():.1f} %, "
            f"max {spread.max():.1f} % | cases with |error| <= their spread: {within}/{len(frame)}")
    if "launch_noise_pct" not in frame or frame["launch_noise_pct"].isna().all():
        return line
    noise = frame["launch_noise_pct"].dropna()
    return line + "\n" + (
        f"standard error of a case's figure from its launches' scatter: median {noise.median():.1f} %, "
        f"max {noise.max():.1f} % | a perfect model would still show a MAPE of about "
        f"{noise_only_mape_pct(noise):.1f} % | cases with |error| <= 2 standard errors: "
        f"{int((frame['error_pct'].abs() <= 2 * frame['launch_noise_pct']).sum())}/{len(frame)}")


PROFILE_KEYS = ("model", "world_size")
"""The columns naming the calibration a benchmark row was predicted from (one profile per model and
world size in `benchmarks/bench_*validation.py`)."""


def calibration_level_summary(frame: pd.DataFrame, profile_keys: tuple[str, ...] = PROFILE_KEYS) -> str:
    """A diagnostic, not a prediction: how much of the headline error is one level per calibration.
    Each profile's level is the mean signed headline error of its cases; the line gives the levels'
    range and the MAPE / worst left after subtracting from every case its profile's level. Small
    residuals with large levels mean the model orders and scales a calibration's cases right while
    the machine's speed moved between the calibration and the runs (reports/ACCURACY.md). "" when
    the rows carry no profile keys or no profile has two cases."""
    if any(key not in frame for key in profile_keys) or frame.empty:
        return ""
    errors = frame.groupby(list(profile_keys))[headline_error_column(frame)]
    shared = errors.transform("size") > 1
    if not shared.any():
        return ""
    residual = (errors.obj - errors.transform("mean"))[shared].abs()
    profile_levels = errors.mean()[errors.size() > 1]
    return (f"calibration level (diagnostic; mean signed error of the cases sharing a profile): "
            f"{profile_levels.min():+.1f} to {profile_levels.max():+.1f} % over {len(profile_levels)} profiles | "
            f"with each case's level removed: MAPE {residual.mean():.1f} %, worst {residual.max():.1f} % "
            f"({int(shared.sum())} cases)")


def anchored_summary(frame: pd.DataFrame) -> str:
    """One line on the speed-anchored predictions (`validator.speed_anchor`) beside the calibration's
    own; '' when no row has them."""
    if "anchored_error_pct" not in frame or frame["anchored_error_pct"].isna().all():
        return ""
    rows = frame.dropna(subset=["anchored_error_pct"])
    anchored, raw = rows["anchored_error_pct"].abs(), rows["error_pct"].abs()
    return (f"speed-anchored ({len(rows)} cases; machine speed vs calibration x{rows['speed_ratio'].min():.2f}"
            f"-x{rows['speed_ratio'].max():.2f}): MAPE {anchored.mean():.1f} %, worst {anchored.max():.1f} %, "
            f"mean signed {rows['anchored_error_pct'].mean():+.1f} % | calibration alone on the same cases: "
            f"MAPE {raw.mean():.1f} %, worst {raw.max():.1f} %")


def bracketed_summary(frame: pd.DataFrame) -> str:
    """Lines on the predictions from the calibrations before and after the runs pooled
    (`simulator.profile_merge`; columns `bracketed_*`) beside the calibration before alone; '' when
    no row has them."""
    return pooled_summary(frame, "bracketed", "calibrations before + after pooled")


def other_predictions_text(row: dict) -> str:
    """The benchmarks' per-case suffix: the speed-anchored, bracketed and interleaved predictions
    and their errors, each where the row has it ('' for none)."""
    text = ""
    if "speed_ratio" in row:
        text += (f" | speed x{row['speed_ratio']:.2f} anchored {row['anchored_predicted_s'] * 1e3:8.2f} ms "
                 f"error {row['anchored_error_pct']:+7.1f} %")
    if "bracketed_error_pct" in row:
        text += f" | bracketed {row['bracketed_predicted_s'] * 1e3:8.2f} ms error {row['bracketed_error_pct']:+7.1f} %"
    if "interleaved_error_pct" in row:
        text += f" | interleaved {row['interleaved_predicted_s'] * 1e3:8.2f} ms error {row['interleaved_error_pct']:+7.1f} %"
        if "interleaved_jitter_error_pct" in row:
            text += f" (jittered {row['interleaved_jitter_error_pct']:+7.1f} %)"
    return text


def interleaved_summary(frame: pd.DataFrame) -> str:
    """Lines on the predictions from the calibration before the runs pooled with the slices
    calibrated between their rounds (`validator.interleave`; columns `interleaved_*`) beside the
    calibration before alone; '' when no row has them."""
    return pooled_summary(frame, "interleaved", "calibration + slices between rounds pooled")


def interleaved_level_summary(frame: pd.DataFrame) -> str:
    """`calibration_level_summary` of the pooled (interleaved) prediction; '' without one."""
    if not interleaved_summary(frame):
        return ""
    level_frame = frame.copy()
    for suffix in ("error_pct", "jitter_error_pct"):
        if f"interleaved_{suffix}" in level_frame:
            level_frame[suffix] = level_frame[f"interleaved_{suffix}"]
    return "interleaved: " + calibration_level_summary(level_frame)


def pooled_summary(frame: pd.DataFrame, prefix: str, label: str) -> str:
    """Nominal and jittered MAPE, worst and mean signed error of the second prediction in the
    `<prefix>_*` columns (`validator.validate.with_second_prediction`) beside the calibration before
    the runs alone, on the same cases; '' when no row has them."""
    if f"{prefix}_error_pct" not in frame or frame[f"{prefix}_error_pct"].isna().all():
        return ""
    rows = frame.dropna(subset=[f"{prefix}_error_pct"])
    lines = []
    for column, kind in (("error_pct", "nominal"), ("jitter_error_pct", "jittered")):
        if f"{prefix}_{column}" not in rows or column not in rows:
            continue
        pooled, before = rows[f"{prefix}_{column}"], rows[column]
        lines.append(f"{label}, {kind} ({len(rows)} cases): "
                     f"MAPE {pooled.abs().mean():.1f} %, worst {pooled.abs().max():.1f} %, "
                     f"mean signed {pooled.mean():+.1f} % | calibration before "
                     f"alone: MAPE {before.abs().mean():.1f} %, worst {before.abs().max():.1f} %, "
                     f"mean signed {before.mean():+.1f} %")
    return "\n".join(lines)


def noise_only_mape_pct(noise_pct: pd.Series) -> float:
    """The MAPE that measurement noise alone gives a model that predicts every case's true mean
    exactly: the mean of |N(0, se)| is se x sqrt(2 / pi) (half-normal mean), averaged over cases."""
    return float((noise_pct * math.sqrt(2.0 / math.pi)).mean())


def jitter_summary(frame: pd.DataFrame) -> str:
    """Lines on the predictions under the profiles' pass jitter (`simulator.pass_jitter`): the error
    of their median step, and how their 10th / 90th percentile steps compare with the measured steps'
    own; '' when no row has them."""
    if "predicted_jitter_s" not in frame or frame["predicted_jitter_s"].isna().all():
        return ""
    rows = frame.dropna(subset=["predicted_jitter_s"])
    median_error = rows["jitter_error_pct"].abs()
    lines = [f"under pass jitter ({len(rows)} cases): median step MAPE {median_error.mean():.1f} %, worst "
             f"{median_error.max():.1f} %; nominal MAPE on the same cases {rows['error_pct'].abs().mean():.1f} %"]
    for percent in (10, 90):
        measured = rows[f"measured_p{percent}_s"]
        error = 100 * (rows[f"predicted_p{percent}_s"] - measured) / measured
        lines.append(f"  {percent}th-percentile step: predicted vs measured MAPE {error.abs().mean():.1f} %, "
                     f"mean signed error {error.mean():+.1f} %")
    inside = int(rows["measured_s"].between(rows["predicted_p10_s"], rows["predicted_p90_s"]).sum())
    lines.append(f"  measured median inside the predicted 10th-90th percentile band: {inside}/{len(rows)}")
    return "\n".join(lines)


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
