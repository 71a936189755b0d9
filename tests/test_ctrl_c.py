"""Ctrl-C during a command: the launcher holds it while ranks start (they and the forkserver
inherit SIGINT blocked, so none prints a traceback), and the CLI ignores every Ctrl-C after the first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ghpsim.cli import first_interrupt_only

SIGNAL_MASK = "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"


@pytest.fixture(autouse=True)
def _default_sigint():
    """SIGINT as a fresh process has it, before and after; and the stop signals that an interrupted
    `first_interrupt_only` leaves ignored put back, so no later test of this worker inherits them."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number, handler in saved.items():
        signal.signal(number, handler)


def test_a_ctrl_c_while_ranks_start_is_raised_after_and_the_processes_started_inherit_it_blocked():
    pytest.importorskip("torch")
    from validator.launch import sigint_held

    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            child = subprocess.run([sys.executable, "-c", SIGNAL_MASK], capture_output=True, text=True, check=True)
            reached_the_end = True
    assert reached_the_end and child.stdout.strip() == "True"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # unblocked here
    after = subprocess.run([sys.executable, "-c", SIGNAL_MASK], capture_output=True, text=True, check=True)
    assert after.stdout.strip() == "False"


def test_the_cli_raises_the_first_ctrl_c_and_ignores_the_later_ones():
    with pytest.raises(KeyboardInterrupt):
        with first_interrupt_only():
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGINT)  # ignored: no KeyboardInterrupt


def test_without_a_ctrl_c_the_cli_leaves_the_default_handler():
    with first_interrupt_only():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
