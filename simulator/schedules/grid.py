"""The schedule as a grid: rows = ranks, columns = unit time slots (F and B take one slot each,
predictions and updates none); a cell is `F3` / `B3` (micro-batch 3), `F3.1` with v > 1 (local
chunk 1 of the rank), `.` when the rank idles."""

from __future__ import annotations

from simulator.schedules.check import Timeline, check_schedule
from simulator.schedules.ir import PASSES, Schedule


def grid_cells(schedule: Schedule, timeline: Timeline) -> list[list[str]]:
    """cells[rank][slot] ("" when idle)."""
    slots = int(round(timeline.makespan))
    cells = [["" for _ in range(slots)] for _ in range(schedule.num_stages)]
    for rank, row in enumerate(timeline.rows):
        for op, start, _end in row:
            if op.phase in PASSES:
                label = f"{op.phase}{op.microbatch}"
                if schedule.num_virtual_stages > 1:
                    label += f".{schedule.local_chunk(op.chunk)}"
                cells[rank][int(round(start))] = label
    return cells


def render_grid(schedule: Schedule) -> str:
    """The checked schedule's grid as text, with a one-line header."""
    timeline = check_schedule(schedule)
    cells = grid_cells(schedule, timeline)
    width = max((len(cell) for row in cells for cell in row), default=1)
    chunks = f", v={schedule.num_virtual_stages} chunks per rank" if schedule.num_virtual_stages > 1 else ""
    lines = [f"{schedule.kind}: p={schedule.num_stages} stages, m={schedule.num_microbatches} "
             f"micro-batches{chunks}; one slot per F or B; {len(cells[0])} slots"]
    for rank, row in enumerate(cells):
        text = " ".join((cell or ".").ljust(width) for cell in row).rstrip()
        lines.append(f"rank {rank} | {text}")
    return "\n".join(lines) + "\n"


def schedule_document(schedule: Schedule, weight_stashing: bool = True) -> dict:
    """JSON form: the ops with their unit-time slots, the grid and the per-stage metrics."""
    from simulator.schedules.analysis import in_flight_counts, stage_metrics

    timeline = check_schedule(schedule)
    return {
        "kind": schedule.kind,
        "num_stages": schedule.num_stages,
        "num_microbatches": schedule.num_microbatches,
        "num_virtual_stages": schedule.num_virtual_stages,
        "asynchronous": schedule.asynchronous,
        "num_slots": int(round(timeline.makespan)),
        "ranks": [[{"phase": op.phase, "chunk": op.chunk, "microbatch": op.microbatch, "start": start, "end": end}
                   for op, start, end in row] for row in timeline.rows],
        "grid": grid_cells(schedule, timeline),
        # micro-batches and chunk passes in flight counted apart, as the simulation's summary counts them
        "stages": {**stage_metrics(schedule, weight_stashing and schedule.kind == "pipedream"),
                   **in_flight_counts(schedule)},
    }
