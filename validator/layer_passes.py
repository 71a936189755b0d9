"""Layer timings measured in several passes spread over a calibration, combined by a median.

Why: a shared VM goes through speed spells (measured on the project's 2-core machine: 1.1x and
1.4x a quiet-core matrix-product time, alternating every few seconds). One (layer, batch size)
measurement lasts ~0.1 s, so it samples one spell, and consecutive layers share it: a profile
timed in one sweep is a snapshot whose every prediction moves with the spell it caught (two
profiles of the same model minutes apart predicted the same plan 33 % apart). Timing every layer
in `passes` sweeps, run at evenly spaced points of the calibration (between its other phases), and
keeping per figure the median over passes makes one slow spell cost one pass, not the profile.
The spread of the passes' totals is recorded in the profile (`provenance.layer_passes`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

DEFAULT_LAYER_PASSES = 3


def pass_slots(passes: int, phases: int) -> list[int]:
    """Before which of `phases` later phases (0..phases; `phases` = after the last) each of
    `passes` layer sweeps runs: evenly spaced from the start to the end of the calibration."""
    if passes < 1:
        raise ValueError(f"layer passes must be >= 1, got {passes}")
    if passes == 1:
        return [0]
    return [round(i * phases / (passes - 1)) for i in range(passes)]


def _median_lists(lists: Sequence[Sequence[float]]) -> list[float]:
    return [float(statistics.median(column)) for column in zip(*lists)]


def median_over_passes(runs: Sequence[list[dict]]) -> list[dict]:
    """`time_layers` rows of several passes -> rows of the same shape whose every figure (per
    layer, round, phase and batch size) is the median over the passes."""
    if not runs:
        raise ValueError("need at least one pass")
    merged = []
    for entries in zip(*runs):
        first = entries[0]
        rounds = []
        for records in zip(*(entry["rounds"] for entry in entries)):
            rounds.append({key: _median_lists([record[key] for record in records])
                           for key in ("forward_s", "backward_s")})
        merged.append({**first, "rounds": rounds, "forward_s": rounds[0]["forward_s"],
                       "backward_s": rounds[0]["backward_s"]})
    return merged


def pass_totals_s(runs: Sequence[list[dict]]) -> list[float]:
    """Per pass: the sum of all its figures (layers, rounds, phases, batch sizes) in seconds."""
    return [sum(sum(record["forward_s"]) + sum(record["backward_s"])
                for entry in rows for record in entry["rounds"]) for rows in runs]


def pass_spread(totals_by_rank: Sequence[Sequence[float]]) -> dict:
    """The passes' totals summed over ranks, each relative to their median (1.0 = typical), and
    the spread (max - min) / min in percent; the profile's `provenance.layer_passes` entry."""
    totals = [sum(column) for column in zip(*totals_by_rank)]
    middle = statistics.median(totals)
    relative = [total / middle if middle > 0 else 1.0 for total in totals]
    spread = (max(totals) - min(totals)) / min(totals) * 100 if min(totals) > 0 else 0.0
    return {"passes": len(totals), "relative_totals": relative, "spread_pct": spread}


def median_comm_over_passes(runs: Sequence[dict]) -> dict:
    """Communication times of several passes spread over a calibration (each `{"p2p": [per size]
    or None, "allreduce": {g: {"times_s": [per size], ...}}, "allgather": {...}}`, as
    `validator.comm_bench` times them) -> one entry of the same shape whose every time (per kind,
    group size and message size) is the median over the passes. Why: the alpha-beta fits were the
    one figure of a profile still timed in a single burst, and on this project's 2-core VM one
    calibration's three sweeps disagreed by up to 77 % (sum of an allreduce's medians over the
    sizes; p2p up to 36 %)."""
    if not runs:
        raise ValueError("need at least one pass")
    first = runs[0]
    merged = {"p2p": _median_lists([run["p2p"] for run in runs]) if first["p2p"] is not None else None}
    for kind in ("allreduce", "allgather"):
        merged[kind] = {g: {**item, "times_s": _median_lists([run[kind][g]["times_s"] for run in runs])}
                        for g, item in first[kind].items()}
    return merged


def comm_pass_spread(runs: Sequence[dict]) -> dict:
    """Per kind ("p2p", "allreduce.<g>", "allgather.<g>"): each pass's sum of medians over the
    message sizes relative to the median pass, and the spread (max - min) / min in percent; the
    profile's `provenance.comm_passes` entry (how much the passes disagreed)."""
    series = {}
    if runs and runs[0]["p2p"] is not None:
        series["p2p"] = [[sum(run["p2p"])] for run in runs]
    for kind in ("allreduce", "allgather"):
        for g in (runs[0][kind] if runs else {}):
            series[f"{kind}.{g}"] = [[sum(run[kind][g]["times_s"])] for run in runs]
    return {name: pass_spread(list(zip(*totals))) for name, totals in series.items()}
