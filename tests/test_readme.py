"""README.md tells the truth: it is short, it shows every command `ghpsim --help` lists, its set-up
commands are the ones CI runs, and its examples run.

Every `ghpsim ...` line of a fenced `console` or `bash` block is an example. Cheap ones run for
real, from the repository root, with their output paths moved into a temporary folder; expensive
ones (minutes of calibration or real training, large grids) are checked against their `--help`:
every `--flag` the example uses must be one the command has, and every input file it names must
exist. Profiles under `profiles/` are the reader's own calibrations (the README's `calibrate`
writes them); a committed profile stands in for each where an example reads one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
MAX_LINES = 250

# Commands whose README example runs for real (seconds each); the others are checked with --help.
RUN = {"demo", "simulate", "compare", "list", "rank", "search", "partition", "schedule", "report",
       "merge-profiles", "import-model"}
HELP_ONLY = {"calibrate", "validate", "sweep", "gallery", "fit"}
OUTPUT_FLAGS = {"--out", "--trace", "--memory-plot", "--plot"}
USER_PROFILES = "profiles/"  # the reader's calibrations, not in the repository
STAND_IN_PROFILE = ROOT / "reports" / "profiles" / "mlp_cpu_ws2.json"
INPUT_SUFFIXES = (".yaml", ".yml", ".json", ".csv")
TIMEOUT_S = 300


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block of `text`."""
    blocks, language, lines = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and language is None:
            language, lines = fence.group(1), []
        elif line.startswith("```") and language is not None:
            blocks.append((language, lines))
            language = None
        elif language is not None:
            lines.append(line)
    assert language is None, "README.md has an unclosed code fence"
    return blocks


def readme_examples() -> list[str]:
    """The `ghpsim ...` command lines of the README's console and bash blocks, `$ ` prompt removed."""
    examples = []
    for language, lines in fenced_blocks(README.read_text(encoding="utf-8")):
        if language not in ("console", "bash"):
            continue
        for line in lines:
            command = line.removeprefix("$ ").strip()
            if command.startswith("ghpsim "):
                examples.append(command)
    return examples


def ghpsim(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "ghpsim", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def listed_commands() -> list[str]:
    """The commands `ghpsim --help` lists (one per line, indented four spaces)."""
    result = ghpsim("--help")
    assert result.returncode == 0, result.stderr
    commands = re.findall(r"^ {4}([a-z][a-z0-9-]*)(?:\s|$)", result.stdout, flags=re.MULTILINE)
    assert commands, result.stdout
    return commands


def command_of(example: str) -> str:
    return shlex.split(example)[1]


def examples_by_command() -> dict[str, str]:
    """The first README example of each command (the one a reader copies)."""
    found: dict[str, str] = {}
    for example in readme_examples():
        found.setdefault(command_of(example), example)
    return found


def flags(arguments: list[str]) -> list[str]:
    return [argument.split("=", 1)[0] for argument in arguments if argument.startswith("--")]


def outputs(arguments: list[str]) -> set[int]:
    """Positions of the arguments that are output paths."""
    return {position + 1 for position, argument in enumerate(arguments[:-1]) if argument in OUTPUT_FLAGS}


def input_files(arguments: list[str]) -> list[str]:
    written = outputs(arguments)
    return [argument for position, argument in enumerate(arguments)
            if position not in written and not argument.startswith("-") and argument.endswith(INPUT_SUFFIXES)]


def relocated(arguments: list[str], tmp_path: Path) -> list[str]:
    """`arguments` with every output path and every user profile moved under `tmp_path`; a user
    profile that is read gets a committed profile as its stand-in."""
    written = outputs(arguments)
    moved, stand_ins = [], 0
    for position, argument in enumerate(arguments):
        if position in written or argument.startswith(USER_PROFILES):
            target = tmp_path / argument
            target.parent.mkdir(parents=True, exist_ok=True)
            if position not in written and not target.exists():
                stand_ins += 1  # each a distinct calibration: merge-profiles refuses one given twice
                stand_in = json.loads(STAND_IN_PROFILE.read_text())
                stand_in["p2p"]["latency_s"] *= stand_ins
                target.write_text(json.dumps(stand_in))
            argument = str(target)
        moved.append(argument)
    return moved


# ----------------------------------------------------------------------------- shape


def test_readme_is_at_most_250_lines():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_LINES, f"README.md has {count} lines; at most {MAX_LINES}"


def test_every_listed_command_has_a_fenced_example():
    shown = set(examples_by_command())
    missing = [command for command in listed_commands() if command not in shown]
    assert not missing, f"README.md has no fenced `ghpsim <command>` example for: {', '.join(missing)}"


def test_every_listed_command_is_classified_here():
    """A new command needs a decision in this file: run its example, or check it against --help."""
    assert set(listed_commands()) <= RUN | HELP_ONLY


def test_readme_speaks_of_the_product_not_its_history():
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "README.md dates an investigation"
    assert not re.search(r"\bsessions?\b", text, flags=re.IGNORECASE), "README.md speaks of sessions"
    assert not re.search(r"`s\d+_\w+`", text), "README.md names a run by its nickname"


# ----------------------------------------------------------------------------- set-up


def setup_commands() -> list[str]:
    """The command lines of the README's 'Set-up' section (its fenced blocks, comments dropped)."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Set-up.*?$(.*?)^## ", text, flags=re.MULTILINE | re.DOTALL)
    assert section, "README.md has no '## Set-up' section"
    return [line.strip() for _, lines in fenced_blocks(section.group(1)) for line in lines
            if line.strip() and not line.strip().startswith("#")]


def ci_test_command() -> str:
    """The command .ci/run runs: its last line that is not a comment, `set` or `cd`."""
    lines = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert commands, f"{CI_RUN} runs nothing"
    return commands[-1]


def test_setup_is_two_commands_and_the_test_one_is_what_ci_runs():
    commands = setup_commands()
    assert len(commands) == 2, commands
    demo, tests = commands
    assert tests == ci_test_command()
    assert "pytest" in tests and "torch==2.13.0" in tests
    assert re.fullmatch(r"(python -m )?pip install -e \. && ghpsim demo", demo), demo


# ----------------------------------------------------------------------------- the examples


EXAMPLES = readme_examples()


def check_inputs_exist(example: str, arguments: list[str]) -> None:
    for path in input_files(arguments):
        assert path.startswith(USER_PROFILES) or (ROOT / path).is_file(), f"{example}: no file {path}"


def test_there_are_examples():
    assert len(EXAMPLES) >= len(RUN | HELP_ONLY)


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{n}-{command_of(e)}" for n, e in enumerate(EXAMPLES)])
def test_example(example, tmp_path):
    """Cheap examples run for real (exit 0, their outputs written); expensive ones use only flags
    their command's --help lists. Both name only input files that exist."""
    command, arguments = command_of(example), shlex.split(example)[1:]
    assert command in RUN | HELP_ONLY, f"{example}: unknown command {command}"
    check_inputs_exist(example, arguments)
    if command in HELP_ONLY:
        result = ghpsim(command, "--help")
        assert result.returncode == 0, result.stderr
        unknown = [flag for flag in flags(arguments[1:])
                   if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", result.stdout)]
        assert not unknown, f"{example}: `ghpsim {command} --help` has no {', '.join(unknown)}"
        return
    if command == "import-model":
        pytest.importorskip("torch")
    result = ghpsim(*relocated(arguments, tmp_path))
    assert result.returncode == 0, f"{example}\n{result.stderr}"
    for position in outputs(arguments):
        assert (tmp_path / arguments[position]).exists(), f"{example}: wrote nothing at {arguments[position]}"
