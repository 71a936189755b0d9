"""A `Report` as one self-contained HTML file (figures embedded as base64 PNG) and a Markdown file
(figures as PNG files next to it), from the jinja2 templates in `templates/`; written atomically."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import jinja2
from markupsafe import Markup, escape

from simulator.output import write_files_atomic
from simulator.report.document import Report, Table

HTML_NAME = "report.html"
MARKDOWN_NAME = "report.md"
FIGURE_FOLDER = "figures"
TRACE_FOLDER = "traces"
DATA_FOLDER = "data"
OWNED_FILES = {FIGURE_FOLDER: ".png", TRACE_FOLDER: ".trace.json", DATA_FOLDER: ".csv"}
"""Sub-folder -> suffix of the files a report writes beside report.md (and links from it)."""
_LINK = re.compile(r"\]\(([^()\s]+)\)")
_REPORT_MARK = "\n- ghpsim version: "
"""A meta line of every report.md that ghpsim writes."""


def _environment(autoescape: bool) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("simulator.report", "templates"),
                              autoescape=autoescape, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def table_html(table: Table) -> str:
    return table.frame.to_html(index=False, table_id=table.id, classes="data", border=0, escape=True)


def table_markdown(table: Table) -> str:
    """A pipe table (GitHub Markdown); `|` in cells escaped."""
    def cells(values) -> str:
        return "| " + " | ".join(str(value).replace("|", "\\|").replace("\n", " ") for value in values) + " |"
    lines = [cells(table.frame.columns), "| " + " | ".join("---" for _ in table.frame.columns) + " |"]
    lines += [cells(row) for row in table.frame.itertuples(index=False)]
    return "\n".join(lines)


_CODE = re.compile(r"`([^`]+)`")
_URL = re.compile(r"(https?://[^\s<>\"')]*[^\s<>\"').,;:])")


def inline_html(text) -> Markup:
    """A paragraph's text as HTML: escaped, `code` spans as <code>, web addresses as links (the
    Markdown report shows the same text as written)."""
    html = _CODE.sub(r"<code>\1</code>", str(escape(text)))
    return Markup(_URL.sub(r'<a href="\1">\1</a>', html))


def render_html(report: Report) -> str:
    template = _environment(autoescape=True).get_template("report.html.j2")
    return template.render(report=report, table_html=lambda t: Markup(table_html(t)), inline=inline_html,
                           image=lambda figure: "data:image/png;base64," + base64.b64encode(figure.png).decode())


def render_markdown(report: Report) -> str:
    template = _environment(autoescape=False).get_template("report.md.j2")
    return template.render(report=report, table_markdown=table_markdown,
                           image=lambda figure: f"{FIGURE_FOLDER}/{figure.id}.png")


def report_files(report: Report) -> dict[str, bytes]:
    """Every file of the report, relative path -> content; the HTML file last."""
    files = {f"{FIGURE_FOLDER}/{figure.id}.png": figure.png
             for section in report.sections for figure in section.figures}
    files.update(report.files)
    files[MARKDOWN_NAME] = render_markdown(report).encode()
    files[HTML_NAME] = render_html(report).encode()
    return files


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Render everything first, then write all files or none (`write_files_atomic`): a failure
    while rendering or writing leaves no file of this report behind."""
    files = report_files(report)
    return write_files_atomic({Path(out_dir) / relative: content for relative, content in files.items()})


def earlier_report_files(out_dir: str | Path) -> list[Path]:
    """The files of the report already in `out_dir`: those its report.md links to in `OWNED_FILES`
    (none when there is no report.md or it is not one ghpsim wrote)."""
    try:
        text = (Path(out_dir) / MARKDOWN_NAME).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    if _REPORT_MARK not in text:
        return []
    found = []
    for link in dict.fromkeys(_LINK.findall(text)):
        folder, _, name = link.partition("/")
        if (folder in OWNED_FILES and name.endswith(OWNED_FILES[folder]) and not name.startswith(".")
                and "/" not in name and "\\" not in name):
            found.append(Path(out_dir) / folder / name)
    return found


def remove_stale_files(earlier: list[Path], written: list[Path]) -> list[Path]:
    """Remove the `earlier` report's files that this report did not write (`written`), then each of
    their folders that this left empty; returns the files removed."""
    keep = {path.resolve() for path in written}
    removed = [path for path in earlier if (path.is_file() or path.is_symlink()) and path.resolve() not in keep]
    for path in removed:
        path.unlink()
    for folder in dict.fromkeys(path.parent for path in removed):
        if not any(folder.iterdir()):
            folder.rmdir()
    return removed
