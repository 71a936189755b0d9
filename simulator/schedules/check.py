"""Checking a schedule: completeness, forward before backward, and no deadlock (unit-time run).

`unit_time_run` plays the per-rank orders as a dataflow: an op starts when the previous op of its
rank and the ops it depends on (`Schedule.dependencies`) are finished, with fixed durations and
free communication. If some rank can no longer start its next op, the schedule deadlocks and
`ScheduleError` names the stuck ranks and what each waits for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simulator.errors import SimulationError
from simulator.schedules.ir import BACKWARD, FORWARD, PASSES, Op, Schedule


class ScheduleError(SimulationError):
    """A schedule that is incomplete, runs a backward before its forward, or deadlocks."""

    def __init__(self, message: str, stuck_ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.stuck_ranks = stuck_ranks


@dataclass(frozen=True)
class Timeline:
    """Start and end of every op, per rank in program order: rows[rank] = ((op, start, end), ...)."""

    rows: tuple[tuple[tuple[Op, float, float], ...], ...]

    @property
    def makespan(self) -> float:
        return max((end for row in self.rows for _op, _start, end in row), default=0.0)


def check_schedule(schedule: Schedule) -> Timeline:
    """Raise ScheduleError unless every F/B op is present once, on its rank, F before B, and the
    schedule runs to the end; returns the unit-time timeline."""
    p, m = schedule.num_stages, schedule.num_microbatches
    for rank, ops in enumerate(schedule.ranks):
        wrong = [op for op in ops if schedule.rank_of_chunk(op.chunk) != rank]
        if wrong:
            raise ScheduleError(f"rank {rank}: {wrong[0]} of chunk {wrong[0].chunk} belongs to rank "
                                f"{schedule.rank_of_chunk(wrong[0].chunk)}", (rank,))
        counts = Counter(op for op in ops if op.phase in PASSES)
        expected = {Op(phase, chunk, i) for phase in PASSES for chunk in range(rank, p * schedule.num_virtual_stages, p)
                    for i in range(m)}
        missing = sorted(expected - set(counts), key=_order_key)
        extra = sorted((op for op, n in counts.items() if n > 1 or op not in expected), key=_order_key)
        if missing or extra:
            problem = f"missing {_name(missing[0])}" if missing else f"repeats or adds {_name(extra[0])}"
            raise ScheduleError(f"rank {rank}: {problem}", (rank,))
        seen = set()
        for op in ops:
            if op.phase == BACKWARD and Op(FORWARD, op.chunk, op.microbatch) not in seen:
                raise ScheduleError(f"rank {rank}: {_name(op)} comes before its forward", (rank,))
            seen.add(op)
    return unit_time_run(schedule)


def unit_time_run(schedule: Schedule, forward_s: float = 1.0, backward_s: float = 1.0,
                  other_s: float = 0.0) -> Timeline:
    """Dataflow run of the orders with F = forward_s, B = backward_s, P and U = other_s each."""
    durations = {FORWARD: forward_s, BACKWARD: backward_s}
    finish: dict[Op, float] = {}
    free = [0.0] * schedule.num_stages
    position = [0] * schedule.num_stages
    rows: list[list] = [[] for _ in range(schedule.num_stages)]
    progress = True
    while progress:
        progress = False
        for rank, ops in enumerate(schedule.ranks):
            while position[rank] < len(ops):
                op = ops[position[rank]]
                needs = schedule.dependencies(op)
                if any(need not in finish for need in needs):
                    break
                start = max([free[rank], *(finish[need] for need in needs)])
                end = start + durations.get(op.phase, other_s)
                if op.phase in PASSES:
                    finish[op] = end
                rows[rank].append((op, start, end))
                free[rank] = end
                position[rank] += 1
                progress = True
    stuck = tuple(rank for rank, ops in enumerate(schedule.ranks) if position[rank] < len(ops))
    if stuck:
        waits = []
        for rank in stuck:
            op = schedule.ranks[rank][position[rank]]
            needs = [need for need in schedule.dependencies(op) if need not in finish]
            waits.append(f"rank {rank} at {_name(op)} waits for {', '.join(map(_name, needs))}")
        raise ScheduleError(f"{schedule.kind} schedule deadlocks: {'; '.join(waits)}", stuck)
    return Timeline(tuple(tuple(row) for row in rows))


def _name(op: Op) -> str:
    return f"{op.phase}{op.microbatch} (chunk {op.chunk})"


def _order_key(op: Op):
    return (op.phase, op.chunk, op.microbatch)
