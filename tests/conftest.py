"""Shared pytest options: `--regen-golden` rewrites golden files instead of comparing with them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.dont_write_bytecode = False
"""Bytecode caches even where PYTHONDONTWRITEBYTECODE is set (as on the CI host): otherwise each test
process re-rewrites the test modules' asserts and recompiles the project, and so does every rank and
CLI a test launches (they read the caches, git-ignored __pycache__ folders). Collection takes about
half as long from a warm cache."""

GOLDEN = Path(__file__).resolve().parent / "golden"


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current output (review the diff before committing)")


@pytest.fixture
def golden(request):
    """golden(relative_path, text): compare `text` with tests/golden/<relative_path>, or rewrite it
    under --regen-golden."""
    regenerate = request.config.getoption("--regen-golden")

    def check(relative_path: str, text: str) -> None:
        path = GOLDEN / relative_path
        if regenerate:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.is_file(), f"missing golden file {path}; run pytest --regen-golden and review it"
        assert text == path.read_text(), f"{path} differs; if intended, run pytest --regen-golden and review the diff"

    return check


@pytest.fixture
def fresh_stop_handlers():
    """SIGINT, SIGTERM and SIGHUP as a fresh `ghpsim` process has them (whatever an earlier test of
    this worker left) for a test that sends itself a stop, and the worker's own put back after it
    (`ghpsim.cli.first_interrupt_only` leaves later stops ignored once one came)."""
    import signal
    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {number: signal.getsignal(number) for number in numbers}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in numbers[1:]:
        signal.signal(number, signal.SIG_DFL)
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)
