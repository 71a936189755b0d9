"""Sections for simulated strategies (a scenario, a compare or a simulate result): the ranking
table, the step-time split, a timeline of one step per strategy and memory per device."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from simulator.compare import ranking_key
from simulator.report import plots
from simulator.report.document import Figure, Section, Table, figure_png, slug
from simulator.report.inputs import ReportInput
from simulator.tables import comparison_frame, strategy_label
from simulator.trace import trace_events

MAX_GANTT_RANKS = 32
UNFIT_ORDER = (", every plan that fits in GPU memory first; a plan that does not fit is numbered \"-\" and "
               "marked (does not fit)")
GIB = 2**30


@dataclass
class _SummaryOnly:
    """What `comparison_frame` reads of a SimulationResult."""

    summary: dict


def ranking_frame(summaries: list[dict]) -> pd.DataFrame:
    """`ghpsim compare`'s table (simulator.tables.comparison_frame) in its order (`compare.ranking_key`): by
    step time, the plans that fit in GPU memory before those that do not."""
    frame = comparison_frame([_SummaryOnly(summary) for summary in sorted(summaries, key=ranking_key)])
    return frame.reset_index(drop=True)


def ranking_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The ranking table: a plan that does not fit in memory is numbered "-" and marked in its strategy."""
    fits = frame["fits_in_memory"].astype(bool)
    return pd.DataFrame({
        "#": [str(position) if fit else "-" for position, fit in enumerate(fits, start=1)],
        "strategy": [label if fit else f"{label} (does not fit)" for label, fit in zip(frame["strategy"], fits)],
        "placement": frame["placement"],
        "step (ms)": frame["step_time_s"].map(lambda v: f"{v * 1e3:,.3f}"),
        "throughput (samples/s)": frame["throughput_samples_per_s"].map(lambda v: f"{v:,.1f}"),
        "speedup (x)": frame["speedup"].map(lambda v: f"{v:.2f}"),
        "compute (ms)": frame["compute_s"].map(lambda v: f"{v * 1e3:,.3f}"),
        "comm (ms)": frame["comm_s"].map(lambda v: f"{v * 1e3:,.3f}"),
        "idle (ms)": frame["idle_s"].map(lambda v: f"{v * 1e3:,.3f}"),
        "inter-node (MB)": frame["inter_node_bytes"].map(lambda v: f"{v / 1e6:,.1f}"),
    })


def strategy_sections(data: ReportInput, files: dict[str, bytes]) -> list[Section]:
    frame = ranking_frame(data.summaries)
    order = "" if frame["fits_in_memory"].all() else UNFIT_ORDER
    ranking = Section("ranking", "Ranking", paragraphs=[
        f"Strategies sorted by simulated step time{order}. compute, "
        "comm (communication not hidden by compute) and idle are means over ranks; per rank they add up to the "
        "step time. Speedup: one device running the whole batch divided by the step time."],
        tables=[Table("ranking-table", ranking_display(frame), caption="ranking")])
    breakdown = Section("breakdown", "Step time split per strategy", figures=[Figure(
        "fig-breakdown", "Step time per strategy, split into compute, exposed communication and idle "
        "(mean over ranks)", figure_png(lambda axis: plots.plot_step_breakdown(frame, axis),
                                         (7.0, 1.2 + 0.5 * len(frame))))])
    return [ranking, breakdown, timeline_section(data, files), memory_section(data)]


def timeline_section(data: ReportInput, files: dict[str, bytes]) -> Section:
    section = Section("timeline", "Timeline of one step")
    if not data.spans:
        section.paragraphs.append(
            "The result holds summaries only, no span table: run `ghpsim report` on the scenario "
            "file to get the timelines and the Perfetto traces.")
        return section
    section.paragraphs.append(
        "One step per strategy, rank on the vertical axis, coloured by kind of work (F forward, "
        "B backward, opt optimizer, collectives and sends). Each trace file opens in "
        "https://ui.perfetto.dev.")
    summaries = {strategy_label(summary): summary for summary in data.summaries}
    for label, spans in data.spans.items():
        name = slug(label)
        num_ranks = int(spans["rank"].max()) + 1
        shown = min(num_ranks, MAX_GANTT_RANKS)
        summary = summaries[label]
        folded = (summary.get("symmetry") or summary.get("tensor", {}).get("symmetry") or {}).get("used")
        caption = (f"{label}: one step" + (f" (ranks 0-{shown - 1} of {num_ranks})" if shown < num_ranks else "")
                   + (f" (simulated representatives, standing for all {summary['num_gpus']} GPUs)"
                      if folded else "") + "; thick bars: compute stream, thin bars: collectives and sends")
        section.figures.append(Figure(f"fig-timeline-{name}", caption, figure_png(
            lambda axis, spans=spans: plots.plot_gantt(spans, axis, MAX_GANTT_RANKS),
            (8.0, 1.5 + 0.3 * shown))))
        labels = {row["rank"]: f"rank {row['rank']} (gpu{row['device']}, node {row['node']})"
                  for row in summary["devices"]}
        path = f"traces/{name}.trace.json"
        files[path] = (json.dumps(trace_events(spans, labels), indent=1) + "\n").encode()
        section.links.append((f"{label}: Perfetto trace", path))
    return section


def memory_frame(summaries: list[dict]) -> pd.DataFrame | None:
    """Rows strategy, rank, peak_memory_bytes; None if a summary has no memory figures."""
    rows = []
    for summary in summaries:
        for device in summary["devices"]:
            if device.get("peak_memory_bytes") is None:
                return None
            rows.append({"strategy": strategy_label(summary), "rank": device["rank"],
                         "peak_memory_bytes": device["peak_memory_bytes"],
                         "capacity_bytes": capacity_bytes(summary)})
    return pd.DataFrame(rows)


def capacity_bytes(summary: dict) -> float | None:
    """The device memory capacity the summary's memory model used (`memory.capacity_bytes`)."""
    memory = summary.get("memory")
    value = memory.get("capacity_bytes") if isinstance(memory, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def memory_section(data: ReportInput) -> Section:
    section = Section("memory", "Memory per device")
    frame = memory_frame(data.summaries)
    if frame is None:
        section.paragraphs.append("The summary has no memory figures (no `devices[].peak_memory_bytes`).")
        return section
    known = frame["capacity_bytes"].dropna()
    capacity = float(known.min()) if len(known) else (
        data.scenario.cluster.gpu.memory_bytes if data.scenario is not None else None)
    if capacity is None:
        section.paragraphs.append("The result records no device capacity: peaks shown without it.")
    section.figures.append(Figure("fig-memory", "Peak memory per rank against the device capacity", figure_png(
        lambda axis: plots.plot_memory(frame, axis, capacity))))
    peaks = frame.groupby("strategy", sort=False)["peak_memory_bytes"].max()
    display = pd.DataFrame({"strategy": peaks.index,
                            "peak memory, largest rank (GiB)": [f"{v / GIB:.3f}" for v in peaks]})
    if capacity:
        display["capacity (GiB)"] = f"{capacity / GIB:.3f}"
        display["fits"] = ["yes" if v <= capacity else "no" for v in peaks]
    section.tables.append(Table("memory-table", display, caption="memory"))
    return section
