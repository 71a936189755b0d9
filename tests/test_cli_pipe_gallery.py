"""A closed output pipe ends every command with exit code 141 and nothing on stderr (rich's consoles
included, whose own handler exits with 1, the code of a bug); README's `rank` example says what the
command prints; `gallery --only` refuses an empty item or a name given twice, as other comma flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ghpsim.cli import EXIT_BROKEN_PIPE, main
from tests.test_readme import README, examples_by_command

ROOT = Path(__file__).resolve().parent.parent
DEMO = "scenarios/demo.yaml"
TIMEOUT_S = 300


def ghpsim_popen(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "ghpsim", *args], cwd=ROOT, env=env, **kwargs)


# ----------------------------------------------------------------------------- closed output pipe

@pytest.mark.parametrize("argv", [
    ("simulate", DEMO),
    ("rank", DEMO, "--gpus", "16", "--kinds", "dp,mp,ghp", "--top", "5"),
    ("partition", DEMO),
    ("compare", DEMO, "--strategies", "dp,mp"),
    ("list", "gpus"),
], ids=lambda argv: argv[0])
def test_reader_gone_exits_141_silently(argv):
    """The reader closes its end before the command writes (`ghpsim ... | head -1` once head has
    its line): the first write finds the pipe closed, so the outcome does not depend on timing."""
    process = ghpsim_popen(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.communicate(timeout=TIMEOUT_S)[1]
    assert process.returncode == EXIT_BROKEN_PIPE, stderr.decode(errors="replace")
    assert stderr == b""


def test_reader_gone_after_the_first_line():
    """`head -1` on simulate's output: the first line arrives, then the reader goes away."""
    process = ghpsim_popen("simulate", DEMO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.communicate(timeout=TIMEOUT_S)[1]
    assert first.startswith(b"demo: ")
    assert process.returncode in (0, EXIT_BROKEN_PIPE)  # 0 when it had written all before the close
    assert stderr == b""


# ----------------------------------------------------------------------------- README's rank example

def test_readme_rank_example_says_what_it_prints():
    """The sentence after README's `rank` example (up to "Also searched") names the rows printed:
    their count in words and any "#" cell it quotes (a merged row such as `#` 4-5)."""
    example = examples_by_command()["rank"]
    text = README.read_text(encoding="utf-8")
    after = text[text.index(example):]
    description = after[after.index("```") + 3:after.index("Also searched")]
    result = subprocess.run([sys.executable, "-m", "ghpsim", *example.split()[1:]], cwd=ROOT, capture_output=True,
                            text=True, timeout=TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    first_table = result.stdout[:result.stdout.index("└")]
    cells = re.findall(r"^│ (\S+) +│", first_table, flags=re.MULTILINE)
    top = int(re.search(r"--top (\d+)", example).group(1))
    words = {5: "five"}
    assert f"the {words[top]} fastest" in description and len(cells) == top
    for merged in re.findall(r"`#` (\d+-\d+)", description):  # a row two layouts share
        assert merged in cells, (merged, cells)
    assert cells == [str(position) for position in range(1, top + 1)] and f"`#` 1 to {top}" in description


# ----------------------------------------------------------------------------- gallery --only

@pytest.mark.parametrize("only, says", [("pase,pase", "pase is given twice"), ("pase,", "has an empty item"),
                                        ("ghp, pase ,ghp", "ghp is given twice"), (",", "is an empty list"),
                                        ("", "is an empty list")])
def test_gallery_only_refuses_duplicate_and_empty_items(capsys, tmp_path, only, says):
    out = tmp_path / "gallery"
    assert main(["gallery", "--out", str(out), "--only", only, "--quick"]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip()
    assert len(error.splitlines()) == 1 and error.startswith("ghpsim: error: --only") and says in error
    assert captured.out == "" and not out.exists()  # refused before anything is drawn or written
