"""Predicted vs measured: simulate each plan with a calibration profile, run the same plan for
real, and report the error per strategy (megatron plans with tp = pp = 1, sharded data parallelism:
also peak memory per rank, `validator.fsdp_runtime`).

The prediction (`predicted_s`) is the plain simulation of the plan with the profile's costs
(`simulator.profile_costs.ProfileCosts`). The profile comes from microbenchmarks only
(`validator.calibrate`); these plan runs are never fed back into it: they are the held-out test of
the prediction. The plans run at the profile's world size: a scenario whose cluster has another
number of ranks is resized to it (`simulator.planner.scenario_for_gpus`), and `progress` says so.
"""

from __future__ import annotations

import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import pandas as pd

from simulator.compare import MEGATRON, _feasible_groups, resolve_specs, with_strategy
from simulator.grid_symmetry import every_rank
from simulator.limits import available_memory_bytes
from simulator.spans import SPAN_FIELDS
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.planner import scenario_for_gpus
from simulator.profile import Profile
from simulator.profile_costs import check_measured_collectives, profile_costs
from simulator.records import device_breakdown
from simulator.scenario import Scenario, scenario_from_dict
from simulator.schedules.steady_state import steady_state_plan, steady_state_window
from simulator.simulate import simulate
from simulator.fabrics import build_topology
from validator.comm_device import device_problem
from validator.fsdp_runtime import runnable_sharding, sharding_of
from validator.launch import LaunchConfig, spawn
from validator.measure import RunOptions, run_rank
from validator.models import as_built, as_built_note, check_torch_specs, model_field
from validator.report import json_ready


@dataclass
class _Case:
    """One strategy: its plan as simulated and the launches of it measured so far."""
    kind: str
    label: str
    plan: object
    run_options: RunOptions
    predicted: object
    launches: list = field(default_factory=list)  # per launch: the ranks' results


def validate(scenario: Scenario, profile_path: str, specs: list[tuple[str, int | None]],
             options: RunOptions = RunOptions(), launch_timeout_s: float = 300.0, progress=None,
             on_case=None, repeats: int = 1, on_step_spans=None, skip_unfit_ghp: bool = False) -> dict:
    """Returns {"rows": [...], "measured_spans": {label: spans}, "simulated": {label: SimulationResult}}.

    Each strategy is launched `repeats` times, in rounds (every strategy once per round, in turn),
    so that the strategies compared see the same spells of a shared machine's speed; its measured
    figure is the median over the steps of all its launches. The ranks train with
    `options.optimizer`, which must be the profile's. `on_case(row, spans, predicted)` is called
    for every strategy after every round with its row so far (same `strategy` label: the caller
    replaces the earlier one), so a caller can keep what an interrupted validation measured (the
    benchmarks do, and `ghpsim validate` after a failed rank: `validator.validate_output`). With
    `options.keep_step_spans`, `on_step_spans(label, table)` is called after every launch with
    every measured step of the strategy's launches so far (`step_span_table`). A `ghp` without G
    is resolved as `ghpsim compare` does (`prepare_cases`)."""
    if repeats < 1:
        raise ScenarioError(f"repeats: {repeats} must be at least 1")
    check_run_options(options.steps, options.warmup, launch_timeout_s)
    if MEGATRON in _kinds(specs) and scenario.strategy.kind != MEGATRON:  # compare's conversion needs tp or pp > 1
        raise ScenarioError(f"--strategies megatron: {scenario.source} is kind {scenario.strategy.kind}; validate "
                            "runs megatron with tp = pp = 1 (DDP, or FSDP2 by strategy.zero_stage): add "
                            "--set strategy.kind=megatron")
    if scenario.training.fp8_recipe is not None:  # plain torch ranks: no Transformer Engine
        raise ScenarioError(f"training.fp8_recipe: {scenario.training.fp8_recipe}; the validator's ranks train "
                            "without FP8 (plain torch, no Transformer Engine): drop it to validate")
    declared = resolve_workload(scenario.model, scenario.base_dir)
    workload = as_built(declared)  # predicted as the ranks run it
    check_torch_specs(workload, model_field(scenario.model))  # the ranks build it: refused before any starts
    costs = profile_costs(profile_path, workload, optimizer=options.optimizer)
    check_measured_collectives(scenario, profile_path)
    profile = costs.profile
    notes: list[str] = [note for note in (as_built_note(declared),) if note]  # said once every case is prepared
    resized = at_profile_world_size(scenario, profile, notes.append, _kinds(specs))
    options = replace(options, device=profile.device.kind)  # run where the profile was measured
    with _said_resized(scenario, resized):
        cases = prepare_cases(resized, workload, costs, specs, options, notes.append, skip_unfit_ghp)
    scenario = resized
    notes += fsdp_profile_notes(cases, profile, profile_path)
    labels = [case.label for case in cases]
    if len(set(labels)) < len(labels):  # e.g. ghp and ghp:2 where a bare ghp takes G = 2
        twice = next(label for label in labels if labels.count(label) > 1)
        raise ScenarioError(f"--strategies: two of them run the same plan {twice} (give it once)")
    _check_devices(options.device, profile.backend, profile.world_size, profile_path)
    check_host_memory(scenario, cases, options.device)
    for note in notes if progress else ():
        progress(note)
    rows: list[dict | None] = [None] * len(cases)
    measured_spans: dict[str, list] = {}
    for round_index in range(repeats):
        for position, case in enumerate(cases):
            if progress:
                suffix = f" (round {round_index + 1} of {repeats})" if repeats > 1 else ""
                progress(f"running {case.label} on {case.plan.num_ranks} ranks{suffix}")
            config = LaunchConfig(world_size=case.plan.num_ranks, backend=profile.backend, device=options.device,
                                  timeout_s=launch_timeout_s, timeout_option="--timeout")
            case.launches.append(spawn(run_rank, (case.plan, workload, case.run_options), config))
            rows[position], measured_spans[case.label] = _row(case)
            if options.keep_step_spans and on_step_spans is not None:
                on_step_spans(case.label, step_span_table(case.launches))
            if on_case is not None:
                on_case(rows[position], measured_spans[case.label], case.predicted)
    return {"rows": rows, "measured_spans": measured_spans,
            "simulated": {case.label: case.predicted for case in cases}}


MAX_RUN_STEPS = 10_000
"""Most measured (--steps) or warm-up (--warmup) steps of one launch: the median settles long before."""


def check_run_options(steps: int, warmup: int, timeout_s: float) -> None:
    """ScenarioError naming the option unless 1 <= steps <= MAX_RUN_STEPS, 0 <= warmup <=
    MAX_RUN_STEPS and 0 < timeout_s < inf (a NaN fails it too; --timeout 1e400 reads as inf)."""
    if not 1 <= steps <= MAX_RUN_STEPS:
        raise ScenarioError(f"--steps: {steps} must be from 1 to {MAX_RUN_STEPS:,} (the measured steps)")
    if not 0 <= warmup <= MAX_RUN_STEPS:
        raise ScenarioError(f"--warmup: {warmup} must be from 0 to {MAX_RUN_STEPS:,}")
    if not 0 < timeout_s < math.inf:
        raise ScenarioError(f"--timeout: {timeout_s} must be a finite positive number of seconds")


def at_profile_world_size(scenario: Scenario, profile: Profile, progress=None, kinds: tuple[str, ...] = ()) -> Scenario:
    """`scenario` on the profile's world size W: unchanged when its cluster has W ranks, else
    resized (`scenario_for_gpus`: one node of W, or W / gpus_per_node nodes), saying so through
    `progress`; a one-line ScenarioError naming both sizes where it cannot be. A resize drops the
    scenario's megatron degrees, so where `kinds` (the strategies validated) holds megatron, a
    megatron scenario's degree other than 1 is refused in one line instead of run as 1."""
    world_size, ranks = profile.world_size, scenario.num_gpus
    if ranks == world_size:
        return scenario
    shape = f"{scenario.cluster.num_nodes} x {scenario.cluster.gpus_per_node}"
    strategy = scenario.strategy
    if MEGATRON in kinds and strategy.kind == MEGATRON:
        runnable_sharding(strategy.tp_degree, strategy.pp_degree, 1, "full_shard", strategy.cp_degree)
        if strategy.ep_degree != 1:
            raise ScenarioError(f"strategy.ep_degree: {strategy.ep_degree} is set for the scenario's {ranks} ranks "
                                f"and does not carry over to the profile's world size {world_size}; calibrate "
                                f"at world size {ranks}")
    try:
        resized = scenario_for_gpus(scenario, world_size)
    except ScenarioError:
        raise ScenarioError(f"{profile.source}: world_size: the profile was calibrated at world size {world_size}, "
                            f"the scenario's cluster has {ranks} ranks ({shape} GPUs per node); calibrate at "
                            f"world size {ranks}") from None
    if progress:
        progress(f"validating at the profile's world size {world_size}: the scenario's cluster of {ranks} ranks "
                 f"({shape}) runs as {resized.cluster.num_nodes} x {resized.cluster.gpus_per_node}")
    return resized


def _kinds(specs: list[tuple[str, int | None]]) -> tuple[str, ...]:
    """The strategy kinds of `--strategies` specs (`1f1b:4` is 1f1b)."""
    return tuple(kind.partition(":")[0] for kind, _ in specs)


def step_span_table(launches: list[list[dict]]) -> pd.DataFrame:
    """Every measured step of a strategy's launches as one table: launch and step (0-based, warm-up
    excluded) beside the span fields (`simulator.engine.SPAN_FIELDS`, times from the step's start) and
    `duration_s`, and `cpu_s`: the CPU time of the rank's main thread inside each compute span
    (`time.thread_time`; on a CPU host the pass's own work, so `duration_s - cpu_s` is time the rank
    waited for a core; with CUDA only the launches' host time; NaN for other spans and runtimes that
    do not time it); from ranks run with `RunOptions.keep_step_spans`."""
    records = [(launch_index, step_index, *span, cpu_s)
               for launch_index, results in enumerate(launches)
               for result in results
               for step_index, span, cpu_s in _step_records(result)]
    table = pd.DataFrame(records, columns=["launch", "step", *SPAN_FIELDS, "cpu_s"])
    table.insert(len(table.columns) - 1, "duration_s", table["end_s"] - table["start_s"])
    return table.sort_values(["launch", "step", "rank", "start_s"], kind="stable").reset_index(drop=True)


def _step_records(result: dict):
    """(step index, span, its main-thread CPU seconds or NaN) of one rank's kept steps."""
    spans_per_step = result.get("step_spans", ())
    cpu_per_step = result.get("step_span_cpu_s") or [{}] * len(spans_per_step)
    for step_index, (spans, cpu_s) in enumerate(zip(spans_per_step, cpu_per_step)):
        for index, span in enumerate(spans):
            yield step_index, span, cpu_s.get(index, math.nan)


def check_host_memory(scenario: Scenario, cases: list[_Case], device: str) -> None:
    """ScenarioError naming training.global_batch_size when the CPU ranks of a case, all on this
    host, would need more memory than it has available: the simulator's peak memory per rank
    (`peak_memory_bytes`, summed over the ranks), checked before any launch instead of a rank
    killed for running out of memory."""
    if device != "cpu":
        return
    available = available_memory_bytes()
    for case in cases:
        per_rank = [row["peak_memory_bytes"] for row in case.predicted.summary["devices"]]
        if sum(per_rank) > available:
            raise ScenarioError(
                f"training.global_batch_size {scenario.training.global_batch_size}: {case.label} needs ~"
                f"{sum(per_rank) / 2**30:.1f} GiB on this host ({len(per_rank)} ranks, up to "
                f"{max(per_rank) / 2**30:.1f} GiB each, the simulator's peak memory), more than the "
                f"{available / 2**30:.1f} GiB available; use a smaller batch or model")


def _check_devices(device: str, backend: str, num_ranks: int, profile_path) -> None:
    """The profile's device and backend must be usable here (`validator.comm_device.device_problem`)."""
    problem = device_problem(device, backend, num_ranks)
    if problem:
        raise ScenarioError(f"{profile_path}: device.kind / backend ({device}, {backend}): {problem}")


def predictions(scenario: Scenario, profile_path: str, specs: list[tuple[str, int | None]],
                options: RunOptions = RunOptions(), skip_unfit_ghp: bool = False) -> dict[str, float]:
    """Each strategy's predicted step time with `profile_path`, made as `validate` makes it, without
    running anything: {label: predicted_s}."""
    workload = as_built(resolve_workload(scenario.model, scenario.base_dir))
    costs = profile_costs(profile_path, workload, optimizer=options.optimizer)
    check_measured_collectives(scenario, profile_path)
    resized = at_profile_world_size(scenario, costs.profile, kinds=_kinds(specs))
    with _said_resized(scenario, resized):
        cases = prepare_cases(resized, workload, costs, specs, options, skip_unfit_ghp=skip_unfit_ghp)
    return {case.label: case.predicted.step_time_s for case in cases}


@contextmanager
def _said_resized(scenario: Scenario, resized: Scenario):
    """A plan refused at the profile's world size says that size, when the scenario has another."""
    try:
        yield
    except ScenarioError as error:
        if resized.num_gpus == scenario.num_gpus:
            raise
        raise ScenarioError(f"{error} (at the profile's world size {resized.num_gpus}; the scenario has "
                            f"{scenario.num_gpus} ranks)") from None


def predicted_as_run(scenario: Scenario, profile_path: str, spec: tuple[str, int | None], partition,
                     options: RunOptions = RunOptions()) -> float:
    """A committed row's predicted step time, with the partition its run played where the row records
    one (its `partition` column: layers per stage, e.g. "4 3"): the measurement is of that split,
    whichever a later partitioner would choose."""
    if isinstance(partition, str) and partition.strip():
        raw = scenario.model_dump(mode="python")
        raw["strategy"]["partition"] = [int(count) for count in partition.split()]
        scenario = scenario_from_dict(raw, origin=scenario.source, base_dir=scenario.base_dir)
    (figure,) = predictions(scenario, profile_path, [spec], options).values()
    return figure


def prepare_cases(scenario: Scenario, workload, costs, specs: list[tuple[str, int | None]], options: RunOptions,
                  progress=None, skip_unfit_ghp: bool = False) -> list[_Case]:
    """Every spec's case (`prepare_case`), resolved as `ghpsim compare` resolves it
    (`simulator.compare.resolve_specs`: a pipeline item of the scenario's own kind keeps its
    replicas); a `ghp` without G: the scenario's G where its kind is ghp, else the G of the fastest
    prediction among the feasible ones (1 < G < N, G divides the batch, N / G <= the layers). Where
    no G is feasible: a one-line ScenarioError, or with `skip_unfit_ghp` (the default strategy
    list) the spec is left out, saying so through `progress`."""
    cases = []
    for _item, kind, groups in resolve_specs(scenario, specs):  # as compare: two items of one plan refused
        if kind != "ghp" or groups is not None:
            cases.append(prepare_case(scenario, workload, costs, kind, groups, options))
        elif scenario.strategy.kind == "ghp":
            cases.append(prepare_case(scenario, workload, costs, kind, scenario.strategy.num_groups, options))
        elif feasible := _feasible_groups(scenario, workload.num_layers):
            candidates = [prepare_case(scenario, workload, costs, kind, g, options) for g in feasible]
            cases.append(min(candidates, key=lambda case: case.predicted.step_time_s))
        else:
            ranks = scenario.num_gpus
            reason = (f"no G with 1 < G < {ranks} fits {ranks} ranks (G must divide the batch "
                      f"{scenario.training.global_batch_size} and {ranks} / G be at most {workload.num_layers} layers)")
            if not skip_unfit_ghp:
                raise ScenarioError(f"--strategies: ghp: {reason}")
            if progress:
                progress(f"ghp left out of the default strategies: {reason}")
    return cases


def prepare_case(scenario: Scenario, workload, costs, kind: str, groups: int | None, options: RunOptions) -> _Case:
    """One strategy of a validation: its prediction, the plan the ranks run (the steady-state plan
    for asynchronous pipelines) and the run options for it."""
    variant = every_rank(with_strategy(scenario, kind, groups))  # every rank runs for real
    sharding = None
    if kind == "megatron":  # tp = pp = 1 only (validator.fsdp_runtime): refused in one line before simulating
        strategy = variant.strategy
        sharding = runnable_sharding(strategy.tp_degree, strategy.pp_degree, strategy.zero_stage,
                                     strategy.fsdp_sharding, strategy.cp_degree)
        if strategy.fsdp_reduce_dtype not in (None, "fp32"):
            raise ScenarioError(f"strategy.fsdp_reduce_dtype: {strategy.fsdp_reduce_dtype}; the validator's FSDP2 "
                                "ranks train and reduce in fp32 (validator/fsdp_runtime.py)")
        if strategy.fsdp_version == 1:
            raise ScenarioError("strategy.fsdp_version: 1; the validator's ranks run FSDP2 (`fully_shard`, "
                                "validator/fsdp_runtime.py): give 2 or leave it out")
        if strategy.fsdp_sharding is None:  # predict the FSDP strategy that runs (zero_stage 2: SHARD_GRAD_OP)
            variant = variant.model_copy(update={"strategy": strategy.model_copy(update={"fsdp_sharding": sharding})})
    predicted = simulate(variant, costs=costs, workload=workload)
    plan, run_options = predicted.plan, options
    if plan.meta.get("topk") and "schedule_kind" in plan.meta:
        raise ScenarioError(f"strategy.gradient_compression: topk runs for real only with dp or ghp, "
                            f"not {plan.strategy}")
    if kind.partition(":")[0] == "spectrain" and options.optimizer != "momentum":  # before any rank starts
        raise ScenarioError(f"training.optimizer: spectrain predicts weights from the momentum buffer; its ranks "
                            f"need 'momentum', got {options.optimizer!r}")
    if plan.meta.get("asynchronous"):  # run the steady-state plan and time the window predicted
        plan = steady_state_plan(variant, workload, build_topology(variant.cluster), costs)
        run_options = replace(options, steady_state=(plan.workers_per_group,
                                                     variant.strategy.num_microbatches))
    if sharding is not None:  # sharded data parallelism: the ranks also measure their peak memory
        label = f"megatron:{sharding} (G={plan.meta['tensor']['dp_degree']} x M=1)"
        return _Case(kind, label, plan, replace(options, measure_memory=True), predicted)
    label = f"{kind} (G={plan.num_groups} x M={plan.workers_per_group})"
    return _Case(kind, label, plan, run_options, predicted)


def fsdp_profile_notes(cases: list[_Case], profile, profile_path) -> list[str]:
    """A note where FSDP2 plans run on a profile calibrated without `--fsdp`: their host work per
    collective (`validator.fsdp_bench`) is left out of the prediction."""
    fsdp = [case.label for case in cases if case.kind == "megatron" and sharding_of(case.plan) != "no_shard"]
    if not fsdp or profile.fsdp is not None:
        return []
    return [f"{profile_path}: no fsdp section, so {', '.join(fsdp)} is predicted without FSDP2's host work per "
            "collective; calibrate with --fsdp to count it"]


def _row(case: _Case) -> tuple[dict, list]:
    """The strategy's row over its launches so far, and the spans of the launch closest to it."""
    launch_steps = [results[0]["step_times_s"] for results in case.launches]
    step_times = [step for steps in launch_steps for step in steps]
    measured_s = statistics.median(step_times)
    launch_medians = [statistics.median(steps) for steps in launch_steps]
    closest = min(range(len(launch_medians)), key=lambda i: abs(launch_medians[i] - measured_s))
    spans = [span for result in case.launches[closest] for span in result["spans"]]
    if case.run_options.steady_state is not None:
        spans = steady_state_window(spans, *case.run_options.steady_state)[0]
    predicted = case.predicted
    return json_ready({  # a figure not measured (the noise of one launch) is None: null in --json, empty in the CSV
        "strategy": case.label,
        "kind": case.kind,
        "num_groups": case.plan.num_groups,
        "workers_per_group": case.plan.workers_per_group,
        "world_size": case.plan.num_ranks,
        "partition": " ".join(str(count) for count in case.plan.meta.get("partition", ())),
        "predicted_s": predicted.step_time_s,
        "measured_s": measured_s,
        "error_pct": 100.0 * (predicted.step_time_s - measured_s) / measured_s,
        "measured_min_s": min(step_times),
        "measured_max_s": max(step_times),
        "launches": len(launch_medians),
        "launch_median_min_s": min(launch_medians),
        "launch_median_max_s": max(launch_medians),
        "launch_spread_pct": 100.0 * (max(launch_medians) - min(launch_medians)) / measured_s,
        "launch_noise_pct": launch_noise_pct(launch_medians, measured_s),
        "predicted_compute_s": _mean(predicted.summary["devices"], "compute_s"),
        "measured_compute_s": _mean(device_breakdown(spans, case.plan.num_ranks, measured_s), "compute_s"),
        **(_memory_columns(case) if case.run_options.measure_memory else {}),
    }), spans


def _memory_columns(case: _Case) -> dict:
    """Predicted and measured peak memory per rank (the largest over ranks, of the latest launch)
    and the error in percent."""
    predicted = max(device["peak_memory_bytes"] for device in case.predicted.summary["devices"])
    measured = max(result["peak_memory_bytes"] for result in case.launches[-1])
    return {"predicted_peak_memory_bytes": predicted, "measured_peak_memory_bytes": measured,
            "memory_error_pct": 100.0 * (predicted - measured) / measured,
            "measured_persistent_bytes": max(result["persistent_bytes"] for result in case.launches[-1])}


def memory_line(row: dict) -> str | None:
    """A case's peak memory per rank, predicted vs measured, in one line (None where not measured)."""
    if "measured_peak_memory_bytes" not in row:
        return None
    return (f"{'peak memory per rank':>22s}  predicted {row['predicted_peak_memory_bytes'] / 2**20:9.2f} MiB  "
            f"measured {row['measured_peak_memory_bytes'] / 2**20:8.2f} MiB  error {row['memory_error_pct']:+6.1f} %")


def launch_noise_pct(launch_medians: list[float], measured_s: float) -> float:
    """Standard error of a case's measured figure from the scatter of its launches, in percent of it:
    100 x stdev(launch medians) / sqrt(launches) / measured_s (the standard error of a mean; the
    figure is a median over all steps, which sits as close). NaN with one launch (a row holds None). On this project's
    2-core host one launch's median scatters by 13-22 % (coefficient of variation over 21-25 launches
    of one case, uncorrelated with a reference kernel timed around it); with 8 launches the
    benchmarks' cases kept a median standard error of 3.2-3.9 % (max 7.8 %)."""
    if len(launch_medians) < 2:
        return float("nan")
    return 100.0 * statistics.stdev(launch_medians) / len(launch_medians) ** 0.5 / measured_s


def _mean(devices: list[dict], key: str) -> float:
    return sum(row[key] for row in devices) / len(devices)
