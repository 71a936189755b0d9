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

_PROGRAMS: dict[int, tuple[Schedule, list[tuple]]] = {}
"""id(schedule) -> (the schedule, kept so that its id is not reused; its compiled program): at most
`PROGRAMS_KEPT`, as many as `schedules.checked_schedule` keeps."""
PROGRAMS_KEPT = 64


def _program(schedule: Schedule) -> list[tuple]:
    """(rank, phase, chunk, slot, wait slot or -1, waits for a message, sends a message) per op, in
    an order where every op comes after the ops it waits for."""
    found = _PROGRAMS.get(id(schedule))
    if found is not None:
        return found[1]
    timed = [(start, rank, position, op) for rank, row in enumerate(unit_time_run(schedule).rows)
             for position, (op, start, _end) in enumerate(row)]
    timed.sort(key=lambda entry: entry[:3])  # a pass starts after what it waits for ends: a topological order
    slots = {op: slot for slot, (*_, op) in enumerate(timed) if op.phase in PASSES}
    last_chunk, program = schedule.num_chunks - 1, []
    for slot, (_start, rank, _position, op) in enumerate(timed):
        needs = schedule.dependencies(op)
        wait = slots[needs[0]] if needs else -1
        message = bool(needs) and needs[0].chunk != op.chunk
        sends = op.phase == FORWARD and op.chunk < last_chunk or op.phase == BACKWARD and op.chunk > 0
        program.append((rank, op.phase, op.chunk, slot, wait, message, sends))
    if len(_PROGRAMS) >= PROGRAMS_KEPT:
        _PROGRAMS.clear()
    _PROGRAMS[id(schedule)] = (schedule, program)
    return program


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
    program = _program(schedule)
    passes = {FORWARD: forward_s, BACKWARD: backward_s}
    sends = {FORWARD: send_forward_s, BACKWARD: send_backward_s}
    finish, arrival = [0.0] * len(program), [0.0] * len(program)
    free, out_free, in_free = ([0.0] * schedule.num_stages for _ in range(3))  # a rank's pass, link out, link in
    chunk_ends = [0.0] * schedule.num_chunks
    for rank, phase, chunk, slot, wait, message, sending in program:
        if phase not in passes:
            continue
        start = free[rank] + early_backward_s[chunk] if early_backward_s and phase == BACKWARD else free[rank]
        if wait >= 0:
            start = max(start, arrival[wait] if message else finish[wait])
        end = free[rank] = finish[slot] = start + passes[phase][chunk]
        if phase == BACKWARD:
            chunk_ends[chunk] = end
        if sending:
            to = (chunk + (1 if phase == FORWARD else -1)) % schedule.num_stages
            out_free[rank] = in_free[to] = arrival[slot] = max(end, out_free[rank], in_free[to]) + sends[phase][chunk]
    return free, chunk_ends
