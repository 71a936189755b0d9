"""Layout search for `ghpsim rank`: every parallel layout of a scenario on N GPUs, best-first.

The space: megatron layouts t x c x p x d = N (t <= GPUs per node and dividing the attention heads,
p <= layers, d replicas) x micro-batch size b (m = B / (d b) micro-batches) x interleaving v (m a
multiple of p) x recompute (none, selective, full: `training.recompute`; selective not where it equals
none, `searched_recompute_modes`) x ZeRO stage (0, 1 with
d c > 1; 2 and 3, ZeRO-3 = FSDP full shard, with d > 1, p = 1 and c = 1: DeepSpeed refuses them with
pipelines) x sequence parallelism (t > 1) x placement (Megatron's tp-cp-pp-dp order, or tp-cp-dp-pp:
a stage's replicas side by side) x, for a mixture-of-experts model, expert parallelism e (the
divisors of d that divide the experts; with e > 1 ZeRO 0 or 1 and, with t > 1, sequence
parallelism, as `simulator.strategies.experts` requires), plus the planner's dp / mp / ghp /
pipeline candidates (`simulator.planner.enumerate_candidates`).

Context parallelism c (`strategy.cp_degree`, `simulator.strategies.context`), searched when the
scenario sets cp_degree > 1 (a long-context run; it multiplies the space): c = 1, and for a model
with attention layers each power of two c whose t c ranks divide the GPUs per node (Megatron's rank
order puts such a CP group inside a node) or, up to the scenario's c, fill whole nodes (a CP group
across nodes at the same local ranks, as the scenario's own layout may be: Llama 3 runs CP 16 so),
that splits every attention layer's sequence into 2 c chunks, with
ZeRO 0 / 1 and no expert parallelism (the simulator refuses the rest), and only with b < c: a CP
rank then runs b / c < 1 sequence of each micro-batch, which no c = 1 layout can. With b >= c the
layout (t, c, b, d) is the c = 1 layout (t, 1, b / c, d c) plus the ring K/V transfers: the same
work, activations and weights per rank, the same m and the same d c ranks reducing each gradient;
only the rank order differs (a stage's c ranks side by side, between the two searched orders), so
this rule can miss a layout that wins by its placement alone. A layout that would simulate every
rank for too many passes (a CP run that does not fold, an asynchronous pipeline) is listed in
`skipped` with the reason (`simulator.search_gates`), checked when its turn to be simulated comes
(the fold check costs about a second at 16,384 GPUs, so layouts the bound drops are not checked).

Each candidate gets a memory floor and a lower bound on its step time (`simulator.step_bound`);
those whose floor exceeds the device memory are dropped (they cannot fit). The rest are taken in
order of their bound: each is checked against the memory model on its compiled plan
(`exact_peak_memory_bytes`, no engine) and, if it fits, simulated. The search stops when the next
bound exceeds the K-th best simulated time of the candidates that fit: none left can enter the
top K (branch and bound). Candidates without a bound (asynchronous kinds) are simulated unless skipped.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field

from simulator.errors import ScenarioError, SimulationError
from simulator.fabrics import cached_topology
from simulator.kernel_catalogue import kernel_model_chosen
from simulator.memory_buffers import usable_memory_bytes
from simulator.memory_activations import is_block
from simulator.planner import (MEGATRON, MEMORY_MODEL, Candidate, Ranking, _row, _workload, candidate_scenario,
                               enumerate_candidates, scenario_for_gpus, simulate_candidate)
from simulator.scenario import Scenario, scenario_from_dict
from simulator.rank_reasons import explain, lost_to, time_parts
from simulator.search_gates import unfolded_refusal
from simulator.search_bounds import screen_all
from simulator.strategies.context import attention_specs
from simulator.worker_pool import quiet_pool, stop_pool

MICROBATCH_SIZES = (1, 2, 4, 8)
SEARCH_VIRTUAL_STAGES = (1, 2, 4)
RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
"""The schema's `strategy.zero_stage` values (`simulator.scenario.StrategyConfig`)."""
MEGATRON_ORDERS = ("group_per_node", "tp_dp_pp")
SYNCHRONOUS_DEFAULT = ("dp", "mp", "ghp", "gpipe", "1f1b", "interleaved_1f1b")
EXACT_CHECK_FRACTION = 0.9
"""A candidate whose memory floor is at least this share of the device memory has its exact peak
checked on its plan before it is simulated (the check costs a plan compile, the simulation more);
below it the simulation's own memory figure decides, which is the same model."""


@dataclass
class SearchStats:
    enumerated: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    simulated: int = 0
    skipped: int = 0
    seconds: dict = field(default_factory=lambda: dict.fromkeys(("enumerate", "memory", "bound", "simulate"), 0.0))
    """Wall seconds of each phase: the screening's split between memory and bound as its workers' time
    was; simulate includes the simulated candidates' exact memory checks."""


@dataclass
class LayoutSearch(Ranking):
    """A `Ranking` of the simulated candidates, with the search's counts, times and pruned candidates."""

    stats: SearchStats = field(default_factory=SearchStats)
    pruned: list = field(default_factory=list)
    top: int = 10

    def to_dict(self) -> dict:
        stats = self.stats
        return {**super().to_dict(), "search": {
            "enumerated": stats.enumerated, "pruned_by_memory": stats.pruned_memory,
            "pruned_by_bound": stats.pruned_bound, "simulated": stats.simulated, "failed": stats.skipped,
            "seconds": stats.seconds, "top": self.top}, "pruned": self.pruned}


def megatron_space(scenario: Scenario, workload, microbatch_sizes=MICROBATCH_SIZES, context=True,
                   cp_across_nodes: int | None = None) -> list[Candidate]:
    """The megatron layouts of the module docstring; `cp_across_nodes`: the largest c of a CP group
    across nodes (default the scenario's c; `search_layouts` passes the one set before the scenario
    is moved to another GPU count)."""
    across = scenario.strategy.cp_degree if cp_across_nodes is None else cp_across_nodes
    n, per_node, batch = scenario.num_gpus, scenario.cluster.gpus_per_node, scenario.training.global_batch_size
    layers = workload.num_layers
    recompute_modes = searched_recompute_modes(scenario, workload)
    heads = {layer.spec.get("num_heads") for layer in workload.layers if layer.spec.get("num_heads")}
    sequences = {layer.spec["seq_len"] for layer in workload.layers if layer.spec.get("seq_len")}
    experts = {layer.spec["num_experts"] for layer in workload.layers if layer.spec.get("kind") == "moe_block"}
    found = []
    for t, c in ((t, c) for t in range(1, min(n, per_node) + 1)
                 for c in (context_degrees(workload, t, per_node, across) if context else (1,))):
        if n % (t * c) or any(h % t for h in heads):
            continue
        for p in (q for q in range(1, min(n // (t * c), layers) + 1) if (n // (t * c)) % q == 0):
            d = n // (t * c * p)
            if batch % d:
                continue
            for b in (size for size in microbatch_sizes if (batch // d) % size == 0 and (c == 1 or size < c)):
                m = batch // (d * b)
                for v in (w for w in SEARCH_VIRTUAL_STAGES if w == 1 or (p > 1 and p * w <= layers and m % p == 0)):
                    for rc, ep in ((rc, ep) for rc in recompute_modes for ep in expert_degrees(d, experts, c)):
                        dense = ep in (None, 1)  # EP > 1: ZeRO 0 / 1 and, with TP, SP only
                        for zero in (z for z in (ZERO_STAGES if d * c > 1 else (0,))
                                     if z < 2 or (p == 1 and dense and c == 1)):
                            for sp in ((False, True) if t > 1 and dense else (t > 1,)):
                                if sp and any(length % (t * c) for length in sequences):
                                    continue  # sequence parallelism splits the sequence over t
                                for order in (MEGATRON_ORDERS if p > 1 and d > 1 else MEGATRON_ORDERS[:1]):
                                    found.append(Candidate(MEGATRON, n // p, p, order, m, v, t, rc, zero, sp, ep, c))
    return found


def searched_recompute_modes(scenario: Scenario, workload) -> tuple[str, ...]:
    """`RECOMPUTE_MODES` without selective where it equals none: under the kernel model with flash
    attention a transformer block's selective recompute re-runs and keeps nothing more (flash keeps
    no s x s tensor and its backward recomputes the scores: `simulator.kernels_attention.
    core_recompute_kernels`, `simulator.memory_activations.kept_bytes`); only attention layers
    without a block spec would be re-run whole (`simulator.memory_activations.recompute_ranges`). A model
    with no attention layer (a CNN) has no core to re-run: selective is none there."""
    costs, attention = scenario.costs, [layer for layer in workload.layers if layer.kind == "attention"]
    kernel_model = kernel_model_chosen(costs.model, scenario.cluster.gpu)
    if not attention or kernel_model and costs.flash_attention and all(is_block(layer) for layer in attention):
        return tuple(mode for mode in RECOMPUTE_MODES if mode != "selective")
    return RECOMPUTE_MODES  # the analytic roofline prices the core's recompute in any case


def context_degrees(workload, t: int, per_node: int, max_across_nodes: int) -> tuple[int, ...]:
    """CP degrees c of a megatron layout with t TP ranks: 1 and, for a model with attention layers, each
    power of two c > 1 whose t c ranks divide gpus_per_node (a CP group inside a node) or, with
    c <= max_across_nodes, are whole nodes (across nodes at the same local ranks: Megatron's rank
    order), and that splits every attention layer's sequence into 2 c chunks
    (`context.check_context_parallel`)."""
    lengths, found, c = {spec["seq_len"] for spec in attention_specs(workload)}, [1], 2
    while lengths and (per_node % (t * c) == 0 or c <= max_across_nodes):
        inside, across = per_node % (t * c) == 0, (t * c) % per_node == 0 and c <= max_across_nodes
        if (inside or across) and all(length % (2 * c) == 0 for length in lengths):
            found.append(c)
        c *= 2
    return tuple(found)


def expert_degrees(d: int, experts: set[int], c: int = 1) -> tuple[int | None, ...]:
    """EP degrees e of a megatron layout with d replicas: the divisors of d that divide every MoE
    layer's expert count (`simulator.strategies.experts.check_expert_parallel`), only 1 with context
    parallelism c > 1 (`simulator.strategies.context`); (None,), the scenario's, for a model without
    experts."""
    if not experts:
        return (None,)
    return tuple(e for e in range(1, d + 1) if d % e == 0 and all(count % e == 0 for count in experts)
                 and (c == 1 or e == 1))


def default_search_kinds(tensor_parallel: bool) -> tuple[str, ...]:
    """dp, mp, ghp and the synchronous pipelines (asynchronous ones have no bound, so only by name),
    and megatron for a model with attention layers."""
    return SYNCHRONOUS_DEFAULT + ((MEGATRON,) if tensor_parallel else ())


def exact_peak_memory_bytes(scenario: Scenario, workload=None) -> float:
    """The memory model's peak (`simulator.memory`, as `simulate` reports it) from the compiled plan
    alone: a rank's allocations depend on the order of its computes (played back to back here) and
    on where its gradient allgathers start and end relative to them, not on their durations. A long
    pipeline's plan is the few micro-batches `simulate` plays (`simulator.steady_extension`)."""
    from simulator.memory import memory_config, memory_report
    from simulator.model_source import resolve_workload
    from simulator.plan import Collective, Compute
    from simulator.simulate import analytic_costs
    from simulator.steady_extension import short_microbatches, short_plan, shortened
    from simulator.strategies import compile_plan
    from simulator.strategies.tensor_summary import tensor_memory_report
    from simulator.strategies.zero import shard_memory

    workload = workload or resolve_workload(scenario.model, scenario.base_dir)
    short = short_microbatches(scenario)  # the plan `simulate` plays and reports memory from
    topology = cached_topology(scenario.cluster.model_dump_json())
    costs = analytic_costs(scenario, workload)
    if short is None:
        plan = compile_plan(scenario, workload, topology, costs)
    else:  # split as the step's m micro-batches would be, its memory figures those of the play
        plan, scenario = short_plan(scenario, short[0], workload, topology, costs), shortened(scenario, short[0])
    spans = []
    for rank, actions in enumerate(plan.actions):
        clock, comm_end, done = 0.0, 0.0, {}
        for action in actions:
            if isinstance(action, Compute):
                start = max([clock] + [done.get(dep, 0.0) for dep in action.deps])
                clock = done[action.id] = start + 1.0
                spans.append((rank, "compute", action.label, action.phase, start, clock, 0.0, action.microbatch))
            elif isinstance(action, Collective):
                start = max([comm_end] + [done.get(dep, 0.0) for dep in action.deps])
                comm_end = done[action.id] = start + 1.0
                spans.append((rank, "comm", action.label, action.op, start, comm_end, action.size_bytes, -1))
    config = memory_config(scenario)
    if "rank_workload" in plan.meta:
        report = tensor_memory_report(plan, spans, config)
        shard_memory({"memory": report, "devices": report["devices"]}, plan.meta["zero"])
    else:
        report = memory_report(plan, workload, spans, config)
    return max(row["peak_memory_bytes"] for row in report["devices"])


def evaluate_layout(payload: dict) -> dict:
    """Worker body: the exact memory check (when asked), then the simulation (`simulate_candidate`)."""
    if payload.get("check_memory"):
        try:
            scenario = scenario_from_dict(payload["scenario"], payload["origin"], payload["base_dir"])
            workload = _workload(json.dumps(payload["scenario"]["model"], sort_keys=True), payload["base_dir"])
            peak = exact_peak_memory_bytes(scenario, workload)
        except (ScenarioError, SimulationError) as error:
            return {"label": payload["label"], "error": str(error)}
        if peak > usable_memory_bytes(scenario):
            return {"label": payload["label"], "memory_bytes": peak}
        return simulate_candidate(payload)
    return simulate_candidate(payload)


def search_layouts(scenario: Scenario, num_gpus: int | None = None, *, kinds: tuple[str, ...] | None = None,
                   microbatch_sizes: tuple[int, ...] = MICROBATCH_SIZES, microbatch_counts: tuple[int, ...] | None = None,
                   top: int = 10, workers: int | None = None, exhaustive: bool = False,
                   show_progress: bool = True, context: bool | None = None) -> LayoutSearch:
    """The branch-and-bound search of the module docstring; `exhaustive` simulates every candidate
    that passes the memory floor (for checks); `context`: search CP degrees (None: as the module says)."""
    context = scenario.strategy.cp_degree > 1 if context is None else context
    cp_across_nodes = scenario.strategy.cp_degree  # the scenario's own, before the move to num_gpus
    stats = SearchStats()
    started = time.perf_counter()
    scenario = scenario_for_gpus(scenario, num_gpus)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    if kinds is None:
        kinds = default_search_kinds(any(layer.kind == "attention" for layer in workload.layers))
    others = tuple(kind for kind in kinds if kind != MEGATRON)
    candidates, skipped = enumerate_candidates(scenario, workload.num_layers, others, microbatch_counts) \
        if others else ([], [])
    for candidate in [c for c in candidates if c.kind == "interleaved_1f1b" and c.num_microbatches % c.workers_per_group]:
        candidates.remove(candidate)
        skipped.append({"label": candidate.label, "reason": f"interleaved_1f1b needs m={candidate.num_microbatches} "
                                                            f"divisible by the {candidate.workers_per_group} stages"})
    topology, folds = cached_topology(scenario.cluster.model_dump_json()), {}
    if MEGATRON in kinds:
        candidates += megatron_space(scenario, workload, microbatch_sizes, context, cp_across_nodes)
    stats.enumerated = len(candidates) + len(skipped)
    stats.seconds["enumerate"] = time.perf_counter() - started
    capacity = usable_memory_bytes(scenario)
    queue, pruned, bounds, floors = [], [], {}, {}
    workers = max(1, min((os.cpu_count() or 1) if workers is None else workers, len(candidates)))  # no idle processes
    pool, finished = (quiet_pool(workers) if workers > 1 else None), False
    try:
        with _bar(f"screening {len(candidates):,} layouts (memory floor, step bound)", show_progress) as bar:
            task, clock = bar.add_task("screen", total=len(candidates)), time.perf_counter()
            screened, memory_s, bound_s = screen_all(scenario, workload, candidates, pool, workers,
                                                     lambda count: bar.advance(task, count))
        screen_s = time.perf_counter() - clock  # workers' seconds summed exceed it: split it as they were
        stats.seconds["memory"] = screen_s * (memory_s / (memory_s + bound_s) if memory_s + bound_s > 0 else 0.5)
        stats.seconds["bound"] = screen_s - stats.seconds["memory"]
        for candidate, found in zip(candidates, screened):
            if found.error is not None:
                skipped.append({"label": candidate.label, "reason": found.error})
                continue
            if found.floor_bytes > capacity:
                stats.pruned_memory += 1
                pruned.append({"label": candidate.label, "kind": candidate.kind, "reason": "memory",
                               "memory_floor_bytes": found.floor_bytes})
                continue
            bounds[candidate] = found.bound
            queue.append((found.bound.step_s, len(queue), candidate))
            floors[candidate] = found.floor_bytes
        heapq.heapify(queue)

        def refuse(candidate):
            return unfolded_refusal(scenario, candidate, topology, folds)

        outcomes = _best_first(scenario, queue, floors, top, exhaustive, workers, pool, show_progress, stats, refuse)
        finished = True
    finally:  # Ctrl-C or an error: the workers are ended, not waited for
        if pool is not None:
            stop_pool(pool, abort=not finished)
    rows, simulated = [], set()
    for candidate, outcome in outcomes:
        simulated.add(candidate)
        if "refused" in outcome:  # too big to simulate unfolded (`search_gates`): not simulated
            skipped.append({"label": candidate.label, "reason": outcome["refused"]})
        elif "error" in outcome:
            skipped.append({"label": candidate.label, "reason": outcome["error"]})
            stats.skipped += 1
        elif "summary" not in outcome:
            stats.pruned_memory += 1
            pruned.append({"label": candidate.label, "kind": candidate.kind, "reason": "memory",
                           "memory_bytes": outcome["memory_bytes"]})
        else:
            rows.append({**_row(candidate, outcome, capacity), "bound_s": bounds[candidate].step_s})
    rows.sort(key=lambda row: (not row["fits_in_memory"], row["step_time_s"], row["label"]))
    by_label = {candidate.label: candidate for candidate in candidates}
    best_parts = explain(rows, lambda row: bounds[by_label[row["label"]]])
    for _, _, candidate in queue:
        if candidate not in simulated:
            stats.pruned_bound += 1
            pruned.append({"label": candidate.label, "kind": candidate.kind, "bound_s": bounds[candidate].step_s,
                           "reason": lost_to(time_parts(bounds[candidate]), best_parts) or "bound"})
    stats.simulated = len(rows)
    return LayoutSearch(scenario, rows, skipped, MEMORY_MODEL, capacity, stats=stats, pruned=pruned, top=top)


def _best_first(scenario, queue, floors, top, exhaustive, workers, pool, show_progress, stats,
                refuse=lambda candidate: None) -> list[tuple[Candidate, dict]]:
    """Pop candidates by bound until the next bound exceeds the top-th best time that fits; a popped
    candidate that `refuse` names a reason for (`search_gates.unfolded_refusal`, checked only for the
    candidates that could still win) is not simulated."""
    heap, capacity = list(queue), usable_memory_bytes(scenario)
    best: list[float] = []  # negated step times of the top fitting candidates (a max-heap)
    done: list[tuple[Candidate, dict]] = []

    def limit() -> float:
        return float("inf") if exhaustive or len(best) < top else -best[0]

    def record(candidate, outcome):
        done.append((candidate, outcome))
        summary = outcome.get("summary")
        if summary and max(outcome["peak_memory_bytes"]) <= capacity:
            heapq.heappush(best, -summary["step_time_s"])
            if len(best) > top:
                heapq.heappop(best)

    def payload(candidate):
        return {"label": candidate.label, "scenario": candidate_scenario(scenario, candidate),
                "origin": scenario.source, "base_dir": scenario.base_dir, "profile": None,
                "check_memory": scenario.strategy.gradient_compression == "none"
                and floors[candidate] >= EXACT_CHECK_FRACTION * capacity}

    def still_to_go() -> int:  # simulated, running, and queued under the bound the top K set now
        return len(done) + len(running) + sum(1 for bound_s, _, _ in heap if bound_s <= limit())

    clock = time.perf_counter()
    with _bar("simulating the layouts that can still win", show_progress) as progress:
        running: dict = {}
        task = progress.add_task("search", total=still_to_go())
        while heap or running:
            progress.update(task, total=still_to_go())
            while heap and len(running) < workers and heap[0][0] <= limit():
                _, _, candidate = heapq.heappop(heap)
                refusal = refuse(candidate)
                if refusal:
                    done.append((candidate, {"refused": refusal}))
                    progress.advance(task)
                elif pool is None:
                    record(candidate, evaluate_layout(payload(candidate)))
                    progress.advance(task)
                else:
                    running[pool.submit(evaluate_layout, payload(candidate))] = candidate
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                record(running.pop(future), future.result())
                progress.advance(task)
    stats.seconds["simulate"] = time.perf_counter() - clock  # wall time, the exact memory checks included
    return done


def _bar(title: str, enabled: bool):
    """A progress bar on stderr (`simulator.progress`): title, bar, done / total, elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from simulator.progress import stderr_progress
    return stderr_progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           enabled=enabled)
