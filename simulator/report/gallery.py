"""The paper gallery: one report per seed paper (HTML + Markdown + figures + data CSVs), each
stating the paper's claims beside our simulated figures, plus an index README.

`ghpsim gallery --out reports/gallery` regenerates it. Every output path is checked before any entry
is built (an entry folder that is a file: one line, exit 2). Each entry's files are written all or
none, replacing those of the same name. Of the other files in an entry's folder, only those the
earlier report there wrote (its report.md links them, in figures/, traces/ and data/) are removed;
a file the gallery did not write (a user's notes, figure or CSV) is kept.
Entries: gallery_ghp, gallery_hyparflow, gallery_spectrain, gallery_pase, gallery_laysa (each
`build(root, quick) -> GalleryEntry`); the claim section type is gallery_claims.py. Output is
byte-identical on re-run (fixed order, no times or absolute paths, PNGs without metadata) as long as
matplotlib and pandas stay at the same versions (their rendering and number formatting).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.output import check_output_file, check_output_folder

ROOT = Path(__file__).resolve().parents[2]
INDEX_NAME = "README.md"
ENTRIES = {"ghp": "simulator.report.gallery_ghp", "hyparflow": "simulator.report.gallery_hyparflow",
           "spectrain": "simulator.report.gallery_spectrain", "pase": "simulator.report.gallery_pase",
           "laysa": "simulator.report.gallery_laysa"}
QUICK_NOTE = "reduced sizes (--quick): not the committed gallery"


def run(args) -> int:
    names = parse_names(args.only)
    check_output_folder(args.out, "--out")
    check_output_paths(args.out, names)
    written = build_gallery(args.out, names, quick=args.quick, show_progress=not args.json)
    if args.json:
        print(json.dumps(written, indent=1, allow_nan=False))
    else:
        for entry in written["entries"]:
            print(f"{entry['name']:10s} {entry['html']}  {entry['headline']}")
        if written["index"]:
            print(f"index: {written['index']}")
    return 0


def parse_names(text: str | None) -> list[str]:
    """The entries `--only` names (all of them when not given); ScenarioError, before anything is
    drawn, for an unknown name, an empty item ("pase,") or a name given twice, as other comma flags."""
    if text is None:
        return list(ENTRIES)
    from simulator.compare import comma_items

    names = comma_items(text, "--only")
    if any(name not in ENTRIES for name in names):
        raise ScenarioError(f"--only: {text!r}: choose from {', '.join(ENTRIES)}")
    return names


def check_output_paths(out_dir: str | Path, names: list[str]) -> None:
    """ScenarioError naming the path unless each entry's folder, its report files and sub-folders,
    and (every entry built) the index README can be written: refused before any entry is built."""
    from simulator.report.render import HTML_NAME, MARKDOWN_NAME, OWNED_FILES

    out_dir = Path(out_dir)
    for name in names:
        folder = out_dir / name
        check_output_folder(folder, "--out")
        for file_name in (MARKDOWN_NAME, HTML_NAME):
            check_output_file(folder / file_name, "--out")
        for sub_folder in OWNED_FILES:
            check_output_folder(folder / sub_folder, "--out")
    if set(names) == set(ENTRIES):
        check_output_file(out_dir / INDEX_NAME, "--out")


def build_entry(name: str, quick: bool = False, root: Path = ROOT):
    """One GalleryEntry (simulated and drawn, not written)."""
    entry = importlib.import_module(ENTRIES[name]).build(root, quick)
    if quick:
        entry.report.meta.append(("sizes", QUICK_NOTE))
    return entry


def build_gallery(out_dir: str | Path, names: list[str] | None = None, quick: bool = False,
                  show_progress: bool = True, root: Path = ROOT) -> dict:
    """Build and write each entry into out_dir/<name>/ (all its files or none), remove the files of
    the earlier report there that this one did not write (`earlier_report_files`: no other file),
    then write the index README when every entry was built. Returns what was written (paths,
    headlines, removed files)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

    from simulator.output import write_text_atomic
    from simulator.progress import stderr_progress
    from simulator.report.render import (HTML_NAME, MARKDOWN_NAME, earlier_report_files, remove_stale_files,
                                         write_report)

    names = names or list(ENTRIES)
    out_dir = Path(out_dir)
    entries, written = [], []
    progress = stderr_progress(TextColumn("gallery {task.description}"), BarColumn(), MofNCompleteColumn(),
                               enabled=show_progress)
    with progress:
        task = progress.add_task("", total=len(names))
        for name in names:
            progress.update(task, description=name)
            entry = build_entry(name, quick, root)
            earlier = earlier_report_files(out_dir / name)
            paths = write_report(entry.report, out_dir / name)
            removed = remove_stale_files(earlier, paths)  # after the write: a failed entry leaves its folder as it was
            entries.append(entry)
            written.append({"name": name, "html": str(out_dir / name / HTML_NAME),
                            "markdown": str(out_dir / name / MARKDOWN_NAME), "headline": entry.headline,
                            "figures": [f.id for s in entry.report.sections for f in s.figures],
                            "verdicts": [claim.verdict for claim in entry.claims],
                            "removed": [str(path) for path in removed]})
            progress.advance(task)
    index = None
    if set(names) == set(ENTRIES):
        index = str(write_text_atomic(out_dir / INDEX_NAME, index_markdown(entries, quick)))
    return {"out": str(out_dir), "entries": written, "index": index}


def index_markdown(entries, quick: bool = False) -> str:
    """The gallery's README: one line per report with its headline and headline figure."""
    from simulator.report.render import _environment

    template = _environment(autoescape=False).get_template("gallery_index.md.j2")
    return template.render(entries=entries, quick=quick, quick_note=QUICK_NOTE)

