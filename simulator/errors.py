"""User-facing errors. The CLI prints their message on one line and exits with code 2."""


class ScenarioError(ValueError):
    """Bad input from a user: a malformed scenario, an impossible allocation, a missing file.

    The message names the file (or source), the field and the offending value.
    """


class SimulationError(RuntimeError):
    """The engine could not finish a plan (a deadlock or an unmatched send/receive)."""
