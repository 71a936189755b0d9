"""A report of a `ReportInput`: the sections that apply to its kind (`document.py` holds the report
as data, `render.py` turns it into HTML and Markdown)."""

from __future__ import annotations

from simulator.report import cost_models
from simulator.report.document import Report, ghpsim_version
from simulator.report.inputs import ReportInput
from simulator.report.scenario_section import scenario_section
from simulator.report.strategy_sections import strategy_sections
from simulator.report.table_sections import sweep_sections, validation_sections


def build_report(data: ReportInput, title: str | None = None) -> Report:
    """All sections that apply to the input's kind."""
    sections = [scenario_section(data)]
    files: dict[str, bytes] = {}
    if data.kind in ("scenario", "compare", "simulate"):
        sections += strategy_sections(data, files)
    elif data.kind == "sweep":
        sections += sweep_sections(data.table)
    else:
        sections += validation_sections(data.table)
    meta = [("ghpsim version", ghpsim_version()), ("input", f"{data.source} ({data.kind})"),
            ("costs", profile_text(data))]
    return Report(title=title or f"ghpsim report: {data.title}", meta=meta, sections=sections, files=files)


def profile_text(data: ReportInput) -> str:
    """The cost model the result records (`cost_models`), or the calibration profile given."""
    if data.profile:
        return f"calibration profile {data.profile}"
    if data.kind == "validation":
        return "predictions from the calibration profile given to `ghpsim validate` (not recorded in the table)"
    if data.kind == "sweep":
        return cost_models.sweep_text(data.sweep_costs)
    return cost_models.summaries_text(data.summaries)
