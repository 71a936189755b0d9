"""Validator errors that reach users (importable without torch)."""


class RankFailure(RuntimeError):
    """A rank crashed, hung past the deadline, or the run could not start. Names the rank."""
