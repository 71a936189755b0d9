"""The seed-paper gallery: one report per seed paper (HTML + Markdown + figures + data CSVs), each
stating the paper's claims beside our simulated figures, plus an index README.

`ghpsim gallery --out reports/gallery` regenerates it.
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
from simulator.output import check_output_folder

ROOT = Path(__file__).resolve().parents[2]
INDEX_NAME = "README.md"
ENTRIES = {"ghp": "simulator.report.gallery_ghp", "hyparflow": "simulator.report.gallery_hyparflow",
           "spectrain": "simulator.report.gallery_spectrain", "pase": "simulator.report.gallery_pase",
           "laysa": "simulator.report.gallery_laysa"}
QUICK_NOTE = "reduced sizes (--quick): not the committed gallery"


def run(args) -> int:
    names = parse_names(args.only)
    check_output_folder(args.out, "--out")
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
    if text is None:
        return list(ENTRIES)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in ENTRIES]
    if unknown or not names:
        raise ScenarioError(f"--only: {text!r}: choose from {', '.join(ENTRIES)}")
    return list(dict.fromkeys(names))


def build_entry(name: str, quick: bool = False, root: Path = ROOT):
    """One GalleryEntry (simulated and drawn, not written)."""
    entry = importlib.import_module(ENTRIES[name]).build(root, quick)
    if quick:
        entry.report.meta.append(("sizes", QUICK_NOTE))
    return entry


def build_gallery(out_dir: str | Path, names: list[str] | None = None, quick: bool = False,
                  show_progress: bool = True, root: Path = ROOT) -> dict:
    """Build and write each entry into out_dir/<name>/ (atomic files), then the index README when
    every entry was built. Returns what was written (paths and headlines)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

    from simulator.output import write_text_atomic
    from simulator.progress import stderr_progress
    from simulator.report.render import HTML_NAME, MARKDOWN_NAME, write_report

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
            paths = write_report(entry.report, out_dir / name)
            prune_stale(out_dir / name, paths)
            entries.append(entry)
            written.append({"name": name, "html": str(out_dir / name / HTML_NAME),
                            "markdown": str(out_dir / name / MARKDOWN_NAME), "headline": entry.headline,
                            "figures": [f.id for s in entry.report.sections for f in s.figures],
                            "verdicts": [claim.verdict for claim in entry.claims]})
            progress.advance(task)
    index = None
    if set(names) == set(ENTRIES):
        index = str(write_text_atomic(out_dir / INDEX_NAME, index_markdown(entries, quick)))
    return {"out": str(out_dir), "entries": written, "index": index}


PRUNED = {"figures": ".png", "data": ".csv", "traces": ".trace.json"}
"""Sub-folders of an entry whose files only the gallery writes: leftovers of an earlier run are removed."""


def prune_stale(folder: Path, written: list[Path]) -> list[Path]:
    """Remove the figures/*.png, data/*.csv and traces/*.trace.json in `folder` that this run did
    not write (a renamed figure must not linger in the committed gallery); returns them."""
    keep = {path.resolve() for path in written}
    stale = [path for sub, suffix in PRUNED.items() for path in sorted((folder / sub).glob(f"*{suffix}"))
             if path.resolve() not in keep]
    for path in stale:
        path.unlink()
    return stale


def index_markdown(entries, quick: bool = False) -> str:
    """The gallery's README: one line per report with its headline and headline figure."""
    from simulator.report.render import _environment

    template = _environment(autoescape=False).get_template("gallery_index.md.j2")
    return template.render(entries=entries, quick=quick, quick_note=QUICK_NOTE)

