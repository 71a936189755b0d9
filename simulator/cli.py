"""The `ghpsim` command line. Bad input: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources

from simulator.compare import STRATEGIES_HELP, compare, parse_strategy_specs
from simulator.errors import ScenarioError, SimulationError
from simulator.output import check_figure_file, check_output_file, write_json_atomic
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.tables import comparison_frame, print_comparison, print_summary
from simulator.trace import trace_events

EXIT_USAGE = 2

COMMAND_MODULES: tuple[str, ...] = ("simulator.rank_cli", "simulator.report.command", "simulator.sweep.command",
                                   "simulator.schedule_cli", "simulator.pase.cli", "simulator.report.gallery",
                                   "simulator.partition_cli", "simulator.profile_merge")
"""Commands that live in their own module: each module has `COMMAND` (its name),
`add_parser(commands)` (adds that sub-parser) and `run(args) -> int`. Modules register by adding
their dotted name here."""


def demo_scenario_path():
    return resources.files("simulator") / "data" / "demo.yaml"


def _add_scenario_args(parser: argparse.ArgumentParser, scenario: bool = True) -> None:
    if scenario:
        parser.add_argument("scenario", help="scenario YAML file (see scenarios/README.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario field, e.g. --set cluster.num_nodes=8 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser(extend=None) -> argparse.ArgumentParser:
    """The parser; `extend(subparsers)` may add commands (the validator adds its own)."""
    parser = argparse.ArgumentParser(prog="ghpsim", description=__doc__.splitlines()[0].replace(
        "The `ghpsim` command line.", "Simulate distributed DNN training on GPU clusters."))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="GHP vs DP vs MP on the embedded default scenario")
    _add_scenario_args(demo, scenario=False)
    demo.add_argument("--strategies", default="dp,mp,ghp", help=f"{STRATEGIES_HELP} (default dp,mp,ghp)")

    sim = commands.add_parser("simulate", help="simulate one training step of a scenario")
    _add_scenario_args(sim)
    sim.add_argument("--profile", metavar="FILE", help="calibration profile from `ghpsim calibrate` (default: analytic costs)")
    sim.add_argument("--trace", metavar="FILE", help="write the step's timeline as Perfetto trace JSON")
    sim.add_argument("--memory-plot", metavar="FILE.png", help="write each device's memory over the step as an image "
                     "(format from the suffix: png, svg, pdf, ...)")
    sim.add_argument("--jitter", action="store_true",
                     help="also the step under the profile's measured pass-to-pass jitter: median and 10th-90th "
                          "percentiles over draws (needs a --profile with a pass_jitter section)")

    cmp_ = commands.add_parser("compare", help="simulate several strategies, sorted by step time")
    _add_scenario_args(cmp_)
    cmp_.add_argument("--strategies", default="dp,mp,ghp", help=f"{STRATEGIES_HELP} (default dp,mp,ghp)")
    cmp_.add_argument("--profile", metavar="FILE", help="calibration profile from `ghpsim calibrate` (default: analytic costs)")

    listing = commands.add_parser("list", help="list presets: gpus, links or models")
    listing.add_argument("what", choices=("gpus", "links", "models"))
    for module in _command_modules():
        module.add_parser(commands)
    if extend is not None:
        extend(commands)
    return parser


def main(argv: list[str] | None = None, extend=None, extra_commands=None, user_errors=()) -> int:
    """Run a command. User errors (ScenarioError, SimulationError, `user_errors`) print one line on
    stderr and return 2."""
    args = build_parser(extend).parse_args(argv)
    commands = {**COMMANDS, **{module.COMMAND: module.run for module in _command_modules()}, **(extra_commands or {})}
    try:
        return commands[args.command](args)
    except (ScenarioError, SimulationError, *user_errors) as error:
        print(f"ghpsim: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:
        print(f"ghpsim: error: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ghpsim: interrupted", file=sys.stderr)
        return 130


def _command_modules():
    import importlib
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def _run_compare(scenario_source, args) -> int:
    scenario = load_scenario(scenario_source, args.overrides)
    results = compare(scenario, parse_strategy_specs(args.strategies), costs=_profile_costs(scenario, args))
    if args.json:
        print(json.dumps({"scenario": scenario.name,
                          "results": comparison_frame(results).to_dict(orient="records"),
                          "summaries": [result.summary for result in results]}, indent=1))
    else:
        print_comparison(results, title=f"{scenario.name}: {scenario.description or ''}".strip(": "))
    return 0


def cmd_demo(args) -> int:
    with resources.as_file(demo_scenario_path()) as path:
        return _run_compare(path, args)


def cmd_compare(args) -> int:
    return _run_compare(args.scenario, args)


def _profile_costs(scenario, args):
    """The `--profile` cost model for the scenario's model, or None (analytic costs)."""
    if not getattr(args, "profile", None):
        return None
    from simulator.model_source import resolve_workload
    from simulator.profile_costs import profile_costs
    return profile_costs(args.profile, resolve_workload(scenario.model, scenario.base_dir),
                         optimizer=scenario.training.optimizer)


def cmd_simulate(args) -> int:
    if args.trace:
        check_output_file(args.trace, "--trace")
    if args.memory_plot:
        check_figure_file(args.memory_plot, "--memory-plot")
    scenario = load_scenario(args.scenario, args.overrides)
    costs = _profile_costs(scenario, args)
    if args.jitter:
        check_jitter_source(costs, args.profile)
    result = simulate(scenario, costs=costs, workload=costs.workload if costs else None)
    if args.jitter:
        from simulator.pass_jitter import jittered_prediction
        result.summary["jitter"] = jittered_prediction(result, costs)
    if args.trace:
        labels = {row["rank"]: f"rank {row['rank']} (gpu{row['device']}, node {row['node']})"
                  for row in result.summary["devices"]}
        write_json_atomic(args.trace, trace_events(result.spans, labels))
    if args.memory_plot:
        from simulator.memory_plot import write_memory_plot  # matplotlib only when asked
        write_memory_plot(result, args.memory_plot)
    if args.json:
        print(result.to_json())
    else:
        print_summary(result)
        if args.trace:
            print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def check_jitter_source(costs, profile_path: str | None) -> None:
    """ScenarioError (exit 2) unless `--jitter` has a profile with measured pass jitter to draw from."""
    if costs is None:
        raise ScenarioError("--jitter: needs --profile (the jitter is the profile's measured pass-to-pass spread)")
    if getattr(costs, "pass_jitter", None) is None:
        raise ScenarioError(f"--jitter: the profile {profile_path} has no pass_jitter section "
                            "(recalibrate with `ghpsim calibrate`)")


def cmd_list(args) -> int:
    from simulator.hardware import GPUS, LINKS
    from simulator.zoo import MODELS
    if args.what == "gpus":
        for name, gpu in GPUS.items():
            peaks = ", ".join(f"{k} {v / 1e12:g}T" for k, v in gpu.peak_flops_per_s.items())
            print(f"{name:12s} {gpu.memory_bytes / 2**30:6.0f} GiB  {gpu.memory_bandwidth_bytes_per_s / 1e9:6.0f} GB/s  {peaks}")
    elif args.what == "links":
        for name, link in LINKS.items():
            print(f"{name:14s} {link.bandwidth_bytes_per_s / 1e9:8.3f} GB/s  {link.latency_s * 1e6:5.1f} us")
    else:
        for name in MODELS:
            print(name)
    return 0


COMMANDS = {"demo": cmd_demo, "simulate": cmd_simulate, "compare": cmd_compare, "list": cmd_list}

if __name__ == "__main__":
    sys.exit(main())
