"""Sections for tables of many runs: a sweep (scaling curves, one plot per swept axis: a field, or
the fields a sweep file combines; the rows) and a validation (predicted vs measured, error per case,
MAPE)."""

from __future__ import annotations

import pandas as pd

from simulator.report import plots
from simulator.report.document import Figure, Section, Table, figure_png, slug
from simulator.report.inputs import sweep_axes, sweep_ok, value_text
from simulator.report.sweep_order import (combined_values, in_sweep_order, is_numeric, order_rows, point_order,
                                          swept_together)

MAX_SWEEP_ROWS = 500


def best_points(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per combination of `keys`, the row of highest throughput (best over the other swept fields),
    sorted by `keys` (an ordered categorical key, as `sweep_lines` makes, in its categories' order)."""
    order = frame.sort_values("throughput_samples_per_s", ascending=False, kind="stable")
    return order.drop_duplicates(keys).sort_values(keys, kind="stable").reset_index(drop=True)


def label_fields(table: pd.DataFrame, exclude: str | None = None) -> list[str]:
    """The swept `strategy.*` fields that vary within a kind, and the swept `model.*` fields (another
    model is another workload: never "best over" it), except `exclude` (see `configurations`)."""
    return [column for column in sweep_axes(table) if column not in ("strategy.kind", exclude) and (
            column.startswith("strategy.") and (table.groupby("strategy")[column].nunique(dropna=False) > 1).any()
            or column.startswith("model.") and table[column].nunique(dropna=False) > 1)]


def configurations(table: pd.DataFrame, exclude: str | None = None) -> pd.Series:
    """A line label per row: the strategy kind plus the swept `strategy.*` fields that vary within
    a kind (`ghp G=4`), except `exclude` (the field on the x axis)."""
    fields = label_fields(table, exclude)

    def label(row) -> str:
        parts = [str(row["strategy"])]
        parts += [f"{SHORT_NAMES.get(column, column.split('.', 1)[1])}={value_text(row[column])}"
                  for column in fields if not pd.isna(row[column])]
        return " ".join(parts)
    return table.apply(label, axis=1) if len(table) else table["strategy"].astype(str)


SHORT_NAMES = {"strategy.num_groups": "G", "model.name": "model"}


def sweep_lines(table: pd.DataFrame, exclude: str | None = None) -> pd.DataFrame:
    """The simulated rows, with `strategy` replaced by the line label (see `configurations`) as an
    ordered categorical in sweep order (kinds as the sweep lists them, then each labelled field in
    its order: `ghp G=2` before `ghp G=16`), and a non-numeric `exclude` field likewise."""
    ok = table[sweep_ok(table)]
    labels = configurations(ok, exclude)
    ranked = order_rows(ok, ["strategy", *label_fields(ok, exclude)], table)
    lines = ok.assign(strategy=pd.Categorical(labels, categories=list(dict.fromkeys(labels.loc[ranked.index])),
                                              ordered=True))
    if exclude is not None and not is_numeric(ok[exclude]):
        lines[exclude] = in_sweep_order(ok, exclude, table)
    return lines


def scaling_frame(table: pd.DataFrame) -> pd.DataFrame:
    """Per strategy configuration and GPU count: the best throughput and its scaling efficiency
    = speedup over one device / GPUs."""
    frame = best_points(sweep_lines(table), ["strategy", "num_gpus"])
    frame["efficiency"] = frame["speedup"] / frame["num_gpus"]
    return frame


def sweep_sections(table: pd.DataFrame) -> list[Section]:
    ok = table[sweep_ok(table)]
    scaling = Section("scaling", "Scaling with the number of GPUs")
    axes_section = Section("axes", "Throughput per swept axis")
    if ok.empty:
        scaling.paragraphs.append("No point of the sweep was simulated (every row failed): nothing to plot.")
        axes_section.paragraphs.append("No point of the sweep was simulated: nothing to plot.")
    else:
        frame = scaling_frame(table)
        scaling.paragraphs.append(
            "Per strategy (kind and swept strategy fields; a swept model is a line of its own) and GPU count, "
            "the point of highest throughput (over the other swept fields). "
            "Scaling efficiency = speedup over one device / number of GPUs (100 % = linear).")
        if frame["num_gpus"].nunique() == 1:  # nothing scales: the table alone, no column of dots
            scaling.paragraphs.append(f"Every point has {int(frame['num_gpus'].iloc[0])} GPUs: no scaling to draw.")
        scaling.figures += [] if frame["num_gpus"].nunique() == 1 else [
            Figure("fig-throughput", "Throughput vs number of GPUs",
                   figure_png(lambda axis: plots.plot_throughput_scaling(frame, axis))),
            Figure("fig-efficiency", "Scaling efficiency vs number of GPUs",
                   figure_png(lambda axis: plots.plot_scaling_efficiency(frame, axis)))]
        scaling.tables.append(Table("scaling-table", pd.DataFrame({
            "strategy": frame["strategy"].astype(str), "GPUs": frame["num_gpus"].astype(int),
            "throughput (samples/s)": frame["throughput_samples_per_s"].map(lambda v: f"{v:.1f}"),
            "speedup (x)": frame["speedup"].map(lambda v: f"{v:.2f}"),
            "efficiency (%)": frame["efficiency"].map(lambda v: f"{v * 100:.1f}")}), caption="scaling"))
        for group in swept_together(table, sweep_axes(table)):
            column = ", ".join(group)
            if len(group) == 1:
                points, what = best_points(sweep_lines(table, exclude=column), [column, "strategy"]), ""
            else:
                points, what = combined_points(table, group, column), ", swept together"
            axes_section.figures.append(Figure(
                f"fig-axis-{slug('-'.join(group))}", f"Throughput vs {column}{what} (best over the other swept fields)",
                figure_png(lambda axis, points=points, column=column: plots.plot_sweep_axis(points, axis, column))))
        if not sweep_axes(table):
            axes_section.paragraphs.append("The table has no swept-field columns (dotted names).")
    rows = Section("sweep-rows", "All points", tables=[Table("sweep-table", sweep_display(table.head(MAX_SWEEP_ROWS)),
                                                              caption="sweep")])
    if len(table) > MAX_SWEEP_ROWS:
        rows.paragraphs.append(f"First {MAX_SWEEP_ROWS} of {len(table)} rows (the CSV has all).")
    return [scaling, axes_section, rows]


def combined_points(table: pd.DataFrame, group: list[str], column: str) -> pd.DataFrame:
    """The best simulated point of each value of a combined axis (`group`'s fields swept together),
    as column `column`, one line (the strategy is on that axis), values in sweep order."""
    ok = table[sweep_ok(table)]
    order = list(dict.fromkeys(combined_values(point_order(table), group)))
    frame = ok.assign(**{column: pd.Categorical(combined_values(ok, group), categories=order, ordered=True)},
                      strategy="best over the other swept fields")
    return best_points(frame, [column])


def sweep_display(table: pd.DataFrame) -> pd.DataFrame:
    display = {column: table[column].map(value_text) for column in sweep_axes(table)}
    display["strategy"] = table["strategy"].map(value_text)
    for column in ("num_gpus", "num_groups", "workers_per_group"):
        if column in table.columns:
            display[column] = table[column].map(_integer)
    display["step (ms)"] = table["step_time_s"].map(lambda v: _number(v * 1e3, ".3f"))
    display["throughput (samples/s)"] = table["throughput_samples_per_s"].map(lambda v: _number(v, ".1f"))
    display["speedup (x)"] = table["speedup"].map(lambda v: _number(v, ".2f"))
    if "peak_memory_bytes" in table.columns and table["peak_memory_bytes"].notna().any():
        display["peak memory (GiB)"] = table["peak_memory_bytes"].map(lambda v: _number(v / 2**30, ".3f"))
    display["status"] = table["status"].map(value_text)
    if "error" in table.columns:
        display["error"] = table["error"].map(value_text)
    return pd.DataFrame(display)


def _number(value, spec: str) -> str:
    return "" if pd.isna(value) else format(value, spec)


def _integer(value) -> str:
    return "" if pd.isna(value) else str(int(value))


def case_labels(table: pd.DataFrame) -> list[str]:
    """One unique label per row: the strategy, prefixed by the model when there are several."""
    several_models = "model" in table.columns and table["model"].nunique() > 1
    labels = [f"{row['model']} {row['strategy']}" if several_models else str(row["strategy"])
              for _, row in table.iterrows()]
    seen: dict[str, int] = {}
    for index, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[index] = f"{label} #{seen[label]}"
    return labels


def mape_pct(table: pd.DataFrame) -> float:
    """Mean absolute percentage error of the predictions, over the cases."""
    return float(table["error_pct"].abs().mean())


def validation_sections(table: pd.DataFrame) -> list[Section]:
    several_models = "model" in table.columns and table["model"].nunique() > 1
    frame = table.assign(case=case_labels(table),
                         series=table["model"] if several_models else table["strategy"])
    display = pd.DataFrame({"case": frame["case"]})
    if "world_size" in frame.columns:
        display["ranks"] = frame["world_size"].map(_integer)
    display["predicted (ms)"] = frame["predicted_s"].map(lambda v: f"{v * 1e3:.3f}")
    display["measured (ms)"] = frame["measured_s"].map(lambda v: f"{v * 1e3:.3f}")
    display["error (%)"] = frame["error_pct"].map(lambda v: f"{v:+.1f}")
    worst = frame.loc[frame["error_pct"].abs().idxmax()]
    section = Section("validation", "Predicted vs measured", paragraphs=[
        f"MAPE {mape_pct(frame):.1f} % over {len(frame)} cases; worst |error| "
        f"{abs(worst['error_pct']):.1f} % ({worst['case']}). Error = (predicted - measured) / measured."],
        tables=[Table("validation-table", display, caption="validation")])
    section.figures += [
        Figure("fig-validation-scatter", "Predicted vs measured step time per case",
               figure_png(lambda axis: plots.plot_predicted_vs_measured(frame, axis), (5.5, 5.0))),
        Figure("fig-validation-error", "Prediction error per case",
               figure_png(lambda axis: plots.plot_validation_error(frame, axis), (7.0, 1.2 + 0.3 * len(frame))))]
    return [section]
