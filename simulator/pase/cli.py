"""`ghpsim search SCENARIO --gpus p[,p...] [--json]`: PaSE's strategy beside DP and the expert one."""

from __future__ import annotations

import json

from rich.table import Table

from simulator.compare import positive_ints
from simulator.pase.search import check_search_size
from simulator.progress import stderr_progress
from simulator.scenario import load_scenario
from simulator.simulate import naming_source


def parse_gpus(text: str | None, default: int) -> list[int]:
    """--gpus: a comma list of distinct positive integers (`compare.positive_ints`), else [default]."""
    return [default] if text is None else list(positive_ints(text, "--gpus"))


def run(args) -> int:
    from simulator.pase.run import check_gpus, dp_baseline, graph_for_scenario, search_point
    scenario = load_scenario(args.scenario, args.overrides)
    gpus = parse_gpus(args.gpus, scenario.num_gpus)
    points = []
    with naming_source(scenario):
        for p in gpus:
            check_gpus(scenario, p)
        graph = graph_for_scenario(scenario)
        for p in gpus:  # every size refused before any is searched
            check_search_size(graph, p)
        with stderr_progress(enabled=not args.json) as progress:
            task = progress.add_task(f"searching {graph.name} ({graph.num_vertices} vertices)", total=len(gpus))
            for p in gpus:
                points.append(search_point(scenario, graph, p, simulate=not args.no_simulate))
                progress.advance(task)
    if args.json:
        print(json.dumps({"scenario": scenario.name, "model": graph.name, "dp_baseline": dp_baseline(scenario),
                          "points": points}, indent=1))
        return 0
    _print(scenario, graph, points, args.show_configs, not args.no_simulate)
    return 0


def _print(scenario, graph, points, show_configs: bool, simulated: bool) -> None:
    from simulator.tables import make_console
    console = make_console()
    table = Table(title=f"{scenario.name}: PaSE search, {graph.name} ({graph.num_vertices} vertices, "
                        f"{len(graph.edges)} edges), batch {graph.batch}, {scenario.cluster.gpu.name}")
    columns = ["p", "link (r, FLOP/byte)", "strategy", "cost (GFLOP)", "PaSE cost (ms)", "speedup vs DP"]
    columns += ["simulated (ms)", "sim. speedup vs DP"] if simulated else []
    for column in columns + ["search (s)"]:
        table.add_column(column, justify="left" if column in ("strategy", "link (r, FLOP/byte)") else "right")
    for point in points:
        for i, row in enumerate(point["results"]):
            cells = [str(point["num_gpus"]) if i == 0 else "",
                     f"{point['link']} ({point['r_flops_per_byte']:,.0f})" if i == 0 else "",
                     row["strategy"], f"{row['cost_flops'] / 1e9:,.2f}", f"{row['analytic_s'] * 1e3:.2f}",
                     f"{row['speedup_vs_dp']:.2f}x"]
            if simulated:
                cells += [f"{row['simulated_step_s'] * 1e3:.2f}", f"{row['simulated_speedup_vs_dp']:.2f}x"]
            table.add_row(*cells, f"{row['search_s']:.3f}", end_section=i == len(point["results"]) - 1)
    console.print(table)
    console.print("cost: PaSE's F in FLOP units (compute + r x bytes); PaSE cost (ms) = F / peak FLOP/s"
                  + ("; simulated: the strategy's plan played by the engine" if simulated else ""))
    from simulator.pase.run import describe_dp_baseline, dp_baseline, dp_idle_note
    console.print(describe_dp_baseline(dp_baseline(scenario)), highlight=False)
    for note in filter(None, (dp_idle_note(point, graph.batch) for point in points)):
        console.print(note, highlight=False)
    for point in points if show_configs else points[-1:]:
        configs = point["results"][0]["configs"]
        shown = ", ".join(f"{name}: {label}" for name, label in configs.items())
        console.print(f"PaSE configurations at p={point['num_gpus']} (max dependent set "
                      f"{point['max_dependent_set']}): {shown}", highlight=False)
