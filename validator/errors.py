"""Validator errors that reach users (importable without torch)."""

from simulator.errors import OneLineError


class RankFailure(OneLineError, RuntimeError):
    """A rank crashed, hung past the deadline, or the run could not start. Names the rank. Its
    message is one terminal-safe line of at most 300 characters (`simulator.errors.one_line`)."""
