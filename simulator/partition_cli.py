"""`ghpsim partition SCENARIO [--workers N] [--profile P] [--json]`: PipeDream's partition of the
scenario's model over N workers (contiguous stages, each replicated), beside plain DP and a plain
pipeline, all on the same cost model (`simulator.pipedream_costs`, `simulator.pipedream_partition`).

Times are per micro-batch of b samples in steady state: b = B / (G m), the scenario's own pass
(m = 1 for dp, mp and ghp; G = N for dp, 1 for mp). Plain DP = one stage of N replicas; plain
pipeline = N stages of one worker each, boundaries from the same dynamic program with replication
fixed to 1. Memory per worker is the partitioner's PipeDream model; only the PipeDream plan must fit
(none fitting is an error), the two others are reported with whether they fit.

With `--profile` (a calibration at world size W), the N workers must be ones the profile timed: N <= W
and N one of its `compute_slowdown` levels (as `simulate --profile` refuses a scenario of more ranks than
the profile's collectives hold), else a one-line error naming --workers and --profile. Its compute fits
are rescaled to N ranks computing at once, compute_slowdown[N] / compute_slowdown[W], also for a profile
of ranks sharing a host's processors: no engine plays them on the host here to add the sharing back.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext

from rich.table import Table

from simulator.errors import ScenarioError, short_path
from simulator.fabrics import build_topology
from simulator.memory_buffers import usable_memory_bytes
from simulator.model_source import resolve_workload
from simulator.pipedream_costs import cluster_stage_costs
from simulator.pipedream_partition import PipeDreamPartition, PipeDreamStage, pipedream_partition
from simulator.scenario import PIPELINE_KINDS, Scenario, load_scenario
from simulator.simulate import analytic_costs, naming_source
from simulator.units import whole

MAX_STEPS = 3e9
"""Largest L^2 N^2 min(N, L) (the dynamic program's work) the command takes on: ResNet-1001's 335
layers on 16 workers (4.6e8) take a few seconds; GPT-3's 98 layers on 1024 workers would take days."""


def run(args) -> int:
    scenario = load_scenario(args.scenario, args.overrides)
    num_workers = scenario.num_gpus if args.workers is None else args.workers
    if not 1 <= num_workers <= scenario.num_gpus:
        raise ScenarioError(f"--workers: {num_workers} must be between 1 and the scenario's {scenario.num_gpus} GPUs")
    if args.profile is not None:
        check_profile_workers(args.profile, num_workers, defaulted=args.workers is None)
    from simulator.tables import make_console
    status = nullcontext() if args.json else make_console().status("partitioning", spinner="dots")
    with naming_source(scenario), status:
        document = partition_document(scenario, num_workers, args.profile)
    if scenario.cluster.heterogeneous:  # PipeDream's optimizer prices one kind of worker, from one profile
        document["note"] = ("the partition assumes identical workers, as PipeDream's optimizer does: the cluster's "
                            "stragglers, mixed GPUs and degraded links are not used (simulate and compare play them)")
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        print_partition(document)
    return 0


def microbatch_size(scenario: Scenario) -> float:
    """b = B / (G m): the samples of one pass in the scenario's own strategy (module docstring)."""
    strategy = scenario.strategy
    if strategy.kind == "megatron":
        groups = scenario.num_gpus // (strategy.tp_degree * strategy.pp_degree)
    else:
        groups = scenario.grid()[0]
    microbatches = strategy.num_microbatches if strategy.kind in PIPELINE_KINDS + ("megatron",) else 1
    batch = scenario.training.global_batch_size
    if batch % (groups * microbatches):
        raise ScenarioError(f"training.global_batch_size: {batch} is not divisible by the {groups} groups x "
                            f"{microbatches} micro-batches (a pass of whole samples)")
    return batch / (groups * microbatches)


def partition_document(scenario: Scenario, num_workers: int, profile_path: str | None = None) -> dict:
    """The PipeDream partition, plain DP and plain pipeline as a JSON-ready dict."""
    workload = resolve_workload(scenario.model, scenario.base_dir)
    steps = workload.num_layers ** 2 * num_workers ** 2 * min(num_workers, workload.num_layers)
    if steps > MAX_STEPS:
        raise ScenarioError(f"--workers: PipeDream's dynamic program over {workload.num_layers} layers and "
                            f"{num_workers} workers takes ~{steps:.1e} steps (limit {MAX_STEPS:.0e}); "
                            "use fewer workers")
    if profile_path is None:
        costs = analytic_costs(scenario, workload)
    else:
        costs = profile_costs_for_workers(profile_path, scenario, workload, num_workers)
    batch, training = microbatch_size(scenario), scenario.training
    inputs = cluster_stage_costs(workload, costs, build_topology(scenario.cluster, scenario.base_dir), num_workers,
                                 batch=batch, dtype=training.dtype, optimizer=training.optimizer,
                                 recompute=training.recompute, flash_attention=scenario.costs.flash_attention)
    memory = usable_memory_bytes(scenario)
    best = pipedream_partition(inputs, num_workers, memory)
    plain_dp = PipeDreamPartition((PipeDreamStage(0, workload.num_layers, num_workers,
                                                  inputs.time_s(0, workload.num_layers, num_workers),
                                                  inputs.memory_bytes(0, workload.num_layers, 1)),))
    plain_pipeline = None
    if num_workers <= workload.num_layers:
        plain_pipeline = pipedream_partition(inputs, num_workers, math.inf, replicas=1)
    return {"scenario": scenario.name, "model": workload.name, "num_layers": workload.num_layers,
            "num_workers": num_workers, "microbatch_size": whole(batch), "device_memory_bytes": memory,
            "costs": profile_path or "datasheet", "pipedream": _plan(best, batch, memory),
            "plain_dp": _plan(plain_dp, batch, memory),
            "plain_pipeline": None if plain_pipeline is None else _plan(plain_pipeline, batch, memory)}


def check_profile_workers(profile_path: str, num_workers: int, defaulted: bool) -> None:
    """A one-line ScenarioError naming --workers and --profile unless the calibration profile timed
    `num_workers` ranks computing at once (module docstring); a kernel profile times kernels, not
    ranks, and has no world size to check."""
    from simulator.profile import Profile, load_profile
    profile = load_profile(profile_path)
    if not isinstance(profile, Profile):
        return
    world_size, levels = profile.world_size, sorted({1, *profile.compute_slowdown})
    default = " (the default: the scenario's GPU count)" if defaulted else ""
    workers, named = f"--workers: {num_workers} workers{default}", short_path(profile_path)  # the remedy kept
    if num_workers > world_size:
        raise ScenarioError(f"{workers}, but --profile {named} was calibrated at world size {world_size} "
                            f"(it timed no more ranks at once); give --workers {world_size} or fewer, or calibrate "
                            f"at world size {num_workers}")
    if num_workers not in levels:
        raise ScenarioError(f"{workers}, but --profile {named} (world size {world_size}) timed compute "
                            f"with {', '.join(map(str, levels))} ranks at once only; give one of those")


def profile_costs_for_workers(profile_path: str, scenario, workload, num_workers: int):
    """A kernel profile's kernel model for the scenario's GPU, as `simulate --profile` takes it; a
    calibration profile's costs with compute rescaled to `num_workers` ranks at once (module
    docstring; `check_profile_workers` first for the option's error)."""
    from simulator.profile_costs import ProfileCosts, scenario_profile_costs
    costs = scenario_profile_costs(profile_path, scenario, workload)
    if isinstance(costs, ProfileCosts):
        costs.scale = costs.slowdown(num_workers) / costs.slowdown(costs.profile.world_size)
    return costs


def _plan(partition: PipeDreamPartition, batch: float, memory_bytes: float) -> dict:
    stages = [{"stage": index, "layer_start": stage.layer_start, "layer_end": stage.layer_end,
               "num_replicas": stage.num_replicas, "time_s": stage.time_s, "memory_bytes": stage.memory_bytes,
               "fits_in_memory": stage.memory_bytes <= memory_bytes} for index, stage in enumerate(partition.stages)]
    time_s = partition.slowest_stage_s
    return {"stages": stages, "time_per_microbatch_s": time_s,
            "throughput_samples_per_s": batch / time_s if time_s > 0 else math.inf,
            "peak_memory_bytes": max(stage["memory_bytes"] for stage in stages),
            "fits_in_memory": all(stage["fits_in_memory"] for stage in stages)}


def print_partition(document: dict) -> None:
    from simulator.tables import make_console
    console = make_console()
    table = Table(title=f"{document['scenario']}: PipeDream partition of {document['model']} "
                        f"({document['num_layers']} layers) over {document['num_workers']} workers, "
                        f"micro-batch {document['microbatch_size']:g} samples, costs: {document['costs']}")
    for column in ("stage", "layers [a, b)", "replicas", "time / micro-batch (ms)", "memory (GiB)", "fits"):
        table.add_column(column, justify="left" if column == "layers [a, b)" else "right")
    for stage in document["pipedream"]["stages"]:
        table.add_row(str(stage["stage"]), f"[{stage['layer_start']}, {stage['layer_end']})",
                      str(stage["num_replicas"]), f"{stage['time_s'] * 1e3:.3f}",
                      f"{stage['memory_bytes'] / 2**30:,.2f}", _yes(stage["fits_in_memory"]))
    console.print(table)
    plans = Table(title=f"time per micro-batch, steady state (device memory "
                        f"{document['device_memory_bytes'] / 2**30:,.1f} GiB)",
                  caption="PipeDream's objective: the slowest stage's compute, transfers and whole allreduce, "
                          "no overlap, no optimizer step; `ghpsim simulate` plays a plan in full")
    for column in ("plan", "stages x replicas", "time / micro-batch (ms)", "samples/s", "peak memory (GiB)", "fits"):
        plans.add_column(column, justify="left" if column in ("plan", "stages x replicas") else "right")
    for label, key in (("pipedream", "pipedream"), ("plain DP", "plain_dp"), ("plain pipeline", "plain_pipeline")):
        plan = document[key]
        if plan is None:
            plans.add_row(label, "-", "more workers than layers", "-", "-", "-")
            continue
        replicas = [stage["num_replicas"] for stage in plan["stages"]]
        shape = f"{len(replicas)} x {replicas[0]}" if len(set(replicas)) == 1 else " + ".join(map(str, replicas))
        plans.add_row(label, shape, f"{plan['time_per_microbatch_s'] * 1e3:.3f}",
                      f"{plan['throughput_samples_per_s']:,.1f}", f"{plan['peak_memory_bytes'] / 2**30:,.2f}",
                      _yes(plan["fits_in_memory"]))
    console.print(plans)
    if document.get("note"):
        console.print(f"note: {document['note']}")


def _yes(fits: bool) -> str:
    return "yes" if fits else "[red]NO[/red]"

