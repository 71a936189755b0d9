"""A report as data: sections of paragraphs, tables (display DataFrames) and figures (PNG bytes);
`build.py` and the gallery make them, `render.py` turns them into HTML and Markdown."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from importlib import metadata

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

PNG_DPI = 110


@dataclass
class Figure:
    id: str
    caption: str
    png: bytes


@dataclass
class Table:
    id: str
    frame: pd.DataFrame
    """Display frame: column names carry units, cells are already formatted strings."""
    caption: str = ""


@dataclass
class Section:
    id: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    """(text, relative path) of files written next to the report."""


@dataclass
class Report:
    title: str
    meta: list[tuple[str, str]]
    sections: list[Section]
    files: dict[str, bytes] = field(default_factory=dict)
    """Extra files (relative path -> content) written next to the report: Perfetto traces."""


def figure_png(draw, size: tuple[float, float] = (7.0, 3.5)) -> bytes:
    """PNG bytes of a new figure on which `draw(axis)` drew (deterministic: no metadata)."""
    figure, axis = plt.subplots(figsize=size)
    try:
        draw(axis)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    finally:
        plt.close(figure)
    return buffer.getvalue()


def slug(text: str) -> str:
    """A file- and id-safe name: `dp (G=4 x M=1)` -> `dp-g4xm1`."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower().replace(" x ", "x").replace("=", ""))).strip("-")


def ghpsim_version() -> str:
    try:
        return metadata.version("ghpsim")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"
