"""Progress of a long simulation: an `Engine` that reports how many of its plan's actions are done.

`ghpsim simulate` on a large scenario can run for minutes; `reporting_progress(callback)` makes
every engine `simulate` starts in its block call callback(actions done, actions in the plan) every
`PROGRESS_EVERY` completed actions (a few times a second). Outside such a block the plain engine
runs, so a simulation pays nothing for it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from simulator.engine import Engine

PROGRESS_EVERY = 50_000
"""Actions completed between two calls (the engine completes some 100,000 to 300,000 a second)."""
_CALLBACK: ContextVar = ContextVar("engine_progress", default=None)


@contextmanager
def reporting_progress(callback):
    """Engines made by `engine` inside this block report to `callback(done, total)`."""
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def engine(plan, topology, costs, num_parameter_servers: int = 1) -> Engine:
    """An `Engine` for `plan`: one that reports its progress inside `reporting_progress`."""
    callback = _CALLBACK.get()
    if callback is None:
        return Engine(plan, topology, costs, num_parameter_servers)
    return _ReportingEngine(plan, topology, costs, num_parameter_servers, callback)


class _ReportingEngine(Engine):
    def __init__(self, plan, topology, costs, num_parameter_servers, callback):
        super().__init__(plan, topology, costs, num_parameter_servers)
        self._callback = callback
        self._num_actions = sum(map(len, plan.actions))

    def _complete(self, rank: int, action_id: int) -> None:
        super()._complete(rank, action_id)
        if not self._num_completions % PROGRESS_EVERY:
            self._callback(self._num_completions, self._num_actions)
