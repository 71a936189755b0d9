"""`ghpsim rank SCENARIO --gpus N`: every worker allocation simulated and ranked, beside the GHP
paper's analytic heuristics (their pick, its simulated rank and regret)."""

from __future__ import annotations

import json

from rich.table import Table

from simulator.errors import ScenarioError
from simulator.fabrics import build_topology
from simulator.heuristics import HEURISTICS, grid_estimates
from simulator.model_source import resolve_workload
from simulator.output import check_figure_file
from simulator.planner import ASYNC_KINDS, Ranking, candidate_kinds, grid_candidate, rank_candidates
from simulator.scenario import load_scenario
from simulator.simulate import analytic_costs

COMMAND = "rank"


def run(args) -> int:
    for option, value in (("--top", args.top), ("--workers", args.workers), ("--gpus", args.gpus)):
        if value is not None and value < 1:
            raise ScenarioError(f"{option}: {value} must be a positive integer")
    if args.plot:
        check_figure_file(args.plot, "--plot")
    microbatches = _int_list(args.microbatches, "--microbatches")
    kinds = _kinds(args.kinds)
    scenario = load_scenario(args.scenario, args.overrides)
    ranking = rank_candidates(scenario, args.gpus, kinds=kinds, microbatch_counts=microbatches, workers=args.workers,
                              show_progress=not args.json)
    if not ranking.rows:
        raise no_candidate_error(ranking, args)
    heuristics = heuristic_rows(ranking)
    plot = None
    if args.plot:
        from simulator.rank_plot import write_ranking_plot
        picks: dict[str, list[str]] = {}
        for row in heuristics:
            if row["label"]:
                picks.setdefault(row["label"], []).append(row["heuristic"])
        plot = write_ranking_plot(ranking.frame(), args.plot, _title(ranking),
                                  {label: ", ".join(names) for label, names in picks.items()})
    if args.json:
        print(json.dumps({**ranking.to_dict(), "heuristics": heuristics}, indent=1))
    else:
        print_ranking(ranking, heuristics, args.top)
        if plot:
            print(f"plot written to {plot}")
    return 0


def no_candidate_error(ranking: Ranking, args) -> ScenarioError:
    """Every candidate skipped: name the flag to blame (--microbatches when every reason is about
    micro-batches), the flags in play and the first reasons."""
    given = [f"--gpus {ranking.scenario.num_gpus}"]
    if args.kinds is not None:
        given.append(f"--kinds {args.kinds}")
    given.append(f"--microbatches {args.microbatches}")
    reasons = [s["reason"] for s in ranking.skipped]
    blame = "--microbatches" if reasons and all("micro-batch" in r for r in reasons) else "--gpus/--kinds"
    if blame == "--microbatches":
        given.append(f"batch {ranking.scenario.training.global_batch_size}")
    first = "; ".join(s["label"] + ": " + s["reason"] for s in ranking.skipped[:3])
    return ScenarioError(f"{blame}: no candidate could be simulated with {', '.join(given)} "
                         f"({first or 'none enumerated'})")


def heuristic_rows(ranking: Ranking, costs=None) -> list[dict]:
    """Each heuristic's pick (closed form, `simulator.heuristics`), its simulated rank and its
    regret: % slower in simulation than the simulated best (`regret_pct`) and than the best
    dp/mp/ghp grid, the family the heuristics choose from (`grid_regret_pct`)."""
    scenario = ranking.scenario
    workload = resolve_workload(scenario.model, scenario.base_dir)
    training = scenario.training
    estimates = grid_estimates(workload, costs or analytic_costs(scenario, workload), build_topology(scenario.cluster),
                               global_batch_size=training.global_batch_size, dtype=training.dtype,
                               optimizer=training.optimizer, device_memory_bytes=ranking.device_memory_bytes)
    best = ranking.rows[0] if ranking.rows else None
    best_grid = next((row for row in ranking.rows if row["kind"] in ("dp", "mp", "ghp")), None)
    rows = []
    for name, choose in HEURISTICS.items():
        pick = choose(estimates)
        row = {"heuristic": name, "label": None, "closed_form_s": None, "estimated_memory_bytes": None,
               "simulated_s": None, "simulated_rank": None, "regret_pct": None, "grid_regret_pct": None}
        if pick is not None:
            label = grid_candidate(pick.num_groups, pick.workers_per_group, pick.placement).label
            row.update(label=label, closed_form_s=pick.step_time_s, estimated_memory_bytes=pick.peak_memory_bytes)
            found = ranking.find(label)
            if found is not None and best is not None:
                row.update(simulated_s=found["step_time_s"], simulated_rank=found["rank"],
                           regret_pct=_regret_pct(found, best), grid_regret_pct=_regret_pct(found, best_grid))
        rows.append(row)
    return rows


def print_ranking(ranking: Ranking, heuristics: list[dict], top: int) -> None:
    from simulator.tables import make_console
    console = make_console()
    table = Table(title=_title(ranking))
    for column in ("#", "candidate", "step (ms)", "samples/s", "speedup", "comm %", "memory (GiB)", "fits"):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for row in ranking.rows[:top]:
        table.add_row(str(row["rank"]), row["label"] + (" *" if row["kind"] in ASYNC_KINDS else ""), f"{row['step_time_s'] * 1e3:.2f}",
                      f"{row['throughput_samples_per_s']:,.0f}", f"{row['speedup']:.2f}x",
                      f"{100 * row['comm_share']:.0f}", f"{row['peak_memory_bytes'] / 2**30:,.2f}",
                      "yes" if row["fits"] else "[red]NO[/red]")
    console.print(table)
    console.print(f"memory: {ranking.memory_source}; device memory {ranking.device_memory_bytes / 2**30:,.1f} GiB; "
                  f"{len(ranking.rows)} candidates simulated, {len(ranking.skipped)} skipped (--json lists why)")
    if any(row["kind"] in ASYNC_KINDS for row in ranking.rows[:top]):
        console.print("* asynchronous (stale weights): steady-state time per step, not mini-batch SGD's updates")
    picks = Table(title="GHP heuristics (closed form, no simulation) vs the simulated best")
    for column in ("heuristic", "pick", "closed form (ms)", "simulated (ms)", "simulated rank", "regret %",
                   "vs best grid %"):
        picks.add_column(column, justify="left" if column in ("heuristic", "pick") else "right")
    for row in heuristics:
        picks.add_row(row["heuristic"], row["label"] or "none fits", _ms(row["closed_form_s"]),
                      _ms(row["simulated_s"]), str(row["simulated_rank"] or "-"),
                      _pct(row["regret_pct"]), _pct(row["grid_regret_pct"]))
    console.print(picks)


def _regret_pct(row: dict, best: dict) -> float:
    return 100.0 * (row["step_time_s"] - best["step_time_s"]) / best["step_time_s"]


def _kinds(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    kinds = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in candidate_kinds()]
    if unknown or not kinds:
        raise ScenarioError(f"--kinds: {text!r}: choose from {', '.join(candidate_kinds())}")
    return kinds


def _title(ranking: Ranking) -> str:
    cluster = ranking.scenario.cluster
    return (f"{ranking.scenario.name}: {ranking.scenario.num_gpus} GPUs ({cluster.num_nodes} x {cluster.gpus_per_node} "
            f"{cluster.gpu.name}), batch {ranking.scenario.training.global_batch_size}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ScenarioError(f"{option}: {text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise ScenarioError(f"{option}: {text!r} needs positive integers")
    return values
