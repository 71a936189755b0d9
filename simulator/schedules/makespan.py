"""The step of a flushed pipeline's schedule with given chunk costs, as its dataflow plays it.

Each rank runs its order (`schedules.build`); a chunk's forward and backward take its seconds, the
activation (gradient) it sends reaches the next (previous) chunk its transfer seconds after the pass
ends, and each rank closes the step with its update (the exposed allreduce and the optimizer step)
after its last pass. A rank sends one message at a time and receives one at a time (its link out
and its link in are shared; no other contention), in the order the play reaches them. The step is when the last rank is done: the critical
path of the schedule's graph, which the engine also plays where links are not shared.
`partition.flushed_partition` ranks its candidate splits by it, as its closed form (TeraPipe's
eq. 2) cannot see where a heavy chunk delays the fill or the drain.

The ops are played in one order that respects every dependency (the unit-time run's start times,
`check.unit_time_run`), compiled once per schedule to integer lists: about 1 us an op.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.schedules.check import unit_time_run
from simulator.schedules.ir import BACKWARD, FORWARD, PASSES, Schedule

_PROGRAMS: dict[int, tuple[Schedule, tuple[int, list[tuple]]]] = {}
"""id(schedule) -> (the schedule, kept so that its id is not reused; its compiled program): at most
`PROGRAMS_KEPT`, as many as `schedules.checked_schedule` keeps."""
PROGRAMS_KEPT = 64


def _program(schedule: Schedule) -> tuple[int, list[tuple]]:
    """(slots, per pass: (rank, is a backward, chunk, slot, wait slot or -1, waits for a message,
    the rank it sends a message to or -1)), the passes in an order where every one comes after the
    ops it waits for."""
    found = _PROGRAMS.get(id(schedule))
    if found is not None:
        return found[1]
    timed = [(start, rank, position, op) for rank, row in enumerate(unit_time_run(schedule).rows)
             for position, (op, start, _end) in enumerate(row)]
    timed.sort(key=lambda entry: entry[:3])  # a pass starts after what it waits for ends: a topological order
    slots = {op: slot for slot, (*_, op) in enumerate(timed) if op.phase in PASSES}
    last_chunk, passes = schedule.num_chunks - 1, []
    for slot, (_start, rank, _position, op) in enumerate(timed):
        if op.phase not in PASSES:
            continue
        needs = schedule.dependencies(op)
        wait = slots[needs[0]] if needs else -1
        message = bool(needs) and needs[0].chunk != op.chunk
        sends = op.phase == FORWARD and op.chunk < last_chunk or op.phase == BACKWARD and op.chunk > 0
        to = (op.chunk + (1 if op.phase == FORWARD else -1)) % schedule.num_stages if sends else -1
        passes.append((rank, op.phase == BACKWARD, op.chunk, slot, wait, message, to))
    if len(_PROGRAMS) >= PROGRAMS_KEPT:
        _PROGRAMS.clear()
    _PROGRAMS[id(schedule)] = (schedule, (len(timed), passes))
    return len(timed), passes


def schedule_step_s(schedule: Schedule, forward_s: Sequence[float], backward_s: Sequence[float],
                    send_forward_s: Sequence[float], send_backward_s: Sequence[float],
                    closing_s: Sequence[float]) -> float:
    """Seconds from the first forward to the last update. Per chunk c (0 .. v p - 1, on rank
    c mod p): forward_s[c], backward_s[c] a micro-batch, send_forward_s[c] for its output to reach
    chunk c + 1, send_backward_s[c] for its input gradient to reach chunk c - 1; closing_s[r] after
    rank r's last pass."""
    ends, _ = pass_ends_s(schedule, forward_s, backward_s, send_forward_s, send_backward_s)
    return max(end + closing for end, closing in zip(ends, closing_s))


def pass_ends_s(schedule: Schedule, forward_s: Sequence[float], backward_s: Sequence[float],
                send_forward_s: Sequence[float], send_backward_s: Sequence[float],
                early_backward_s: Sequence[float] | None = None) -> tuple[list[float], list[float]]:
    """(per rank, when its last pass ends: its update, which waits for nothing else, starts there;
    per chunk, when its last backward ends: its gradients are whole), arguments as `schedule_step_s`;
    `early_backward_s[c]`: work chunk c's rank runs before each of its backwards that waits for no
    gradient (a recompute, `ghp.apply_training_options`), from when the rank is free."""
    num_slots, program = _program(schedule)
    durations, transfers = (forward_s, backward_s), (send_forward_s, send_backward_s)  # indexed by is a backward
    finish, arrival = [0.0] * num_slots, [0.0] * num_slots
    free, out_free, in_free = ([0.0] * schedule.num_stages for _ in range(3))  # a rank's pass, link out, link in
    chunk_ends = [0.0] * schedule.num_chunks
    for rank, backward, chunk, slot, wait, message, to in program:
        start = free[rank]
        if backward and early_backward_s:
            start += early_backward_s[chunk]
        if wait >= 0:
            ready = arrival[wait] if message else finish[wait]
            if ready > start:
                start = ready
        end = free[rank] = finish[slot] = start + durations[backward][chunk]
        if backward:
            chunk_ends[chunk] = end
        if to >= 0:
            sent = max(end, out_free[rank], in_free[to]) + transfers[backward][chunk]
            out_free[rank] = in_free[to] = arrival[slot] = sent
    return free, chunk_ends
