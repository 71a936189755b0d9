"""`ghpsim rank SCENARIO --gpus N[,N...]`: the layout search (`simulator.layout_search`) on each
cluster size, its counts and times, the top K with why each lost to the best, the GHP paper's
analytic heuristics (their pick, its simulated rank and regret) and, with `--tokens` or `--steps`,
the whole run's time and cost; several sizes side by side with the Pareto front of time and cost (a
size where no layout fits says so; only when none has one is that an error)."""

from __future__ import annotations

import json
import os
import math

from rich.table import Table

from simulator.compare import comma_items, positive_ints
from simulator.errors import ScenarioError
from simulator.limits import MAX_GPUS, MAX_MAGNITUDE
from simulator.fabrics import build_topology
from simulator.heuristics import HEURISTICS, grid_estimates
from simulator.worker_pool import check_most_workers
from simulator.model_source import resolve_workload
from simulator.output import check_distinct_files, check_figure_file, model_files
from simulator.profile_costs import kernel_profile_parameters
from simulator.planner import (ASYNC_KINDS, MEGATRON, Candidate, Ranking, candidate_kinds, candidate_scenario,
                               grid_candidate)
from simulator.scenario import PIPELINE_KINDS, Scenario, load_scenario, scenario_from_dict
from simulator.simulate import analytic_costs, naming_source
from simulator.units import plural

GRID_KINDS = ("dp", "mp", "ghp")


def run(args) -> int:
    from simulator.layout_search import MICROBATCH_SIZES, search_layouts
    for option, value in (("--top", args.top), ("--workers", args.workers), ("--steps", args.steps)):
        if value is not None and value < 1:
            raise ScenarioError(f"{option}: {value} must be a positive integer")
    check_most_workers(args.workers)
    for option, value in (("--tokens", args.tokens), ("--price-per-gpu-hour", args.price_per_gpu_hour),
                          ("--steps", args.steps)):
        if value is not None and not (0 < value <= MAX_MAGNITUDE):  # the run's figures stay finite
            raise ScenarioError(f"{option}: {value} must be a positive number up to {MAX_MAGNITUDE:g}")
    if args.price_per_gpu_hour is not None and args.tokens is None and args.steps is None:
        raise ScenarioError("--price-per-gpu-hour: prices a whole run; give its length with --tokens or --steps")
    if args.plot is not None:
        check_figure_file(args.plot, "--plot")
    sizes = positive_ints(args.gpus, "--gpus") if args.gpus is not None else (None,)
    if max(size or 0 for size in sizes) > MAX_GPUS:
        raise ScenarioError(f"--gpus: {max(sizes)} is more than the {MAX_GPUS:,} GPUs a scenario may have")
    microbatches = None if args.microbatches == "auto" else positive_ints(args.microbatches, "--microbatches")
    sizes_b = positive_ints(args.microbatch_sizes, "--microbatch-sizes")
    kinds = _kinds(args.kinds)
    _check_used(kinds, microbatches is not None, tuple(sizes_b) != MICROBATCH_SIZES)
    if args.profile is not None:  # a kernel profile prices every layout: the scenario key, by absolute path
        args.overrides = [*args.overrides, f"costs.kernel_profile={os.path.abspath(args.profile)}"]
    scenario = load_scenario(args.scenario, args.overrides)
    with naming_source(scenario):  # a model that cannot be built is named with its file, as `simulate` names it
        resolve_workload(scenario.model, scenario.base_dir)
    if args.profile is not None:
        kernel_profile_parameters(args.profile, scenario, field="--profile ")
    batch = scenario.training.global_batch_size
    if (kinds is None or MEGATRON in kinds) and all(batch % size for size in sizes_b):  # nor any replica's share
        raise ScenarioError(f"--microbatch-sizes: none of {args.microbatch_sizes} divides training.global_batch_size "
                            f"{batch}, so no replica's batch splits into such micro-batches")
    check_distinct_files({"--plot": args.plot}, {"the scenario": args.scenario, **model_files(scenario)})
    results = []  # (ranking, heuristics, why no layout fits or None)
    for num_gpus in sizes:
        ranking = search_layouts(scenario, num_gpus, kinds=kinds, microbatch_sizes=sizes_b,
                                 microbatch_counts=microbatches, top=args.top, workers=args.workers,
                                 exhaustive=args.exhaustive, show_progress=not args.json)
        unfit = None if any(row["fits_in_memory"] for row in ranking.rows) else no_candidate_error(ranking, args)
        if unfit is not None and len(sizes) == 1:
            raise unfit
        plan_run(ranking, args.tokens, args.steps, args.price_per_gpu_hour)
        add_reproduction(ranking, scenario, args.overrides)
        heuristics = heuristic_rows(ranking) if _grid_searched(ranking) else []
        why = None if unfit is None else str(unfit).partition(": ")[2]  # the reason, without the flag to blame
        results.append((ranking, heuristics, why))
    if all(why for *_, why in results):  # several sizes, none with a layout that fits
        raise ScenarioError(f"--gpus {args.gpus!r}: no size has a layout that fits; {results[0][2]}")
    if args.plot:
        from simulator.rank_plot import write_rank_plot  # matplotlib only when asked
    plot = write_rank_plot(results, args.plot, _title(results[0][0]), args.top) if args.plot else None
    if args.json:
        several = len(sizes) > 1  # each size says why none of its layouts fits, or null
        documents = [{**ranking.to_dict(), "heuristics": heuristics, **({"no_layout_fits": why} if several else {})}
                     for ranking, heuristics, why in results]
        document = documents[0] if len(documents) == 1 else {
            "sizes": documents, "pareto_gpus": [ranking.scenario.num_gpus for ranking, row in
                                                pareto_bests([ranking for ranking, _, _ in results]) if row]}
        print(json.dumps({**document, **({"plot": str(plot)} if plot else {})}, indent=1))
        return 0
    for ranking, heuristics, why in results:
        if why is None:
            print_ranking(ranking, heuristics, args.top, args.exhaustive)
        else:
            print(f"{_title(ranking)}: {why}")
    if len(results) > 1:
        print_comparison([ranking for ranking, _, _ in results])
    note = default_network_note(scenario, [ranking for ranking, _, _ in results])
    if note:
        print(note)
    if plot:
        print(f"plot written to {plot}")
    return 0


def plan_run(ranking: Ranking, tokens: float | None, steps: int | None, price: float | None) -> None:
    """Whole-run figures on every row (in place): steps = ceil(tokens / (batch x sequence length)) or
    --steps, time to train = steps x step time, GPU-hours = time x N, cost = GPU-hours x price."""
    scenario = ranking.scenario
    per_step = scenario.training.global_batch_size * tokens_per_sample(scenario)
    count = steps if steps is not None else math.ceil(tokens / per_step) if tokens is not None else None
    for row in ranking.rows:
        if count is None:
            continue
        hours = count * row["step_time_s"] * scenario.num_gpus / 3600
        row.update(run_steps=count, time_to_train_s=count * row["step_time_s"], gpu_hours=hours,
                   cost=hours * price if price is not None else None)


def add_reproduction(ranking: Ranking, scenario: Scenario, given: list[str]) -> None:
    """On every row (in place): `overrides`, the fields (dotted keys) in which the row's layout differs
    from `scenario` (the file with the user's --set `given`), and `set`, the `--set KEY=VALUE` list
    (`given` first) that makes `ghpsim simulate FILE` the row's layout, with the same step time. A
    megatron order is named (`strategy.placement: tp_dp_pp`), which the plan resolves to the devices
    the search simulated (`simulator.layout_geometry.resolved_placement`)."""
    base = scenario.model_dump(mode="json")
    for row in ranking.rows:
        raw = candidate_scenario(ranking.scenario, row_candidate(row))
        if row["kind"] == MEGATRON:
            raw["strategy"]["placement"] = row["placement"]
        target = scenario_from_dict(raw, ranking.scenario.source, ranking.scenario.base_dir).model_dump(mode="json")
        row["overrides"] = _differences(base, target)
        row["set"] = [*given, *(f"{key}={_yaml_text(value)}" for key, value in row["overrides"].items())]


def row_candidate(row: dict) -> Candidate:
    """The planner's `Candidate` of a ranking row (`simulator.planner._row`)."""
    return Candidate(row["kind"], row["num_groups"], row["workers_per_group"], row["placement"],
                     row["num_microbatches"], row["num_virtual_stages"], row["tp_degree"], row.get("recompute"),
                     row.get("zero_stage"), row.get("sequence_parallel"), row.get("ep_degree"), row["cp_degree"])


def simulate_command(path: str, row: dict) -> str:
    """`ghpsim simulate PATH --set ...` of a row (shell-quoted)."""
    import shlex
    return " ".join(["ghpsim simulate", shlex.quote(str(path)), *(f"--set {shlex.quote(item)}" for item in row["set"])])


def _differences(base, target, path: str = "") -> dict:
    """Dotted key -> `target`'s value wherever it differs from `base` (mappings compared key by key)."""
    if isinstance(base, dict) and isinstance(target, dict):
        found = {}
        for key in (*target, *(k for k in base if k not in target)):
            found.update(_differences(base.get(key), target.get(key), f"{path}.{key}" if path else str(key)))
        return found
    return {} if base == target else {path: target}


def _yaml_text(value) -> str:
    """`value` as --set reads it back (`simulator.scenario.apply_override`: YAML): plain text for a
    string that reads back as itself, else JSON (a YAML flow value)."""
    import yaml

    from simulator.yaml_loading import StrictLoader
    if isinstance(value, str):
        try:
            if yaml.load(value, Loader=StrictLoader) == value:  # noqa: S506 (a SafeLoader)
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


def tokens_per_sample(scenario) -> int:
    """The sequence length of a transformer (its layers' `seq_len`), else 1 (a sample is a token)."""
    workload = resolve_workload(scenario.model, scenario.base_dir)
    return max((layer.spec.get("seq_len", 1) for layer in workload.layers), default=1)


def _grid_searched(ranking) -> bool:
    return any(row["kind"] in GRID_KINDS for row in ranking.rows)


def no_candidate_error(ranking: Ranking, args) -> ScenarioError:
    """No candidate that fits was simulated: say so with the smallest memory needed when memory is why,
    else name the flag to blame (--microbatches when every reason is about micro-batches), the flags
    in play and the first reasons."""
    given = [f"--gpus {ranking.scenario.num_gpus}"]
    memory = [entry for entry in getattr(ranking, "pruned", []) if entry["reason"] == "memory"]
    memory += [{"memory_bytes": row["peak_memory_bytes"]} for row in ranking.rows if not row["fits_in_memory"]]
    if memory:
        smallest = min(entry.get("memory_floor_bytes", entry.get("memory_bytes", 0.0)) for entry in memory)
        field = "--gpus" if args.gpus is not None else "cluster.gpu"  # memory is why: blame a flag only if given
        return ScenarioError(f"{field}: no layout fits in {ranking.device_memory_bytes / 2**30:,.1f} GiB of device "
                             f"memory on {plural(ranking.scenario.num_gpus, 'GPU')} ({len(memory)} tried; the smallest "
                             f"needs at least {smallest / 2**30:,.1f} GiB)")
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


def print_ranking(ranking: Ranking, heuristics: list[dict], top: int, exhaustive: bool = False) -> None:
    from simulator.rank_reasons import shown_rows
    from simulator.tables import make_console
    console = make_console()
    table = Table(title=_title(ranking), caption="lost to: where the step exceeds #1's most (compute, bubble, "
                  "host: the GPU waiting for kernels to be issued, communication, or above bound: contention and "
                  "schedule stalls the bound does not count; asynchronous: a steady-state step, not split)")
    planned = bool(ranking.rows) and "time_to_train_s" in ranking.rows[0]
    columns = ["#", "candidate", "step (ms)", "bound (ms)", "samples/s", "comm %", "memory (GiB)", "lost to"]
    if planned:
        columns += ["time to train (h)", "GPU-hours"] + (["cost"] if ranking.rows[0]["cost"] is not None else [])
    for column in columns:
        table.add_column(column, justify="left" if column in ("candidate", "lost to") else "right")
    for position, row, label in shown_rows(ranking.rows[:top]):
        cells = [position, label + (" *" if row["kind"] in ASYNC_KINDS else ""),
                 _ms(row["step_time_s"]), _ms(row.get("bound_s") or None),
                 _number(row["throughput_samples_per_s"], 1), f"{100 * row['comm_share']:.0f}",
                 _number(row["peak_memory_bytes"] / 2**30, 2),
                 "[red]memory[/red]" if not row["fits_in_memory"] else (row.get("lost_to") or "-")]
        if planned:
            cells += [_amount(row["time_to_train_s"] / 3600, 1), _amount(row["gpu_hours"])]
            cells += [_amount(row["cost"])] if row["cost"] is not None else []
        table.add_row(*cells)
    console.print(table)
    console.print(f"memory: {ranking.memory_source}; device memory {ranking.device_memory_bytes / 2**30:,.1f} GiB; "
                  f"{plural(len(ranking.rows), 'candidate')} simulated, {len(ranking.skipped)} skipped (--json lists why)")
    stats = getattr(ranking, "stats", None)
    if stats is not None:
        seconds = stats.seconds
        console.print(f"search: {stats.enumerated} enumerated ({seconds['enumerate']:.1f} s), "
                      f"{stats.pruned_memory} pruned by memory ({seconds['memory']:.1f} s), "
                      f"{stats.pruned_bound} pruned by the step-time bound ({seconds['bound']:.1f} s), "
                      f"{stats.simulated} simulated ({seconds['simulate']:.1f} s)")
    if ranking.rows and "set" in ranking.rows[0]:
        console.print(f"#1 as a scenario: {simulate_command(ranking.scenario.source, ranking.rows[0])} (--json: "
                      "every row's `set`)", highlight=False, markup=False, soft_wrap=True)
    if any(row["kind"] in ASYNC_KINDS for row in ranking.rows[:top]):
        console.print("* asynchronous (stale weights): steady-state time per step, not mini-batch SGD's updates")
    if not heuristics:
        return
    picks = Table(title="GHP heuristics (closed form, no simulation) vs the simulated best",
                  caption="rank among every layout that may fit in memory (--exhaustive)" if exhaustive else
                  "rank among the layouts simulated: the search stops early, --exhaustive simulates all")
    for column in ("heuristic", "pick", "closed form (ms)", "simulated (ms)", "rank", "regret %",
                   "vs best grid %"):
        picks.add_column(column, justify="left" if column in ("heuristic", "pick") else "right")
    for row in heuristics:
        picks.add_row(row["heuristic"], row["label"] or "none fits", _ms(row["closed_form_s"]),
                      _ms(row["simulated_s"]), str(row["simulated_rank"] or "-"),
                      _pct(row["regret_pct"]), _pct(row["grid_regret_pct"]))
    console.print(picks)


def print_comparison(rankings: list) -> None:
    """Cluster sizes side by side: each size's best layout that fits and its run figures, or "no
    layout fits"; the Pareto front of time and cost among the sizes with a layout that fits."""
    from simulator.tables import make_console
    table = Table(title="cluster sizes: the best layout of each")
    for column in ("GPUs", "best layout", "step (s)", "samples/s", "time to train (h)", "GPU-hours", "cost",
                   "Pareto"):
        table.add_column(column, justify="left" if column == "best layout" else "right")
    for (ranking, on_front), row in zip(pareto_bests(rankings), _bests(rankings)):
        if row is None:
            table.add_row(str(ranking.scenario.num_gpus), "no layout fits", *["-"] * 5, "")
            continue
        hours = row.get("time_to_train_s")
        table.add_row(str(ranking.scenario.num_gpus), row["label"], _number(row["step_time_s"], 3),
                      _number(row["throughput_samples_per_s"], 1), "-" if hours is None else _amount(hours / 3600, 1),
                      "-" if hours is None else _amount(row["gpu_hours"]),
                      "-" if row.get("cost") is None else _amount(row["cost"]), "yes" if on_front else "")
    make_console().print(table)


def _bests(rankings: list) -> list[dict | None]:
    """Each size's best layout that fits, or None."""
    return [next((row for row in ranking.rows if row["fits_in_memory"]), None) for ranking in rankings]


def pareto_bests(rankings: list) -> list[tuple]:
    """(ranking, whether its best layout is on the Pareto front of time to train, or step time, and
    cost among the sizes with a layout that fits; False for a size without one)."""
    from simulator.rank_reasons import pareto_front, row_cost
    bests = _bests(rankings)
    on_front = iter(pareto_front([(row.get("time_to_train_s", row["step_time_s"]), row_cost(row, ranking))
                                  for ranking, row in zip(rankings, bests) if row is not None]))
    return [(ranking, row is not None and bool(next(on_front))) for ranking, row in zip(rankings, bests)]


def _check_used(kinds: tuple[str, ...] | None, counts_given: bool, sizes_given: bool) -> None:
    """One-line ScenarioError for a micro-batch flag that none of `--kinds` reads: --microbatches
    is the pipeline kinds' m, --microbatch-sizes megatron's b."""
    if kinds is None:
        return
    if counts_given and not any(kind in PIPELINE_KINDS for kind in kinds):
        raise ScenarioError(f"--microbatches: only the pipeline kinds read it ({', '.join(PIPELINE_KINDS)}); "
                            f"--kinds {','.join(kinds)} has none")
    if sizes_given and MEGATRON not in kinds:
        raise ScenarioError(f"--microbatch-sizes: only megatron layouts read it; --kinds {','.join(kinds)} has none")


def _regret_pct(row: dict, best: dict) -> float:
    return 100.0 * (row["step_time_s"] - best["step_time_s"]) / best["step_time_s"]


def _kinds(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    kinds = tuple(comma_items(text, "--kinds"))
    unknown = [kind for kind in kinds if kind not in candidate_kinds()]
    if unknown or not kinds:
        raise ScenarioError(f"--kinds: {text!r}: choose from {', '.join(candidate_kinds())}")
    return kinds


def _title(ranking: Ranking) -> str:
    cluster = ranking.scenario.cluster
    network = f", {cluster.nics_per_node} x {cluster.inter_node_link.name} a node" if cluster.num_nodes > 1 else ""
    return (f"{ranking.scenario.name}: {plural(ranking.scenario.num_gpus, 'GPU')} ({cluster.num_nodes} x {cluster.gpus_per_node} "
            f"{cluster.gpu.name}{network}), batch {ranking.scenario.training.global_batch_size}")


def default_network_note(scenario, rankings) -> str | None:
    """A note when sizes on several nodes take the network the scenario leaves at its default."""
    grown = any(ranking.scenario.cluster.num_nodes > 1 for ranking in rankings)
    if not grown or {"inter_node_link", "nics_per_node"} & scenario.cluster.model_fields_set:
        return None
    cluster = rankings[0].scenario.cluster
    return (f"note: the scenario sets no cluster.inter_node_link or nics_per_node: its nodes are joined by the default, "
            f"{cluster.nics_per_node} x {cluster.inter_node_link.name} a node (set both for the cluster you plan)")


SCIENTIFIC_FROM = 1e9
"""Figures from this size on are printed in scientific notation (1.173e+26): a table cell stays narrow."""


def _number(value: float, decimals: int) -> str:
    """A figure with `decimals` decimals and thousands separators, or in scientific notation from
    `SCIENTIFIC_FROM` on; every figure of the rank tables is printed so."""
    if math.isfinite(value) and abs(value) >= SCIENTIFIC_FROM:
        return f"{value:.3e}"
    return f"{value:,.{decimals}f}"


def _amount(value: float, decimals: int = 0) -> str:
    """A run figure with at least `decimals` decimals and at least 3 significant digits (a run of
    minutes shows 0.0123 h, not 0.0, so its time, GPU-hours and cost agree)."""
    if value > 0 and math.isfinite(value):
        decimals = max(decimals, 2 - math.floor(math.log10(value)))
    return _number(value, decimals)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else _number(seconds * 1e3, 2)
