"""The simulator's own commands: demo, simulate, compare and list (arguments: `ghpsim.arguments`)."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from importlib import resources

from simulator.compare import (MEGATRON, comma_items, compare, dropped_replicas, megatron_only_settings,
                               parse_strategy_specs)
from simulator.output import check_distinct_files, check_figure_file, check_output_file, model_files, write_files_atomic
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.tables import comparison_frame, print_comparison, print_summary, strategy_label
from simulator.trace import trace_events


def demo_scenario_path():
    return resources.files("simulator") / "data" / "demo.yaml"


def _run_compare(scenario_source, args) -> int:
    scenario = load_scenario(scenario_source, args.overrides)
    specs = parse_strategy_specs(args.strategies)
    with _engine_progress(enabled=not args.json):
        results = _compare(scenario, specs, _profile_costs(scenario, args))
    others = [spec for spec in comma_items(args.strategies, "--strategies") if spec != "megatron"]
    dropped = megatron_only_settings(scenario) if others else []  # the other kinds ran without them
    replicas = dropped_replicas(scenario, specs)  # other pipeline kinds: G = 1
    unfit = [strategy_label(result.summary) for result in results if not result.summary["fits_in_memory"]]
    if args.json:
        records = comparison_frame(results).to_dict(orient="records")
        for position, record in enumerate(records, start=1):  # `compare.ranked`: the plans that fit first
            record["rank"] = position if record["fits_in_memory"] else None
        print(json.dumps({"scenario": scenario.name, "results": records,
                          "summaries": [result.summary for result in results],
                          "megatron_only_dropped": dropped, "pipeline_replicas_dropped": replicas}, indent=1))
    else:
        changed = f" (with {', '.join(args.overrides)})" if args.overrides else ""  # the description may not hold
        notes = [f"{', '.join(others)}: without {', '.join(dropped)} (kind megatron only)"] if dropped else []
        if replicas:
            notes.append(f"{', '.join(replicas)}: G=1, without strategy.num_groups {scenario.strategy.num_groups} "
                         f"(kept for kind {scenario.strategy.kind} only)")
        if unfit:
            notes.append(f"infeasible (does not fit in GPU memory), ranked after every plan that fits: {', '.join(unfit)}")
        print_comparison(results, title=f"{scenario.name}: {scenario.description or ''}".strip(": ") + changed,
                         caption="\n".join(notes) or None)
    return 0


def _compare(scenario, specs, costs):
    """`compare`, with a note on stderr when another kind's scenario is also played as its megatron
    layout, which drops the gradient settings megatron does not play (`compare.megatron_layout`):
    allreduce for a parameter server, dense gradients for top-k, no LaySA weight update."""
    strategy, training = scenario.strategy, scenario.training
    if (MEGATRON, None) in specs and strategy.kind != MEGATRON:
        unused = [setting for setting, used in (
            ("strategy.dp_sync parameter_server", strategy.dp_sync == "allreduce"),
            ("strategy.gradient_compression topk", strategy.gradient_compression == "none"),
            ("training.memory_policy laysa", training.memory_policy != "laysa")) if not used]
        if unused:
            print(f"ghpsim: note: {', '.join(unused)}: not used by the megatron item, which reduces dense gradients "
                  "with allreduce and keeps each until the update", file=sys.stderr)
    return compare(scenario, specs, costs=costs)


def cmd_demo(args) -> int:
    with resources.as_file(demo_scenario_path()) as path:
        return _run_compare(path, args)


def cmd_compare(args) -> int:
    if args.strategies is None:  # a megatron scenario: its own layout (as report), else dp,mp,ghp
        from simulator.compare import default_strategies
        args.strategies = default_strategies(load_scenario(args.scenario, args.overrides))
    return _run_compare(args.scenario, args)


def _profile_costs(scenario, args):
    """The `--profile` cost model for the scenario's model, or None (analytic costs)."""
    if not getattr(args, "profile", None):
        return None
    from simulator.model_source import resolve_workload
    from simulator.profile_costs import scenario_profile_costs
    return scenario_profile_costs(args.profile, scenario, resolve_workload(scenario.model, scenario.base_dir))


def cmd_simulate(args) -> int:
    if args.trace is not None:
        check_output_file(args.trace, "--trace")
    if args.memory_plot is not None:
        check_figure_file(args.memory_plot, "--memory-plot")
    scenario = load_scenario(args.scenario, args.overrides)
    notes = _unused_setting_notes(scenario, priced_by_profile=bool(args.profile))  # printed once the run succeeded
    check_distinct_files({"--trace": args.trace, "--memory-plot": args.memory_plot},
                         {"the scenario": args.scenario, **model_files(scenario), "--profile": args.profile})
    costs = _profile_costs(scenario, args)
    with _engine_progress(enabled=not args.json):
        result = simulate(scenario, costs=costs, workload=costs.workload if costs else None)
    files, options = {}, {args.trace: "--trace", args.memory_plot: "--memory-plot"}
    if args.trace:
        labels = {row["rank"]: f"rank {row['rank']} (gpu{row['device']}, node {row['node']})"
                  for row in result.summary["devices"]}
        files[args.trace] = (json.dumps(trace_events(result.spans, labels), indent=1) + "\n").encode()
    if args.memory_plot:
        from simulator.memory_plot import memory_plot_bytes  # matplotlib only when asked
        files[args.memory_plot] = memory_plot_bytes(result, args.memory_plot)
    write_files_atomic(files, options)  # both or neither
    for note in notes:
        print(f"ghpsim: note: {note}", file=sys.stderr)
    if args.json:
        print(result.to_json())
    else:
        print_summary(result)
        if args.trace:
            print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
        if args.memory_plot:
            print(f"memory plot written to {args.memory_plot}")
    return 0


def _unused_setting_notes(scenario, priced_by_profile: bool) -> list[str]:
    """One note per setting the scenario's own plan ignores (`simulator.unused_settings`: a megatron
    degree on another kind, a pipeline setting on dp, a kernel-model input under the roofline, ...):
    it changes nothing, and a user planning from the figures should know. Printed on stderr after a
    successful run, so that bad input still gets its one error line alone."""
    from simulator.model_source import resolve_workload
    from simulator.unused_settings import unused_settings
    from simulator.simulate import naming_source
    with naming_source(scenario):  # a model that cannot be built: the one-line error naming the scenario file
        kinds = frozenset(layer.kind for layer in resolve_workload(scenario.model, scenario.base_dir).layers)
    return unused_settings(scenario, priced_by_profile, kinds)


@contextmanager
def _engine_progress(enabled: bool):
    """A bar on stderr (a terminal only, `simulator.progress`) of the actions each engine run of a
    long simulation has done; it appears once a run has done `engine_progress.PROGRESS_EVERY`."""
    from simulator.engine_progress import reporting_progress
    from simulator.progress import stderr_progress
    with stderr_progress(enabled=enabled) as bar:
        task = bar.add_task("simulating (actions played)", total=None, visible=False)
        with reporting_progress(lambda done, total: bar.update(task, completed=done, total=total, visible=True)):
            yield


def cmd_list(args) -> int:
    from simulator.hardware import GPUS, LINKS
    from simulator.zoo import MODELS, build_model
    if args.json:
        presets = {"gpus": GPUS, "links": LINKS}.get(args.what)
        rows = list(MODELS) if presets is None else [spec.model_dump(mode="json") for spec in presets.values()]
        print(json.dumps(rows, indent=1))
        return 0
    width = max(len(name) for name in {"gpus": GPUS, "links": LINKS, "models": MODELS}[args.what]) + 2
    if args.what == "gpus":
        print(f"{'GPU':{width}s}{'memory':>10s}  {'bandwidth':>9s}  dense peak per dtype (TFLOP/s)")
        for name, gpu in GPUS.items():
            peaks = ", ".join(f"{k} {v / 1e12:,.4g}" for k, v in gpu.peak_flops_per_s.items())
            print(f"{name:{width}s}{gpu.memory_bytes / 2**30:6.0f} GiB  {gpu.memory_bandwidth_bytes_per_s / 1e9:4.0f} GB/s  {peaks}")
    elif args.what == "links":
        print(f"{'link':{width}s}{'bandwidth':>13s}  {'latency':>8s}  kind")
        for name, link in LINKS.items():
            print(f"{name:{width}s}{link.bandwidth_bytes_per_s / 1e9:8.3f} GB/s  {link.latency_s * 1e6:5.1f} us  {link.kind}")
    else:
        print(f"{'model':{width}s}{'parameters':>11s}  {'layers':>6s}  input (the factory's defaults, `model.params` to change)")
        for name in MODELS:
            workload = build_model(name)
            print(f"{name:{width}s}{_count_text(workload.num_params):>11s}  {workload.num_layers:6d}  "
                  f"{_input_text(workload.input_spec)}")
    return 0


def _count_text(count: int) -> str:
    """A parameter count as 0.27 M, 70.55 B."""
    return f"{count / 1e9:,.2f} B" if count >= 1e9 else f"{count / 1e6:,.2f} M"


def _input_text(spec) -> str:
    """One sample of a zoo model: tokens and vocabulary, or the input's shape and classes."""
    shape = "x".join(str(size) for size in spec.get("shape", ()))
    if "vocab_size" in spec:
        return f"{int(spec['shape'][0]):,} tokens, vocabulary {int(spec['vocab_size']):,} ({spec.get('task', 'causal_lm')})"
    return f"{shape} inputs, {spec.get('num_classes', '?')} classes"
