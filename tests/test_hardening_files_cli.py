"""Bad input and interrupts at the edges of the command line: the gallery's output folders (a user's
files kept, a blocked path refused before any building), a sweep whose results.csv would hold a
column twice, and a Ctrl-C while `ghpsim` loads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ghpsim.cli
from ghpsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "scenarios" / "demo.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def one_line_error(capsys, argv: list[str]) -> str:
    """Run `ghpsim ARGV` in-process; assert exit code 2 and one line on stderr; return that line."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ghpsim: error: ") and "Traceback" not in captured.err, lines
    return lines[0]


# ----------------------------------------------------------------------------- gallery

def test_gallery_keeps_files_it_did_not_write_and_removes_its_own_stale_ones(tmp_path, capsys):
    out = tmp_path / "gallery"
    folder = out / "laysa"
    (folder / "figures").mkdir(parents=True)
    (folder / "data").mkdir()
    mine = {folder / "notes.txt": b"my notes", folder / "figures" / "my_plot.png": PNG_SIGNATURE,
            folder / "data" / "my_numbers.csv": b"a,b\n1,2\n"}
    for path, content in mine.items():
        path.write_bytes(content)
    assert main(["gallery", "--out", str(out), "--only", "laysa", "--quick", "--json"]) == 0
    assert all(path.read_bytes() == content for path, content in mine.items())  # no earlier report: nothing removed
    markdown = (folder / "report.md").read_text()
    for csv_file in (folder / "data").glob("*.csv"):  # each CSV the gallery wrote is linked, so a re-run owns it
        assert csv_file in mine or f"](data/{csv_file.name})" in markdown

    stale = {folder / "figures" / "fig-renamed.png": PNG_SIGNATURE, folder / "data" / "renamed.csv": b"x\n"}
    for path, content in stale.items():  # files an earlier gallery report wrote (its report.md links them)
        path.write_bytes(content)
    (folder / "report.md").write_text(markdown + "\n![old](figures/fig-renamed.png)\n\n- [old](data/renamed.csv)\n")
    capsys.readouterr()
    assert main(["gallery", "--out", str(out), "--only", "laysa", "--quick", "--json"]) == 0
    assert '"removed": [' in capsys.readouterr().out
    assert not any(path.exists() for path in stale)
    assert all(path.read_bytes() == content for path, content in mine.items())


def _never(*_args, **_kwargs):
    raise AssertionError("an entry was built: the blocked output path should have been refused before")


@pytest.mark.parametrize("blocked, only", [
    ("ghp", "pase,ghp"),  # an entry's folder is a file
    ("ghp/figures", "ghp"),  # a sub-folder of an entry is a file
    ("pase/report.md/", "pase"),  # a report file is a folder
    ("README.md/", None),  # the index README (written when every entry is built) is a folder
])
def test_gallery_refuses_a_blocked_entry_path_before_building(tmp_path, capsys, monkeypatch, blocked, only):
    import simulator.report.gallery

    monkeypatch.setattr(simulator.report.gallery, "build_entry", _never)
    out = tmp_path / "gallery"
    path = out / blocked.rstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if blocked.endswith("/"):
        path.mkdir()
    else:
        path.write_text("a user's file")
    before = sorted(out.rglob("*"))
    line = one_line_error(capsys, ["gallery", "--out", out, "--quick", *(["--only", only] if only else [])])
    assert f"--out {path}: " in line
    assert sorted(out.rglob("*")) == before  # nothing written


# ----------------------------------------------------------------------------- sweep

def write_sweep(tmp_path: Path, axes: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {DEMO}\naxes:\n{textwrap.indent(textwrap.dedent(axes), '  ')}")
    return path


@pytest.mark.parametrize("axes, message", [
    ("strategy.kind,strategy.kind: [[dp, dp]]\n",
     "axes.strategy.kind,strategy.kind: 'strategy.kind' appears twice in this axis"),
    ("strategy.kind, strategy.num_groups,strategy.kind: [[dp, 1, dp]]\n",
     "'strategy.kind' appears twice in this axis"),
    ("strategy.kind: [dp]\ncluster.num_nodes,strategy.kind: [[1, dp]]\n",
     "axes: 'strategy.kind' appears in two axes ('strategy.kind' and 'cluster.num_nodes,strategy.kind')"),
    ("strategy: [{kind: dp}, {kind: ghp, num_groups: 4}]\n",
     "axes: 'strategy' is also a column of results.csv"),
    ("cluster.num_nodes: [1, 2]\nmodel: [{name: vgg16}]\n",
     "axes: 'model' is also a column of results.csv"),
])
def test_a_sweep_column_given_twice_is_named_in_one_line(tmp_path, capsys, axes, message):
    path = write_sweep(tmp_path, axes)
    out = tmp_path / "out"
    line = one_line_error(capsys, ["sweep", path, "--out", out, "--workers", "1", "--no-progress"])
    assert line.startswith(f"ghpsim: error: {path}: ") and message in line, line
    assert not out.exists()


def test_a_whole_section_axis_is_refused_with_a_field_below_it_to_sweep(tmp_path, capsys):
    line = one_line_error(capsys, ["sweep", write_sweep(tmp_path, "strategy: [{kind: dp}]\n"), "--out",
                                   tmp_path / "out"])
    assert "e.g. 'strategy.kind'" in line


# ----------------------------------------------------------------------------- Ctrl-C while loading

INTERRUPT_ON_IMPORT = """
import builtins, sys
real_import = builtins.__import__

def interrupted_import(name, *args, **kwargs):
    if name == "argparse":  # the first module ghpsim.cli imports: a Ctrl-C while it loads
        raise KeyboardInterrupt
    return real_import(name, *args, **kwargs)

builtins.__import__ = interrupted_import
sys.argv = ["ghpsim", "--help"]
"""


@pytest.mark.parametrize("entry", [
    "import runpy\nrunpy.run_module('ghpsim', run_name='__main__', alter_sys=True)",  # python -m ghpsim
    "from ghpsim.cli import main\nsys.exit(main())",  # the console script `ghpsim` (ghpsim.cli:main)
])
def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130(entry):
    done = subprocess.run([sys.executable, "-c", INTERRUPT_ON_IMPORT + entry], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "ghpsim: interrupted\n")


def test_ctrl_c_while_the_arguments_are_parsed_is_one_line_and_exit_130(capsys, monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(ghpsim.cli, "build_parser", interrupted)
    assert main(["list", "gpus"]) == 130
    assert capsys.readouterr() == ("", "ghpsim: interrupted\n")
