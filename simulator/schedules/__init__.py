"""Pipeline schedules: the IR (`ir`), one builder per kind (`build`), the checker (`check`),
per-stage properties (`analysis`) and the grid printer (`grid`). `steady_state` is analysis of a
simulated plan (it imports the engine) and is not imported here."""

from simulator.schedules.build import SCHEDULES, build_schedule
from simulator.schedules.check import ScheduleError, Timeline, check_schedule, unit_time_run
from simulator.schedules.ir import Op, Schedule

__all__ = ["SCHEDULES", "build_schedule", "ScheduleError", "Timeline", "check_schedule", "unit_time_run",
           "Op", "Schedule"]
