"""The simulation pipeline: scenario -> workload, topology, costs -> plan -> engine -> summary."""

from __future__ import annotations

import gc
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import pandas as pd

from simulator.costs import AnalyticCosts, CostModel, describe_compute_model, single_device_step_s
from simulator.engine_progress import engine
from simulator.errors import ScenarioError, SimulationError
from simulator.fabrics import build_topology
from simulator.flops import flops_summary
from simulator.kernel_ops import accumulation_fused
from simulator.kernel_report import kernel_passes
from simulator.limits import check_simulation_size
from simulator.model_source import resolve_workload
from simulator.plan import Plan
from simulator.records import device_breakdown, makespan_s, span_table, stage_time_split
from simulator.scenario import Scenario
from simulator.steady_extension import (Extension, Unaligned, candidate_periods, extend, extended_plan,
                                         short_microbatches, short_plan, unlike_replicas)
from simulator.strategies import compile_plan
from simulator.topology import Topology
from simulator.workload import Workload


@dataclass
class SimulationResult:
    scenario: Scenario
    workload: Workload
    plan: Plan
    span_records: list[tuple]
    """The step's spans as the engine's tuples (`simulator.engine.SPAN_FIELDS`)."""
    summary: dict
    played_spans: list | None = None
    """The engine's spans of `plan` where `span_records` extends them (`simulator.steady_extension`)."""

    @cached_property
    def spans(self) -> pd.DataFrame:
        """The span table (`simulator.records.span_table`), built when first asked for: a planner
        that reads only summaries never pays for it."""
        return span_table(self.span_records)

    @property
    def step_time_s(self) -> float:
        return self.summary["step_time_s"]

    def to_json(self) -> str:
        return json.dumps(self.summary, indent=2, sort_keys=False)


@contextmanager
def naming_source(scenario: Scenario):
    """Prefix a ScenarioError raised after loading with the scenario's file (one line, as on load)."""
    try:
        yield
    except ScenarioError as error:
        message = str(error)
        if message.startswith(scenario.source):
            raise
        raise ScenarioError(f"{scenario.source}: {message}") from None


def scenario_kernel_parameters(scenario: Scenario):
    """The parameters of the scenario's `costs.kernel_profile` (read once per file and GPU), or None."""
    path = scenario.costs.kernel_profile
    if not path:
        return None
    from simulator.profile_costs import kernel_profile_parameters
    full = Path(scenario.base_dir) / path
    key = (str(full.resolve()), full.stat().st_mtime_ns if full.is_file() else None,
           scenario.cluster.gpu.model_dump_json(), scenario.training.dtype)
    if key not in _KERNEL_PROFILES:
        _KERNEL_PROFILES[key] = kernel_profile_parameters(full, scenario, field="costs.kernel_profile: ")
    return _KERNEL_PROFILES[key]


_KERNEL_PROFILES: dict[tuple, object] = {}


def analytic_costs(scenario: Scenario, workload: Workload) -> CostModel:
    """The scenario's datasheet cost model (`costs.model`): kernel-level for a GPU of a named family
    (or when asked; `kernel_catalogue.kernel_model_chosen`), else the analytic roofline."""
    from simulator.kernel_catalogue import kernel_model_chosen
    from simulator.kernel_costs import KernelCosts
    training, costs, gpu = scenario.training, scenario.costs, scenario.cluster.gpu
    if kernel_model_chosen(costs.model, gpu):
        return KernelCosts.for_scenario(scenario, workload, scenario_kernel_parameters(scenario))
    if costs.kernel_profile:
        raise ScenarioError(f"costs.kernel_profile: {costs.kernel_profile!r} needs the kernel model, which "
                            f"{gpu.name!r} with costs.model {costs.model!r} does not use")
    return AnalyticCosts(workload, gpu, training.dtype, training.optimizer, costs.efficiency,
                         recompute=training.recompute)


@contextmanager
def cyclic_gc_paused():
    """Python's cyclic garbage collector paused (and restored as it was). A simulation builds
    millions of small objects that reference counting frees (links, actions, events, spans), and
    every collection of the oldest generation walks all that are alive: a full GPT-3 step on 1,024
    ranks took 54 s with the collector and 39 s without, at the same peak memory (0.76 GB)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def simulate(scenario: Scenario, costs: CostModel | None = None, workload: Workload | None = None,
             topology: Topology | None = None) -> SimulationResult:
    """Simulate one training step of `scenario` (analytic costs unless `costs` is given; `topology`:
    the scenario's cluster's, already built), with the cyclic collector paused (`cyclic_gc_paused`)."""
    with cyclic_gc_paused():
        return _simulate(scenario, costs, workload, topology)


def _simulate(scenario: Scenario, costs: CostModel | None, workload: Workload | None,
              topology: Topology | None) -> SimulationResult:
    started, chosen = time.perf_counter(), (costs is None, workload is None)
    result, costs = _step(scenario, costs, workload, topology)
    summary = result.summary
    baseline_s, summary["single_device_baseline"] = single_device_baseline(scenario, result.workload, costs,
                                                                           summary["step_time_s"], *chosen)
    summary["single_device_step_s"] = baseline_s
    summary["speedup"] = baseline_s / summary["step_time_s"] if summary["step_time_s"] > 0 else float("inf")
    summary["wall_s"] = time.perf_counter() - started
    return result


def _step(scenario: Scenario, costs: CostModel | None, workload: Workload | None,
          topology: Topology | None) -> tuple[SimulationResult, CostModel]:
    """(the step's result, its summary's speedup still to fill in; the cost model it was played with)."""
    given = costs is not None
    with naming_source(scenario):
        workload = workload or resolve_workload(scenario.model, scenario.base_dir)
        costs = costs or analytic_costs(scenario, workload)
        topology = topology or build_topology(scenario.cluster)
    plan, result, played_spans, steady_note = _play(scenario, workload, topology, costs)
    step_time_s = makespan_s(result.spans)
    summary = _summary(scenario, workload, topology, plan, result, step_time_s, costs, played_spans)
    summary["compute_model"] = describe_compute_model(costs, scenario.costs.model, scenario.cluster.gpu, given,
                                                      scenario.costs.kernel_profile)
    if steady_note:
        summary["steady_state"] = steady_note
    if plan.strategy == "megatron":  # ZeRO-1 memory; a symmetric run expanded to every device
        from simulator.strategies.tensor_summary import finish_summary
        finish_summary(summary, plan, topology)
    elif "symmetry_decision" in plan.meta:  # replicas: folded to replica 0 or not, and why
        from simulator.symmetry import expand_summary
        if "symmetry" in plan.meta:
            expand_summary(summary, plan.rank_to_device, plan.workers_per_group, topology)
        summary["symmetry"] = plan.meta["symmetry_decision"]
    return SimulationResult(scenario, workload, plan, result.spans, summary,
                            None if played_spans is result.spans else played_spans), costs


def single_device_scenario(scenario: Scenario) -> Scenario:
    """The baseline of "speedup": `scenario` on one device of its cluster's GPU (kind dp on a 1 x 1
    cluster, no stragglers nor other node GPUs) with the whole global batch, the same model,
    training and cost settings and the kernel model's `gradient_accumulation_fusion`."""
    from simulator.scenario import ClusterConfig, StrategyConfig
    cluster, strategy = scenario.cluster, scenario.strategy
    alone = ClusterConfig(num_nodes=1, gpus_per_node=1, gpu=cluster.gpu, intra_node_link=cluster.intra_node_link,
                          inter_node_link=cluster.inter_node_link)
    dp = StrategyConfig(kind="dp", gradient_accumulation_fusion=accumulation_fused(
        strategy.gradient_accumulation_fusion, strategy.kind, scenario.training.dtype))
    return scenario.model_copy(update={"cluster": alone, "strategy": dp})


_BASELINES: dict[tuple, tuple[Workload | None, float]] = {}
"""(single-device scenario JSON, its base folder, id of a caller's workload or None) -> (that workload,
step seconds): the runs of a search, a sweep or a fit share their model and batch, so one baseline
serves them all."""
MAX_BASELINES = 1024


def single_device_baseline(scenario: Scenario, workload: Workload, costs: CostModel, step_time_s: float,
                           chosen_costs: bool = False, chosen_workload: bool = False):
    """(single-device step seconds, how it was obtained): a one-GPU cluster's own step (speedup
    exactly 1); else `single_device_scenario` simulated as `simulate` does (`_step`) with the cost
    model the scenario would choose (or the caller's), so the engine's host/device overlap, recompute
    and update count as in the step; where that cannot be simulated, the plain sum of the passes
    (`simulator.costs.single_device_step_s`).
    GPU memory is no reason to fall back: the baseline is a throughput figure. Where the scenario
    chose its cost model (`chosen_costs`), the step is a function of the single-device scenario (and
    of the caller's workload unless `chosen_workload`) and is remembered (`_BASELINES`)."""
    if scenario.num_gpus == 1:
        return step_time_s, "this run (a one-GPU cluster)"
    try:
        alone = single_device_scenario(scenario)
        mine = None if chosen_workload else workload
        same = alone.model_dump_json(exclude={"name", "description"})  # the names differ run by run
        key = (same, alone.base_dir, id(mine)) if chosen_costs else None
        known = _BASELINES.get(key) if key else None
        if known is not None and known[0] is mine:
            seconds = known[1]
        else:
            seconds = _step(alone, None if chosen_costs else costs, workload, None)[0].summary["step_time_s"]
            if key:
                if len(_BASELINES) >= MAX_BASELINES:
                    _BASELINES.clear()
                _BASELINES[key] = (mine, seconds)
    except (ScenarioError, SimulationError) as error:
        batch = scenario.training.global_batch_size
        return single_device_step_s(costs, workload, batch), (
            f"sum of the layers' passes and one update, not simulated ({error})")
    return seconds, f"simulated: kind dp on one {scenario.cluster.gpu.name}, whole batch"


def _play(scenario: Scenario, workload: Workload, topology: Topology, costs: CostModel):
    """(plan, engine result, the spans the plan played, steady-state note): a long synchronous
    pipeline played on a few micro-batches and its verified steady state extended
    (`simulator.steady_extension`: a short play checked with its micro-batch period, then where it
    has not settled longer plays searched for a longer period, each twice the last while it is at
    most half the step), else every micro-batch."""
    note, target = unlike_replicas(scenario), scenario.strategy.num_microbatches
    first = short_microbatches(scenario)
    played = first and _short_play(scenario, workload, topology, costs, first[0])
    if played:
        found, period = _extension(*played, first[0], (first[1],), target)
        if isinstance(found, Extension):
            return _extended(played, found, first[0], target, False)
        note = f"every micro-batch simulated: {found}"
        lengths = []
        longer = short_microbatches(scenario, longer=True)
        while longer:
            lengths.append(longer[0])
            extended = _longer_play(scenario, workload, topology, costs, longer, target)
            if extended is not None:
                return extended
            twice = short_microbatches(scenario, longer=True, at_least=2 * longer[0], doubled=True)
            longer = twice if twice and LONGER_PLAYS_SHARE * twice[0] <= target else None
        if lengths:
            plays = " or ".join(map(str, lengths))
            note += f"; nor has any longer period in a play of {plays} micro-batches"
    with naming_source(scenario):
        plan = compile_plan(scenario, workload, topology, costs)
    result = engine(plan, topology, engine_costs(plan, costs), scenario.strategy.num_parameter_servers).run()
    return plan, result, result.spans, note


LONGER_PLAYS_SHARE = 2
"""A longer play is tried again at twice its length while that is at most 1 / this of the step's
micro-batches. A transient can outlast the first longer play: where one pipeline half is slightly
faster than the other, it catches up one micro-batch's small lead at a time (LLaMA-3 405B, TP 2 x
CP 2 x PP 64 on 256 H100: 1F1B settles after about 500 micro-batches, a play of 656 finds the period, replayed
at 698, extended instead of all 2,048 being played, 62 s instead of 143). Where nothing settles, the
failed plays cost at most about the step once more."""


def _longer_play(scenario, workload, topology, costs, longer: tuple[int, int], target: int):
    """The extended run from a play of longer[0] micro-batches searched for a period (a multiple of
    longer[1]); played again so that whole periods fill the gap where they do not; else None."""
    played = _short_play(scenario, workload, topology, costs, longer[0])
    if not played:
        return None
    found, period = _extension(*played, longer[0], candidate_periods(played[0], played[1].spans, longer[1]), target)
    if isinstance(found, Unaligned):  # the same regime, played so that whole periods fill the gap
        longer = short_microbatches(scenario, longer=True, at_least=longer[0] + (target - longer[0]) % period)
        played = longer and _short_play(scenario, workload, topology, costs, longer[0])
        found, period = _extension(*played, longer[0], (period,), target) if played else (None, 0)
    if isinstance(found, Extension):
        return _extended(played, found, longer[0], target, period != longer[1])
    return None


def _short_play(scenario, workload, topology, costs, short: int):
    """(plan, engine result, count log) of `short` micro-batches, or None where that plan does not
    compile (the step's own plan then names the fault with its own figures)."""
    try:
        plan = short_plan(scenario, short, workload, topology, costs)
    except ScenarioError:
        return None
    decision = plan.meta.get("symmetry_decision", {"used": True})  # refused where the step's plan would be
    with naming_source(scenario):
        check_simulation_size(plan.num_ranks, len(plan.actions[0]) * scenario.strategy.num_microbatches / short,
                              "" if decision["used"] else f" (not folded: {decision['reason']})")
    played = engine(plan, topology, engine_costs(plan, costs), scenario.strategy.num_parameter_servers)
    played.count_log = []
    return plan, played.run(), played.count_log


def _extension(plan, played, count_log, short: int, periods, target: int):
    """(the first `steady_extension.extend` of `periods` that is not a refusal, else the first
    refusal; its period), or (why not, 0) with no period to check."""
    first = None
    for period in periods:
        found = extend(plan, played.spans, count_log, played.tier_bytes, played.collective_algorithms,
                       short, period, target)
        if isinstance(found, (Extension, Unaligned)):
            return found, period
        first = first or (found, period)
    return first or ("no period repeats on the first stage", 0)


def _extended(played, extension: Extension, short: int, target: int, longer_period: bool):
    plan, result, _ = played
    extended = replace(result, spans=extension.spans, tier_bytes=extension.tier_bytes,
                       collective_algorithms=extension.collective_algorithms)
    each = f" of {(target - short) // extension.periods} micro-batches" if longer_period else ""
    note = (f"{short} of {target} micro-batches simulated, {target - short} added as "
            f"{extension.periods} periods{each} of {extension.period_s:.6g} s (verified over 3)")
    return extended_plan(plan, target), extended, result.spans, note


def engine_costs(plan: Plan, costs: CostModel) -> CostModel:
    """The cost model the engine plays `plan` with: `costs`, or under tensor parallelism each rank's
    share of every layer."""
    if "rank_workload" in plan.meta:
        from simulator.strategies.tensor import rank_costs
        tensor = plan.meta["tensor"]
        return rank_costs(costs, plan.meta["rank_workload"], tensor["tp_degree"], tensor["sequence_parallel"])
    return costs


def _placement_entries(played, given) -> dict:
    """The summary's "placement": the order's name as the scenario gives it (`tp_dp_pp` too, which the
    plan resolves to devices: those under "placement_devices"), else the device list."""
    if isinstance(played, str):
        return {"placement": played}
    return {"placement": given, "placement_devices": list(played)} if isinstance(given, str) else {"placement": list(played)}


def _summary(scenario, workload, topology: Topology, plan: Plan, result, step_time_s, costs=None,
             played_spans=None) -> dict:
    played_spans = result.spans if played_spans is None else played_spans
    spans, pipeline = result.spans, None
    if "schedule_kind" in plan.meta:  # pipelines: step time and per-stage figures, simulator/schedules/steady_state.py
        from simulator.schedules.steady_state import pipeline_summary
        spans, step_time_s, pipeline = pipeline_summary(scenario, workload, topology, costs, plan, spans, step_time_s)
    from simulator.memory import memory_config
    from simulator.memory_buffers import node_memory_bytes
    from simulator.sparse import compression_summary
    if "rank_workload" in plan.meta:  # tensor parallelism: each TP rank's share; ranks alike walked once
        from simulator.strategies.tensor_summary import tensor_memory_report
        memory = tensor_memory_report(plan, played_spans, memory_config(scenario))
    else:
        from simulator.strategies.tensor_summary import alike_memory_report
        memory = alike_memory_report(plan, workload, played_spans, memory_config(scenario))
    devices = device_breakdown(spans, plan.num_ranks, step_time_s)
    step_time_s += memory["offload_exposed_s"]  # offloaded activations' host copies not hidden: exposed comm
    for row in devices:
        group, stage = plan.grid_position(row["rank"])
        device = plan.rank_to_device[row["rank"]]
        layers = plan.stages[stage]
        row.update(device=device, node=topology.node_of(device), group=group, stage=stage,
                   layers=[layers.layer_start, layers.layer_end], comm_s=row["comm_s"] + memory["offload_exposed_s"])
    if pipeline is not None:  # bubble: idle waiting for work; exposed communication apart; micro-batches in flight
        from simulator.strategies.pipeline import label_in_flight
        split = stage_time_split(devices, step_time_s)
        for row in pipeline["stages"]:
            row.update(split[row["stage"]])
        label_in_flight(pipeline, plan.meta)
    node_memory = node_memory_bytes(scenario)  # a node of other GPUs: its devices' own capacity
    for row, device_memory in zip(devices, memory.pop("devices")):
        row.update({key: device_memory[key] for key in ("peak_memory_bytes", "memory_breakdown_bytes", "fits_in_memory")})
        if row["node"] in node_memory:
            row["capacity_bytes"] = node_memory[row["node"]]
            row["fits_in_memory"] = row["peak_memory_bytes"] <= row["capacity_bytes"]
    memory["fits_in_memory"] = all(row["fits_in_memory"] for row in devices)
    batch = scenario.training.global_batch_size
    summary = {
        "scenario": scenario.name, "model": workload.name,
        "model_params": int(workload.num_params),
        "strategy": plan.strategy,
        "num_gpus": plan.num_ranks,
        "num_groups": plan.num_groups,
        "workers_per_group": plan.workers_per_group,
        "partition": plan.meta["partition"], "partition_note": plan.meta.get("partition_note"),
        **_placement_entries(plan.meta["placement"], scenario.strategy.placement),
        "global_batch_size": batch,
        "step_time_s": step_time_s,
        "throughput_samples_per_s": batch / step_time_s if step_time_s > 0 else float("inf"),
        "single_device_step_s": None,  # `single_device_baseline`, once the step time is final
        "speedup": None,
        **flops_summary(scenario, workload, step_time_s),
        "bytes_per_tier": {tier: result.tier_bytes.get(tier, 0.0) for tier in ("intra", "inter")},
        "collective_algorithms": result.collective_algorithms,
        "num_events": result.num_events,
        "fits_in_memory": memory["fits_in_memory"],
        "memory": memory,
        "gradient_compression": compression_summary(plan, topology, scenario.cluster.gpu.memory_bandwidth_bytes_per_s),
        "devices": devices,
    }
    if pipeline is not None:
        summary["pipeline"] = pipeline
    passes = kernel_passes(plan, engine_costs(plan, costs)) if costs is not None else None
    if passes is not None:
        summary["kernel_passes"] = passes
    return summary
