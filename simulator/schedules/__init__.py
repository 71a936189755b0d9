"""Pipeline schedules: the IR (`ir`), one builder per kind (`build`), the checker (`check`),
per-stage properties (`analysis`) and the grid printer (`grid`). `steady_state` is analysis of a
simulated plan (it imports the engine) and is not imported here."""

from functools import lru_cache

from simulator.schedules.build import SCHEDULES, build_schedule
from simulator.schedules.check import ScheduleError, Timeline, check_schedule, unit_time_run
from simulator.schedules.ir import Op, Schedule

__all__ = ["SCHEDULES", "build_schedule", "checked_schedule", "default_microbatch_counts", "ScheduleError", "Timeline", "check_schedule",
           "unit_time_run", "Op", "Schedule"]


@lru_cache(maxsize=64)
def checked_schedule(kind: str, num_stages: int, num_microbatches: int, num_virtual_stages: int = 1,
                     staggered_prediction: bool = True) -> Schedule:
    """`build_schedule`, once `check_schedule` has passed it; built and checked once per process for
    each setting (a layout search compiles many plans of few schedules). Schedules are frozen."""
    schedule = build_schedule(kind, num_stages, num_microbatches, num_virtual_stages, staggered_prediction)
    check_schedule(schedule)
    return schedule


MICROBATCHES_PER_STAGE = 4
"""GPipe's point past which the bubble is negligible: m >= 4 x the stages (Huang et al., NeurIPS 2019, sec. 3)."""


def default_microbatch_counts(num_stages: int, group_batch: int, at_least: int = 8) -> tuple[int, ...]:
    """The micro-batch counts a search tries for a pipeline of `num_stages` on `group_batch` samples:
    powers of two m >= 2 up to max(`at_least`, MICROBATCHES_PER_STAGE x stages) that divide the batch."""
    counts, m = [], 2
    while m <= min(group_batch, max(at_least, MICROBATCHES_PER_STAGE * num_stages)):
        if group_batch % m == 0:
            counts.append(m)
        m *= 2
    return tuple(counts)
