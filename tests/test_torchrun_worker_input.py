"""`python -m validator.torchrun_worker`: bad input and failed runs end a worker with one line on
stderr (prefixed `ghpsim worker [rank R]:`), exit 2, no traceback and no output file; input is
checked before any real work; a watchdog ends a worker still running --timeout s after its run started.

Real runs here are one process (WORLD_SIZE=1, gloo); torchrun itself is not launched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest

from tests.test_bad_input import ROOT, assert_one_line_error
from validator import torchrun_worker
from validator.torchrun_worker import TORCHRUN_VARIABLES, main

SCENARIO = str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml")
TWO_RANKS = ("--set", "cluster.gpus_per_node=2")
ONE_RANK = ("--set", "cluster.gpus_per_node=1", "--set", "strategy.num_groups=1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_env(**variables) -> dict:
    """This process's environment without torchrun's variables, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k not in (*TORCHRUN_VARIABLES, "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in variables.items()})
    return env


def single_rank(**extra) -> dict:
    return worker_env(RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), **extra)


def run_python(args, env, cwd, timeout=60):
    started = time.monotonic()
    done = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def run_main(capsys, *argv):
    """main(argv) in-process -> (exit code, stdout, stderr)."""
    try:
        code = main([str(arg) for arg in argv])
    except SystemExit as error:
        code = error.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def no_real_run(monkeypatch):
    """Fail the test if the real run (process group, collectives) is reached."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the real run started before the input was refused")
    monkeypatch.setattr(torchrun_worker, "run", forbidden)


@pytest.fixture
def torchrun_vars(monkeypatch):
    def set_vars(rank=0, world_size=2):
        for name, value in {"RANK": rank, "WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": free_port()}.items():
            monkeypatch.setenv(name, str(value))
    return set_vars


# defect 1: outside torchrun


def test_outside_torchrun_is_one_line_exit_2(tmp_path):
    code, _out, err, _ = run_python(["-m", "validator.torchrun_worker", SCENARIO, "--steps", "1",
                                     "--out", "x.json"], worker_env(), tmp_path)
    assert_one_line_error((code, _out, err), "ghpsim worker: error:", "not under torchrun", "RANK", "torchrun")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("variables, needles", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, ("RANK='x'", "whole number")),
    ({"RANK": "2", "WORLD_SIZE": "2"}, ("RANK=2", "WORLD_SIZE=2")),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": ""}, ("MASTER_PORT", "not set")),
])
def test_bad_torchrun_environment(capsys, monkeypatch, torchrun_vars, no_real_run, variables, needles):
    torchrun_vars()
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert_one_line_error(run_main(capsys, SCENARIO, *TWO_RANKS, "--steps", "1"), "error:", *needles)


# argparse errors on one line, naming only the bad option


@pytest.mark.parametrize("flag, value, needle", [
    ("--steps", "0", "0 is out of range (1 to 10,000)"),
    ("--steps", "10001", "10001 is out of range (1 to 10,000)"),
    ("--steps", "two", "'two' is not a whole number"),
    ("--warmup", "-1", "-1 is out of range (0 to 10,000)"),
    ("--timeout", "abc", "'abc' is not a number of seconds"),
    ("--timeout", "0", "0 is out of range"),
    ("--timeout", "inf", "inf is out of range"),
    ("--timeout", "nan", "nan is out of range"),
])
def test_bad_flag_is_one_line_naming_it(capsys, monkeypatch, flag, value, needle):
    monkeypatch.setenv("RANK", "1")
    line = assert_one_line_error(run_main(capsys, SCENARIO, flag, value),
                                 "ghpsim worker rank 1: error:", f"argument {flag}: {needle}")
    assert "usage:" not in line
    for other in {"--steps", "--warmup", "--timeout"} - {flag}:
        assert other not in line, line


def test_bad_flag_in_a_subprocess_has_no_usage(tmp_path):
    code, out, err, _ = run_python(["-m", "validator.torchrun_worker", SCENARIO, "--steps", "0"],
                                   worker_env(), tmp_path)
    assert_one_line_error((code, out, err), "argument --steps: 0 is out of range")


# defect 2: --out, scenario and world size checked before the real run


def test_out_is_a_directory_refused_up_front(capsys, tmp_path, torchrun_vars, no_real_run):
    torchrun_vars(rank=1)
    assert_one_line_error(run_main(capsys, SCENARIO, *TWO_RANKS, "--out", tmp_path),
                          "ghpsim worker rank 1: error:", "--out", "is a directory")


def test_out_under_a_file_refused_up_front(capsys, tmp_path, torchrun_vars, no_real_run):
    torchrun_vars()
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "x.json"
    assert_one_line_error(run_main(capsys, SCENARIO, *TWO_RANKS, "--out", out),
                          "ghpsim worker rank 0: error:", f"--out {out}", "is not a directory")


@pytest.mark.parametrize("argv, needles", [
    (("nosuch.yaml",), ("nosuch.yaml", "not found")),
    ((SCENARIO, "--set", "cluster.nosuch=2"), ("cluster.nosuch", "unknown key")),
])
def test_bad_scenario_refused_up_front(capsys, torchrun_vars, no_real_run, argv, needles):
    torchrun_vars()
    assert_one_line_error(run_main(capsys, *argv), "ghpsim worker rank 0: error:", *needles)


def test_world_size_mismatch_refused_up_front(capsys, torchrun_vars, no_real_run):
    torchrun_vars(world_size=1)
    assert_one_line_error(run_main(capsys, SCENARIO, *TWO_RANKS, "--steps", "1"),
                          "ghpsim worker rank 0: error:", "the plan has 2 ranks", "WORLD_SIZE is 1")


def test_world_size_mismatch_in_a_subprocess(tmp_path):
    code, out, err, _ = run_python(["-m", "validator.torchrun_worker", SCENARIO, *TWO_RANKS, "--steps", "1",
                                    "--out", "x.json"], single_rank(), tmp_path)
    assert_one_line_error((code, out, err), "ghpsim worker rank 0: error:", "WORLD_SIZE is 1")
    assert not (tmp_path / "x.json").exists()


# defect 4: the watchdog


WATCHDOG_SCRIPT = """
import sys, time
from validator.worker_watchdog import Watchdog
watchdog = Watchdog({timeout}, "ghpsim worker rank 1: error: --timeout {timeout} s passed").start()
{between}
time.sleep({sleep})
print("still running")
"""


def run_watchdog(tmp_path, timeout, sleep, between=""):
    script = WATCHDOG_SCRIPT.format(timeout=timeout, sleep=sleep, between=between)
    return run_python(["-c", script], worker_env(), tmp_path, timeout=20)


def test_watchdog_ends_a_blocked_process_with_one_line(tmp_path):
    # blocked for 30 s: only the watchdog ends it before run_python's 20 s limit (TimeoutExpired otherwise)
    code, out, err, elapsed = run_watchdog(tmp_path, 0.3, 30)
    assert_one_line_error((code, out, err), "ghpsim worker rank 1: error: --timeout 0.3 s passed")
    assert out == "" and elapsed >= 0.3  # not before its timeout


def test_disarmed_watchdog_never_fires(tmp_path):
    code, out, err, _ = run_watchdog(tmp_path, 0.3, 1.0, between="watchdog.disarm()")
    assert (code, out, err) == (0, "still running\n", "")


def watch_in_fake_time(monkeypatch, timeout_s: float, script: list[tuple[float, str]]):
    """Run a Watchdog's watch loop on a fake clock: each wait lets its time pass at once, running the
    scripted (time, "kick" | "disarm") calls that fall in it. -> (fired: [(time, stderr bytes, exit
    code)], the clock at the end). Deterministic: no sleep, whatever the machine's load."""
    import validator.worker_watchdog as worker_watchdog

    now, fired, pending = [0.0], [], sorted(script)

    class FakeEvent:
        def __init__(self):
            self.flag = False

        def set(self):
            self.flag = True

        def is_set(self):
            return self.flag

        def wait(self, timeout):
            end = now[0] + timeout
            while pending and pending[0][0] <= end and not self.flag:
                now[0], action = pending.pop(0)
                getattr(watchdog, action)()
            if not self.flag:
                now[0] = end
            return self.flag

    written = []
    monkeypatch.setattr(worker_watchdog, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(worker_watchdog, "threading", types.SimpleNamespace(
        Event=FakeEvent, Lock=threading.Lock, Thread=threading.Thread))
    monkeypatch.setattr(worker_watchdog, "os", types.SimpleNamespace(
        write=lambda fd, data: written.append(data),
        _exit=lambda code: fired.append((now[0], b"".join(written), code))))
    watchdog = worker_watchdog.Watchdog(timeout_s, "ghpsim worker rank 1: error: --timeout passed")
    watchdog._watch()  # the watch thread's loop, run here
    return fired, now[0]


def test_progress_keeps_a_long_run_alive(monkeypatch):
    """--timeout bounds a wait, not the run: kicked every 0.2 s, a 0.5 s watchdog lets 1.2 s pass."""
    fired, end = watch_in_fake_time(monkeypatch, 0.5, [(0.2 * i, "kick") for i in range(1, 7)] + [(1.2, "disarm")])
    assert fired == [] and end == pytest.approx(1.2)
    # without the kicks it fires at its timeout; once they stop, one timeout after the last
    message = b"ghpsim worker rank 1: error: --timeout passed\n"
    assert watch_in_fake_time(monkeypatch, 0.5, [])[0] == [(pytest.approx(0.5), message, 2)]
    fired, _ = watch_in_fake_time(monkeypatch, 0.5, [(0.2 * i, "kick") for i in range(1, 4)])
    assert fired == [(pytest.approx(0.6 + 0.5), message, 2)]


FROZEN_RUN_SCRIPT = """
import sys, time
import validator.measure
validator.measure.run_rank = lambda *args, **kwargs: time.sleep(60)  # a collective whose peer stopped
from validator.torchrun_worker import main
sys.exit(main({argv!r}))
"""


def test_worker_watchdog_ends_a_frozen_run(tmp_path):
    argv = [SCENARIO, *ONE_RANK, "--steps", "1", "--warmup", "0", "--timeout", "3", "--out", "x.json"]
    code, out, err, elapsed = run_python(["-c", FROZEN_RUN_SCRIPT.format(argv=argv)], single_rank(), tmp_path,
                                         timeout=20)
    assert_one_line_error((code, out, err), "ghpsim worker rank 0: error: --timeout 3 s passed without a "
                                            "finished step (a peer may have stopped)")
    assert elapsed >= 3  # the 60 s freeze ended by the watchdog (else run_python's 20 s limit), not before --timeout
    assert list(tmp_path.iterdir()) == []  # no output file, not even a temporary one


FINISHED_RUN_SCRIPT = """
import sys, time
from validator.torchrun_worker import main
code = main({argv!r})
time.sleep(10.5)  # past --timeout: the watchdog must stay quiet after a finished run
print("exit", code)
"""


def test_run_that_finishes_in_time_is_unaffected(tmp_path):
    # --timeout 10: a loaded host may take a few seconds to import torch and run the step
    argv = [SCENARIO, *ONE_RANK, "--steps", "1", "--warmup", "0", "--timeout", "10", "--out", "x.json"]
    code, out, err, _ = run_python(["-c", textwrap.dedent(FINISHED_RUN_SCRIPT.format(argv=argv))],
                                   single_rank(), tmp_path)
    assert (code, out) == (0, "exit 0\n"), err
    assert "error" not in err and "Traceback" not in err, err
    assert (tmp_path / "x.json").read_text().startswith("{")
