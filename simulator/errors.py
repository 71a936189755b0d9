"""User-facing errors. The CLI prints their message on one line and exits with code 2.

Every message is made safe for a terminal when the error is raised (`one_line`): control
characters (newlines included) are escaped and the text is cut to `MAX_MESSAGE_CHARS`.
"""

from __future__ import annotations

MAX_MESSAGE_CHARS = 300
"""Longest message a user error prints (a longer one ends in "...")."""


def one_line(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` as one terminal-safe line: control characters escaped, at most `limit` characters."""
    text = str(text)[: 4 * limit]  # bounds the work for a huge message
    safe = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return safe if len(safe) <= limit else safe[: limit - 3] + "..."


class OneLineError(Exception):
    """Base of the user errors: text arguments pass through `one_line`."""

    def __init__(self, *args):
        super().__init__(*(one_line(arg) if isinstance(arg, str) else arg for arg in args))


class ScenarioError(OneLineError, ValueError):
    """Bad input from a user: a malformed scenario, an impossible allocation, a missing file.

    The message names the file (or source), the field and the offending value.
    """


class SimulationError(OneLineError, RuntimeError):
    """The engine could not finish a plan (a deadlock or an unmatched send/receive)."""
