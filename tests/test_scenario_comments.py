"""The `ghpsim simulate ...` commands that the scenario files quote in their comments run.

Every comment of scenarios/*.yaml and scenarios/**/*.yaml is searched for `ghpsim simulate`; each
command found runs in-process (`ghpsim.cli.main`) from the repository root and must exit 0. A
comment once suggested `--set cluster.topology=two_tier` on a fat-tree scenario that also sets
`cluster.fat_tree_k`, which the scenario loader refuses.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ghpsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
COMMAND = re.compile(r"ghpsim simulate [^`\n]*")


def comment_commands() -> list[tuple[str, str]]:
    """(scenario file relative to the root, command) for every `ghpsim simulate ...` in a comment."""
    found = []
    for path in sorted({*SCENARIOS.glob("*.yaml"), *SCENARIOS.glob("**/*.yaml")}):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "#" not in line:
                continue
            comment = line.split("#", 1)[1]
            for match in COMMAND.finditer(comment):
                command = match.group(0).strip().rstrip(".,;:)")
                found.append((str(path.relative_to(ROOT)), command))
    return found


COMMANDS = comment_commands()


def test_the_fat_tree_comment_is_among_the_commands():
    commands = [command for _, command in COMMANDS]
    assert len(commands) >= 3
    fat_tree = [command for command in commands if "fat_tree_resnet50_dp.yaml" in command]
    assert fat_tree and all("cluster.topology=two_tier" in command for command in fat_tree)


@pytest.mark.parametrize("source, command", COMMANDS, ids=[f"{source}: {command}" for source, command in COMMANDS])
def test_quoted_simulate_command_exits_0(source, command, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    assert argv[0] == "simulate" and Path(argv[1]).is_file(), f"{source}: {command}"
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, f"{source}: `{command}` exited {code}: {captured.err.strip()}"
    assert "step" in captured.out.lower() and "Traceback" not in captured.err
