"""`ghpsim report --out DIR` into a folder reused from an earlier report: the folder ends with
exactly the new report's files; files the earlier report did not write are never removed."""

from __future__ import annotations

import json
from pathlib import Path

from ghpsim.cli import main
from simulator.report.render import earlier_report_files
from simulator.sweep import load_sweep, run_sweep

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "scenarios" / "small_fast_dp_wins.yaml")


def _report(capsys, out: Path, *args: str) -> dict:
    assert main(["report", SMALL, "--out", str(out), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _files(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}


def _relative(paths: list[str], folder: Path) -> set[str]:
    return {Path(path).relative_to(folder).as_posix() for path in paths}


def test_a_reused_folder_holds_exactly_the_new_report(tmp_path, capsys):
    out = tmp_path / "out"
    first = _report(capsys, out, "--strategies", "dp,mp,ghp")
    assert any("mp" in Path(path).name for path in first["files"])
    (out / "notes.txt").write_text("mine")
    (out / "figures" / "sketch.jpg").write_text("mine")
    (out / "traces" / "notes.md").write_text("mine")
    second = _report(capsys, out, "--strategies", "dp")
    new = _relative(second["files"], out)
    assert _files(out) == new | {"notes.txt", "figures/sketch.jpg", "traces/notes.md"}
    stale = _relative(first["files"], out) - new
    assert stale and _relative(second["removed"], out) == stale
    assert not any("mp" in name or "ghp" in name for name in _files(out))


def test_a_folder_the_new_report_does_not_use_goes_when_emptied(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {SMALL}\naxes: {{cluster.gpus_per_node: [2, 4]}}\n")
    run_sweep(load_sweep(sweep), tmp_path / "sweep", workers=1, progress=False)
    out = tmp_path / "out"
    _report(capsys, out, "--strategies", "dp,mp")
    assert (out / "traces").is_dir()
    assert main(["report", str(tmp_path / "sweep"), "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert "removed" in line and "earlier report" in line
    assert not (out / "traces").exists()  # a sweep report has no traces
    assert all(name.startswith(("report.", "figures/fig-throughput", "figures/fig-efficiency", "figures/fig-axis"))
               for name in _files(out)), _files(out)


def test_a_file_the_earlier_report_does_not_link_is_kept(tmp_path, capsys):
    out = tmp_path / "out"
    _report(capsys, out, "--strategies", "dp,mp")
    trace = "traces/mp-g1xm4.trace.json"
    assert (out / trace).is_file()
    (out / "report.md").write_text((out / "report.md").read_text().replace(trace, "elsewhere"))
    report = _report(capsys, out, "--strategies", "dp")
    assert trace not in _relative(report["removed"], out) and (out / trace).is_file()
    assert report["removed"]  # mp's figures, still linked, are gone


def test_a_folder_without_an_earlier_report_loses_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    (out / "traces").mkdir()
    (out / "figures" / "fig-mine.png").write_bytes(b"mine")
    (out / "traces" / "mine.trace.json").write_text("{}")
    (out / "report.md").write_text("# my notes\n\n![plot](figures/fig-mine.png)\n[t](traces/mine.trace.json)\n")
    assert _report(capsys, out, "--strategies", "dp,mp")["removed"] == []  # report.md was not a ghpsim report
    report = _report(capsys, out, "--strategies", "dp")  # replaces the dp,mp report, not the user's files
    assert report["removed"] and all("mp" in Path(path).name for path in report["removed"])
    assert _files(out) == _relative(report["files"], out) | {"figures/fig-mine.png", "traces/mine.trace.json"}
    assert (out / "figures" / "fig-mine.png").read_bytes() == b"mine"
    assert (out / "traces" / "mine.trace.json").read_text() == "{}"


def test_a_failed_report_leaves_the_earlier_one_whole(tmp_path, capsys):
    out = tmp_path / "out"
    first = _report(capsys, out, "--strategies", "dp,mp")
    before = {name: (out / name).read_bytes() for name in _files(out)}
    assert main(["report", SMALL, "--strategies", "dp,xyz", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "xyz" in err and "Traceback" not in err
    assert {name: (out / name).read_bytes() for name in _files(out)} == before
    assert _files(out) == _relative(first["files"], out)
    second = _report(capsys, out, "--strategies", "dp")  # the earlier report is still replaced as a whole
    assert _files(out) == _relative(second["files"], out) and second["removed"]


def test_only_links_into_the_report_folders_count(tmp_path):
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text(
        "# ghpsim report: x\n\n- ghpsim version: 0\n\n![a](figures/fig-a.png)\n![b](figures/../../b.png)\n"
        "![c](figures/.hidden.png)\n![d](/etc/d.png)\n[e](traces/e.trace.json)\n[f](traces/f.txt)\n"
        "[g](data/g.csv)\n[h](other/h.png)\n![a again](figures/fig-a.png)\n")
    assert [path.relative_to(out).as_posix() for path in earlier_report_files(out)] == [
        "figures/fig-a.png", "traces/e.trace.json", "data/g.csv"]
    assert earlier_report_files(tmp_path / "missing") == []


def test_html_paragraphs_show_code_spans_and_links_not_markdown():
    from simulator.report.render import inline_html
    html = str(inline_html("Run `ghpsim simulate <s.yaml>` and open https://ui.perfetto.dev. Then a & b"))
    assert html == ('Run <code>ghpsim simulate &lt;s.yaml&gt;</code> and open '
                    '<a href="https://ui.perfetto.dev">https://ui.perfetto.dev</a>. Then a &amp; b')


def test_a_placement_no_grid_uses_is_not_said_to_be_shared():
    """dp (one worker a group) and mp (one group) record the scenario's placement but have no
    choice of it: the scenario section shows '-' for them, as the ranking does, and so does not
    list the placement among what every strategy shares."""
    from simulator.report.scenario_section import strategy_rows, summary_rows
    summaries = [{"scenario": "s", "num_groups": G, "workers_per_group": M, "placement": "stage_per_node"}
                 for G, M in ((8, 2), (1, 16), (16, 1))]
    for summary, kind in zip(summaries, ("ghp", "mp", "dp")):
        summary.update(strategy=kind)
    assert summary_rows(summaries) == {"scenario": "s"}
    assert list(strategy_rows(summaries)["placement"]) == ["stage_per_node", "-", "-"]
