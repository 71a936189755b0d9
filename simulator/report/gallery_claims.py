"""The gallery's own section type, "paper claim vs our figure", and what every gallery entry
shares: the paper's citation, the scenario sections, number formats and the entry's shape.

A claim row says what the paper claims (in our words, from its abstract),
the paper's figure, ours from the simulation, a verdict, and why they differ; the table shows the
first four, numbered paragraphs under it the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from simulator.report.document import Figure, Report, Section, Table, ghpsim_version
from simulator.report.inputs import ReportInput
from simulator.scenario import Scenario

VERDICTS = ("agrees", "partly agrees", "disagrees", "not modelled")
"""agrees: same direction and roughly the same size; partly: same direction, another size (or
only in part of the range); disagrees: the other direction; not modelled: the simulator has no
counterpart to check."""


@dataclass(frozen=True)
class Claim:
    claim: str
    """What the paper claims, in our words."""
    paper: str
    """The paper's figure, as text ("110x at 128 nodes")."""
    ours: str
    """Our figure, formatted from the simulation results."""
    verdict: str
    why: str
    """Why the figures differ (or agree): the mechanism, and what our model leaves out."""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(VERDICTS)}")


@dataclass(frozen=True)
class Paper:
    key: str
    """Folder name of the entry (`reports/gallery/<key>/`)."""
    short: str
    citation: str
    seed: str
    """The seed file the claims are read from."""


@dataclass
class GalleryEntry:
    """One gallery report, with the raw numbers behind its tables (also written as CSV)."""

    paper: Paper
    report: Report
    headline: str
    """One line for the gallery index: our figure beside the paper's."""
    headline_figure: str
    """Id of the figure the index shows (`figures/<id>.png`)."""
    data: dict[str, pd.DataFrame] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)


def claims_section(claims: list[Claim], figure: Figure | None = None, intro: str = "") -> Section:
    """The "paper claim vs our figure" section: a table of claims and the entry's headline figure
    (the reasons follow in `reasons_section`)."""
    frame = pd.DataFrame({
        "#": [str(n) for n in range(1, len(claims) + 1)],
        "paper's claim": [c.claim for c in claims],
        "paper": [c.paper for c in claims],
        "ours (simulated)": [c.ours for c in claims],
        "verdict": [c.verdict for c in claims],
    })
    return Section("claims", "Paper claim vs our figure", paragraphs=[intro] if intro else [],
                   tables=[Table("claims-table", frame, caption="claims")],
                   figures=[figure] if figure is not None else [])


def reasons_section(claims: list[Claim]) -> Section:
    """Why each figure differs from the paper's (or agrees), numbered as the claims table."""
    return Section("reasons", "Why the figures differ", paragraphs=[
        f"({n}) {c.verdict.capitalize()}. {c.why}" for n, c in enumerate(claims, start=1)])


def paper_section(paper: Paper, setting: list[str]) -> Section:
    """Which paper, where its claims come from, and the setting we simulate."""
    return Section("paper", "The paper and our setting", paragraphs=[
        f"{paper.citation}. Claims are read from the paper's abstract "
        "(not the full paper) and restated in our words; figures the abstract "
        "does not give are marked as such.", *setting])


def scenario_sections(scenarios: list[tuple[Scenario, int, int]]) -> list[Section]:
    """The existing report's scenario section for each (scenario, num_params, num_layers), ids
    prefixed by the scenario's name so that several fit in one report."""
    from simulator.report.scenario_section import scenario_section

    sections = []
    for scenario, num_params, num_layers in scenarios:
        data = ReportInput(kind="scenario", source=scenario.source or scenario.name, title=scenario.name,
                           scenario=scenario, num_params=num_params, num_layers=num_layers)
        section = prefixed(scenario_section(data), scenario.name)
        section.title = f"Scenario {scenario.name}"
        sections.append(section)
    return sections


def prefixed(section: Section, prefix: str, files: dict[str, bytes] | None = None,
             into: dict[str, bytes] | None = None) -> Section:
    """A copy of `section` with `prefix-` before its id, its tables' and figures' ids and (when
    `files` is given) the paths of its links, whose files are moved from `files` to `into`."""
    links = []
    for text, path in section.links:
        folder, _, name = path.rpartition("/")
        new_path = f"{folder}/{prefix}-{name}" if folder else f"{prefix}-{name}"
        if files is not None and into is not None and path in files:
            into[new_path] = files.pop(path)
        links.append((text, new_path))
    return replace(section, id=f"{prefix}-{section.id}", paragraphs=list(section.paragraphs),
                   tables=[replace(t, id=f"{prefix}-{t.id}") for t in section.tables],
                   figures=[replace(f, id=f"{prefix}-{f.id}") for f in section.figures], links=links)


def reproduce_section(commands: list[str], notes: list[str] = ()) -> Section:
    return Section("reproduce", "Reproduce", paragraphs=[
        "Regenerate the whole gallery with `ghpsim gallery --out reports/gallery`; the raw numbers of this "
        "report's tables are in data/*.csv. The single steps: "
        + "; ".join(f"`{command}`" for command in commands) + ".", *notes])


def gallery_report(paper: Paper, sections: list[Section], files: dict[str, bytes],
                   data: dict[str, pd.DataFrame], scenario_files: list[str]) -> Report:
    """The entry's Report: meta lines, the sections, the data frames as CSV files, linked from the
    reproduce section (a re-run removes only files its report.md links: `earlier_report_files`)."""
    meta = [("paper", paper.citation), ("ghpsim version", ghpsim_version()),
            ("costs", "datasheet catalogue, costs.model as the scenario sets it (no calibration profile)"),
            ("inputs", ", ".join(scenario_files)),
            ("generated by", "ghpsim gallery")]
    files = dict(files)
    data_links = []
    for key, frame in data.items():
        files[f"data/{key}.csv"] = frame.to_csv(index=False, lineterminator="\n").encode()
        data_links.append((f"data: {key}", f"data/{key}.csv"))
    sections = [replace(section, links=[*section.links, *data_links]) if section.id == "reproduce" else section
                for section in sections]
    if data_links and not any(section.id == "reproduce" for section in sections):
        sections.append(Section("data", "Data", links=data_links))
    return Report(title=f"Gallery: {paper.short}", meta=meta, sections=sections, files=files)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def times(ratio: float) -> str:
    return f"{ratio:.2f}x"


def pct(fraction: float) -> str:
    """A signed percentage of a change: 0.175 -> +17.5 %."""
    return f"{100 * fraction:+.1f} %"


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f}"
