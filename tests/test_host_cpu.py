"""benchmarks/host_cpu.py: cores used per thread name of a command's process tree."""

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_cpu  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads /proc (Linux)")

SPIN = "import time\nstart = time.time()\nwhile time.time() - start < {seconds}: pass\n"


def test_a_spinning_child_is_found_and_charged_about_one_core(capsys):
    # the spinning process is a grandchild (a shell in between): the tree is followed
    command = ["sh", "-c", f"{sys.executable} -c '{SPIN.format(seconds=60)}'"]
    started = time.monotonic()
    assert host_cpu.main(["--skip", "0.3", "--seconds", "1.5", "--", *command]) == 0
    assert time.monotonic() - started < 30  # stopped after the window, not left to spin for a minute
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("window ") and f"on {os.cpu_count()} cores" in lines[0]
    python = next(line for line in lines[1:] if line.split()[0].startswith("python"))
    cores = float(python.split()[1])
    assert 0.5 < cores <= 1.1  # one thread spinning: about one core, never much more


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert host_cpu.main([]) == 2
    assert "command: none given" in capsys.readouterr().err
    assert host_cpu.main(["--", "no-such-command-here"]) == 2
    assert "'no-such-command-here' cannot start" in capsys.readouterr().err
    assert host_cpu.main(["--skip", "5", "--", sys.executable, "-c", "pass"]) == 2
    assert "ended before the window" in capsys.readouterr().err
