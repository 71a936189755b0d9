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


def short_path(path: object, limit: int = 80) -> str:
    """`path` as given when at most `limit` characters, else ".../" and its end: the file name and the
    folders just above it that fit (the name alone, cut at its front, when even it is longer), so that
    a message naming a deeply nested file keeps the rest of its text (`one_line` cuts the end)."""
    text = str(path)
    if len(text) <= limit:
        return text
    tail = text[len(text) - max(limit - 3, 1):]
    cuts = [at for at in (tail.find("/"), tail.find("\\")) if 0 <= at < len(tail) - 1]
    return "..." + (tail[min(cuts):] if cuts else tail)


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


def nearest_names(value: str, names, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Up to `n` of `names` closest to a mistyped `value` (case-insensitive), the closest first: names
    that start with it (H100 -> H100-SXM, H100-PCIe), then names it starts with (ib-hdrr -> ib-hdr),
    then names that contain it, then difflib's close matches (similarity at least `cutoff`); within
    each, the most similar first, ties in the order of `names`. [] when none is close."""
    import difflib
    wanted = value.strip().lower()
    if not wanted:
        return []
    lowered = {name: name.lower() for name in names}

    def similarity(name: str) -> float:
        return difflib.SequenceMatcher(None, wanted, lowered[name]).ratio()

    def rank(name: str) -> int:
        low = lowered[name]
        if low.startswith(wanted):
            return 0
        if wanted.startswith(low):
            return 1
        return 2 if wanted in low else 3

    candidates = [name for name in names if rank(name) < 3 or similarity(name) >= cutoff]
    return sorted(candidates, key=lambda name: (rank(name), -similarity(name)))[:n]
