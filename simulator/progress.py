"""Progress bars for long work: rich bars on stderr, drawn only when stderr is a terminal.

Off a terminal (a pipe, a log file, CI) a rich bar would leave its last frame or a blank line on
stderr, where a user's error must be the only line; so there the bar is disabled.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, ProgressColumn


def stderr_progress(*columns: str | ProgressColumn, enabled: bool = True, transient: bool = True) -> Progress:
    """A `rich.progress.Progress` on stderr (rich's default columns when none are given), disabled
    unless `enabled` and stderr is a terminal."""
    console = Console(stderr=True)
    return Progress(*columns, console=console, transient=transient,
                    disable=not enabled or not console.is_terminal)
