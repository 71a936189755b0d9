"""Progress bars are drawn only on a terminal: off one (pytest's capture, a pipe, CI) they are
disabled, so a user's error stays the only line on stderr."""

import rich.console

from simulator.progress import stderr_progress


def test_bar_is_disabled_off_a_terminal(capsys):
    progress = stderr_progress(enabled=True)
    assert progress.disable
    with progress:
        task = progress.add_task("work", total=3)
        for _ in range(3):
            progress.advance(task)
    assert capsys.readouterr().err == ""


def test_bar_is_drawn_on_a_terminal_unless_asked_not_to(monkeypatch):
    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda self: True))
    assert not stderr_progress(enabled=True).disable
    assert stderr_progress(enabled=False).disable
