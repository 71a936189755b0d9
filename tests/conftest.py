"""Shared pytest options: `--regen-golden` rewrites golden files instead of comparing with them."""

from __future__ import annotations

from pathlib import Path

import pytest

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
