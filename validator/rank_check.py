"""Does the planner's order hold for real? `ghpsim validate SCENARIO --profile P --rank`.

The planner ranks every candidate for the profile's world size N (the ranks it was calibrated
with; `--gpus`, when given, must be N) with the profile's costs
(`simulator.planner.rank_candidates`); the top K and J others spread over the rest of the ranking
run for real through the validator (`validator.validate.validate`, one candidate at a time). Two
figures judge the ranking: Kendall's tau-b between predicted and measured step times of the runs
(1 = same order, -1 = reversed), and the top-1 regret: how much slower (%) the candidate predicted
fastest measured than the fastest measured.
Asynchronous pipeline kinds are left out (`checked_kinds`): the simulator predicts their
steady-state time per step, while a measured step runs one plan from fill to drain.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.planner import ASYNC_KINDS, MEGATRON, Candidate, candidate_kinds, candidate_scenario, rank_candidates
from simulator.profile import load_profile
from simulator.scenario import Scenario, scenario_from_dict
from validator.measure import RunOptions

MIN_GAP_PCT = 2.0
"""Candidates predicted within this % of a faster one are not run (their order is noise)."""
DEFAULT_TOP, DEFAULT_OTHERS = 3, 2
"""--top and --others where not given."""


def checked_kinds() -> tuple[str, ...]:
    """The planner's kinds whose measured step is comparable with the prediction (synchronous) and
    that the validator runs (not megatron: no tensor-parallel runtime, and profiles time whole layers)."""
    return tuple(kind for kind in candidate_kinds() if kind not in ASYNC_KINDS and kind != MEGATRON)


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two paired sequences (Kendall 1945, ties adjusted): (C - D) /
    sqrt((n0 - n1)(n0 - n2)), n0 = pairs, n1 / n2 = pairs tied in x / in y; nan if undefined."""
    if len(x) != len(y):
        raise ValueError("kendall_tau: sequences of different lengths")
    score, tied_x, tied_y, pairs = 0, 0, 0, 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = _sign(x[i] - x[j]), _sign(y[i] - y[j])
            pairs += 1
            tied_x += dx == 0
            tied_y += dy == 0
            score += dx * dy
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return score / denominator if denominator else float("nan")


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def top1_regret_pct(predicted_s: list[float], measured_s: list[float]) -> float:
    """% by which the measured time of the predicted-fastest case exceeds the fastest measured."""
    chosen = min(range(len(predicted_s)), key=lambda i: predicted_s[i])
    best = min(measured_s)
    return 100.0 * (measured_s[chosen] - best) / best


def distinct_predictions(times_s: list[float], min_gap_pct: float) -> list[int]:
    """Indices of an ascending list of predicted times, leaving out each time within `min_gap_pct`
    of the last one kept: candidates the model calls equal cannot test its order."""
    kept: list[int] = []
    for index, time_s in enumerate(times_s):
        if not kept or time_s > times_s[kept[-1]] * (1 + min_gap_pct / 100):
            kept.append(index)
    return kept


def pick_cases(indices: list[int], top: int, others: int) -> list[int]:
    """From ranked `indices`: the first `top`, then `others` evenly spread over the rest, the
    last (slowest) always among them."""
    chosen = indices[:top]
    rest = indices[len(chosen):]
    if others >= len(rest):
        return chosen + rest
    return chosen + [rest[round((i + 1) * len(rest) / others) - 1] for i in range(others)]


def summarize(rows: list[dict]) -> dict:
    """tau and top-1 regret of the run cases (`predicted_s`, `measured_s` per row)."""
    predicted = [row["predicted_s"] for row in rows]
    measured = [row["measured_s"] for row in rows]
    order = sorted(range(len(rows)), key=lambda i: measured[i])
    for position, index in enumerate(order, start=1):
        rows[index]["measured_rank"] = position
    return {"kendall_tau": kendall_tau(predicted, measured) if len(rows) > 1 else float("nan"),
            "top1_regret_pct": top1_regret_pct(predicted, measured) if rows else float("nan"),
            "num_cases": len(rows), "rows": rows}


def rank_check(scenario: Scenario, profile_path: str, num_gpus: int | None = None, top: int = 3,
               others: int = 2, options: RunOptions = RunOptions(), launch_timeout_s: float = 600.0,
               progress=None, on_case=None, min_gap_pct: float = MIN_GAP_PCT) -> dict:
    """Rank with the profile, run the chosen candidates (`pick_cases` over `distinct_predictions`)
    for real; `summarize` of the runs plus the size of the ranking. `on_case(rows)` after every
    finished run."""
    from validator.validate import validate
    world_size = load_profile(profile_path).world_size
    if num_gpus is not None and num_gpus != world_size:
        raise ScenarioError(f"--gpus: {num_gpus}: the profile {profile_path} was calibrated at world size "
                            f"{world_size}; rank {world_size} ranks, or calibrate at {num_gpus}")
    ranking = rank_candidates(scenario, world_size, kinds=checked_kinds(), profile_path=profile_path,
                              workers=1, show_progress=False)
    if not ranking.rows:
        raise ScenarioError(f"--rank: no candidate could be simulated on {ranking.scenario.num_gpus} ranks "
                            f"({ranking.skipped[0]['label']}: {ranking.skipped[0]['reason']})" if ranking.skipped else
                            f"--rank: no allocation of the checked kinds ({', '.join(checked_kinds())}) "
                            f"exists on {ranking.scenario.num_gpus} ranks")
    distinct = distinct_predictions([row["step_time_s"] for row in ranking.rows], min_gap_pct)
    rows = []
    for index in pick_cases(distinct, top, others):
        planned = ranking.rows[index]
        candidate = Candidate(planned["kind"], planned["num_groups"], planned["workers_per_group"],
                              planned["placement"], planned["num_microbatches"], planned["num_virtual_stages"])
        variant = scenario_from_dict(candidate_scenario(ranking.scenario, candidate), scenario.source,
                                     scenario.base_dir)
        groups = None if candidate.kind in ("dp", "mp") else candidate.num_groups
        measured = validate(variant, profile_path, [(candidate.kind, groups)], options,
                            launch_timeout_s=launch_timeout_s, progress=progress)["rows"][0]
        rows.append({**measured, "strategy": planned["label"], "predicted_rank": planned["rank"],
                     "planner_s": planned["step_time_s"]})
        if on_case is not None:
            on_case(rows)
    report = summarize(rows)
    report.update(scenario=ranking.scenario.name, num_gpus=ranking.scenario.num_gpus, min_gap_pct=min_gap_pct,
                  num_candidates=len(ranking.rows), num_distinct=len(distinct), skipped=ranking.skipped)
    return report


def cmd_validate_rank(args) -> int:
    """The `--rank` branch of `ghpsim validate` (its flags and --out checked before: `ghpsim.validator_commands`).
    The CSV is written once every candidate has run (`validator.report.staged_folder`): a failed
    run leaves --out as it was."""
    import json

    from simulator.output import check_output_file, file_stem
    from simulator.scenario import load_scenario
    from validator.report import json_ready, staged_folder, write_rows_csv
    from validator.validate_output import stop_signals_held

    if args.repeats != 1:
        raise ScenarioError(f"--repeats: {args.repeats}: --rank runs each candidate once (its steps' median)")
    if getattr(args, "step_spans", False):
        raise ScenarioError("--step-spans: not with --rank (it writes no traces); validate the strategies by name")
    top = DEFAULT_TOP if args.top is None else args.top
    others = DEFAULT_OTHERS if args.others is None else args.others
    for option, value in (("--top", top), ("--others", others), ("--gpus", args.gpus)):
        if value is not None and value < (1 if option != "--others" else 0):
            raise ScenarioError(f"{option}: {value} is out of range (at least {1 if option != '--others' else 0})")
    if top + others < 2:  # one run has no order to check
        raise ScenarioError(f"--rank needs at least 2 candidates: --top {top} + --others {others}")
    from validator.validate import check_run_options
    check_run_options(args.steps, args.warmup, args.timeout)
    scenario = load_scenario(args.scenario, args.overrides)
    csv_path = Path(args.out) / f"{file_stem(scenario.name)}_rank.csv"
    check_output_file(csv_path, "--out")
    options = RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer)
    report = rank_check(scenario, args.profile, args.gpus, top, others, options, launch_timeout_s=args.timeout,
                        progress=None if args.json else lambda message: print(message, file=sys.stderr))
    try:
        with stop_signals_held(), staged_folder(args.out) as staging:  # a stop mid-write waits for the file
            write_rows_csv(report["rows"], staging / csv_path.name)
    except KeyboardInterrupt:
        print(f"ghpsim: interrupted; the ranking of every candidate run is in {csv_path}", file=sys.stderr)
        return 130  # ghpsim.validator_commands.EXIT_INTERRUPTED
    if args.json:  # strict JSON: a tau or regret that is undefined (NaN) is null
        print(json.dumps(json_ready(report), indent=1, allow_nan=False))
        return 0
    for row in report["rows"]:
        print(f"{row['strategy']:>34s}  predicted #{row['predicted_rank']:<3d} {row['predicted_s'] * 1e3:9.2f} ms  "
              f"measured #{row['measured_rank']:<3d} {row['measured_s'] * 1e3:9.2f} ms")
    tau = (f"Kendall tau {report['kendall_tau']:.2f}" if report["num_cases"] > 1 else
           "Kendall tau: one run cannot be ranked")
    print(f"{report['num_cases']} of {report['num_candidates']} candidates run ({report['num_distinct']} with "
          f"predictions {report['min_gap_pct']:g} % apart) | {tau} | top-1 regret "
          f"{report['top1_regret_pct']:.1f} % | {csv_path}")
    return 0
