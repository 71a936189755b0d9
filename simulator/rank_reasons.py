"""Why a ranked layout lost to #1 (`ghpsim rank`'s "lost to"), and the Pareto front of cluster sizes.

A layout's step splits into its step-time bound's parts (`simulator.step_bound.StepBound`: compute,
bubble, host (the host's kernel issue pacing the GPU), communication) and what its simulation adds above the bound (contention, stalls of the
schedule the bound does not see). A layout lost to the part by which it exceeds #1 the most, read
only from figures the table shows: communication is named only where the layout's comm % (as
printed, whole per cent) is above #1's, and a loss that lies above the bound is "above bound"
(the step (ms) and bound (ms) columns show it), not communication.
"""

from __future__ import annotations

PARTS = ("compute", "bubble", "host", "communication", "above_bound")
"""The keys of `time_parts`; a reason is one of them with "_" as " "."""


def time_parts(bound, step_s: float | None = None) -> dict[str, float]:
    """A layout's time split for explaining a loss: its bound's compute, bubble, host pacing and
    communication, and the simulated step above the bound (0 for a layout not simulated)."""
    above = 0.0 if step_s is None else max(step_s - bound.step_s, 0.0)
    return {"compute": bound.work_s, "bubble": bound.bubble_s, "host": bound.host_s, "communication": bound.comm_s,
            "above_bound": above}


def shown_comm_pct(row: dict) -> int:
    """A simulated row's comm % as the rank table prints it."""
    return round(100 * row["comm_share"])


def lost_to(parts: dict[str, float], best: dict[str, float] | None, more_comm_shown: bool = True) -> str | None:
    """The part by which a layout exceeds the best the most (None without a best); communication
    only where `more_comm_shown` (its comm % as printed is above the best's), else the next part
    with an excess. A layout whose only excess is communication that the printed comm % does not
    show (less than half a per cent of the step) is named by it all the same."""
    if best is None:
        return None
    excess = {key: parts[key] - best[key] for key in PARTS}
    ranked = sorted(PARTS, key=lambda key: -excess[key])
    allowed = [key for key in ranked if excess[key] > 0 and (key != "communication" or more_comm_shown)]
    return (allowed or ranked)[0].replace("_", " ")


def explain(rows: list[dict], bound_of) -> dict[str, float] | None:
    """Rank the sorted simulated `rows` in place: `rank`, their time parts (`bound_compute_s`,
    `bound_bubble_s`, `bound_host_s`, `bound_communication_s`, `above_bound_s`) and `lost_to`
    (memory, tie, asynchronous (a steady-state step with no bound to split it) or `lost_to`'s
    part); `bound_of` maps a row to its `StepBound`. Returns the best fitting row's parts (None if
    none fits)."""
    best = next((row for row in rows if row["fits_in_memory"]), None)
    best_parts = time_parts(bound_of(best), best["step_time_s"]) if best else None
    for position, row in enumerate(rows, start=1):
        parts = time_parts(bound_of(row), row["step_time_s"])
        if not row["fits_in_memory"]:
            reason = "memory"
        elif row is best:
            reason = None
        elif row["step_time_s"] <= best["step_time_s"] * (1 + 1e-12):
            reason = "tie"
        elif bound_of(row).step_s <= 0:  # an asynchronous pipeline: a steady-state step, no bound to split it
            reason = "asynchronous"
        else:
            reason = lost_to(parts, best_parts, shown_comm_pct(row) > shown_comm_pct(best))
        row.update({"rank": position, **{_part_key(key): value for key, value in parts.items()}, "lost_to": reason})
    return best_parts


TWIN_PLACEMENT = " tp-dp-pp"
"""The label suffix of a megatron layout placed tp fastest, then dp, then pp (`planner.Candidate.label`)."""


def shown_rows(rows: list[dict]) -> list[tuple[str, dict, str]]:
    """(the "#" cell, row, candidate cell) of each row the rank table prints. A layout placed
    tp-dp-pp that simulates to the same step and memory as the same layout in Megatron's order
    (sorted right above it: its label is the prefix) joins that row: "#" reads "3-4", so the top K
    do not spend rows on twins that a fabric treating both placements alike cannot tell apart."""
    shown: list[tuple[str, dict, str]] = []
    for row in rows:
        if shown and row["label"].endswith(TWIN_PLACEMENT):
            position, twin, label = shown[-1]
            if (twin["label"] == row["label"][:-len(TWIN_PLACEMENT)] and twin["fits_in_memory"] == row["fits_in_memory"]
                    and abs(row["step_time_s"] - twin["step_time_s"]) <= 1e-12 * twin["step_time_s"]
                    and row["peak_memory_bytes"] == twin["peak_memory_bytes"]):
                shown[-1] = (f"{position}-{row['rank']}", twin, f"{label} (or{TWIN_PLACEMENT}: the same)")
                continue
        shown.append((str(row["rank"]), row, row["label"]))
    return shown


def _part_key(part: str) -> str:
    """A row's key for a time part: the bound's (`bound_compute_s` ...; not the simulated per-device
    means `compute_s` / `comm_s` of simulate and compare), or `above_bound_s`."""
    return f"{part}_s" if part == "above_bound" else f"bound_{part}_s"


def row_cost(row: dict, ranking) -> float:
    """A row's cost for the Pareto front: its price, else GPU-hours (of the run, else of one step)."""
    if row.get("cost") is not None:
        return row["cost"]
    return row.get("gpu_hours", row["step_time_s"] * ranking.scenario.num_gpus / 3600)


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """Whether each (time, cost) point is on the Pareto front: no other point is at least as good
    in both and better in one."""
    return [not any(t2 <= t and c2 <= c and (t2 < t or c2 < c) for t2, c2 in points) for t, c in points]
