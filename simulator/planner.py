"""Planner: every worker allocation for N GPUs, simulated (in parallel) and ranked by step time.

Candidates (`enumerate_candidates`): `dp`; `mp`; `ghp` for every G x M = N with 1 < G < N, in both
placements; and each pipeline kind the strategies implement (`PIPELINE_KINDS` present in
`STRATEGIES`) for every G x M = N with M >= 2, with m micro-batches per replica given, or by default
`schedules.default_microbatch_counts` (interleaved_1f1b with `VIRTUAL_STAGES` chunks per rank); and
`megatron` 3D plans (`default_kinds`): every tensor-parallel degree t >= 2 that fits in a node
(Megatron keeps TP on the node's links, Narayanan et al. SC'21, sec. 3.2) times every pipeline depth
p, d = N / (t p) replicas, each m of `MICROBATCH_COUNTS` (m = 1 without a pipeline). Impossible
ones are not simulated; `skipped` lists each with the reason. On a single node both placements use
the same links, so only `group_per_node` is kept.

Memory: a device's peak is `devices[].peak_memory_bytes` of the simulation summary (the memory
model), else `estimate_peak_memory_bytes` (PAPERS.md section 1, memory_j; `simulator.heuristics`)
per stage with the samples whose activations are held at once: the group batch B/G without
pipelining and for GPipe (all m micro-batches), min(m, M - j) micro-batches of B/(G m) for stage j of
the others (1F1B's bound, SC'21 sec. 2.2). Those over `memory_buffers.usable_memory_bytes` rank last.

N GPUs: the cluster keeps `gpus_per_node` and gets N / gpus_per_node nodes (fewer: one node of N
GPUs; else an error). The scenario's own allocation (kind, G, t, p) is not carried to another N
(`scenario_for_gpus`): the candidates are the search.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from concurrent.futures import as_completed
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from simulator.errors import ScenarioError, SimulationError
from simulator.fabrics import cached_topology
from simulator.heuristics import estimate_peak_memory_bytes
from simulator.memory_buffers import usable_memory_bytes
from simulator.model_source import resolve_workload
from simulator.scenario import PIPELINE_KINDS, Scenario, scenario_from_dict
from simulator.schedules import default_microbatch_counts
from simulator.worker_pool import quiet_pool, stop_pool
from simulator.zero_config import without_unused_fsdp_keys, without_zero
from simulator.simulate import simulate
from simulator.strategies import STRATEGIES

MICROBATCH_COUNTS = (2, 4, 8)
"""m of kind megatron's pipelines here (`layout_search` searches micro-batch sizes b instead)."""
ASYNC_KINDS = ("pipedream", "spectrain", "delayed_gradient")
"""Pipeline kinds that update with stale weights (PAPERS.md sections 2 and 5): ranked by time per
step like the others, but not equivalent to mini-batch SGD."""
VIRTUAL_STAGES = 2
MEGATRON = "megatron"
PLACEMENTS = ("group_per_node", "stage_per_node")
MEMORY_MODEL = "simulated (memory model)"
MEMORY_ESTIMATE = "estimate (simulator.heuristics.estimate_peak_memory_bytes)"


@dataclass(frozen=True)
class Candidate:
    """One allocation: strategy kind, G x M grid, placement, micro-batches (pipelines)."""

    kind: str
    num_groups: int
    workers_per_group: int
    placement: str = "group_per_node"
    num_microbatches: int = 1
    num_virtual_stages: int = 1
    tp_degree: int = 1
    """megatron: tensor-parallel ranks t; then num_groups = d t pipelines of workers_per_group = p stages."""
    recompute: str | None = None
    """training.recompute of the candidate (None: the scenario's)."""
    zero_stage: int | None = None
    """megatron: strategy.zero_stage (None: the scenario's)."""
    sequence_parallel: bool | None = None
    """megatron: strategy.sequence_parallel (None: the scenario's)."""
    ep_degree: int | None = None
    """megatron: strategy.ep_degree, expert-parallel ranks e of an MoE model (None: the scenario's)."""
    cp_degree: int | None = None
    """megatron: strategy.cp_degree c; num_groups = d c t fixes it, so None is 1, not the scenario's."""

    @property
    def data_parallel(self) -> int:
        """Replicas d of the model (G for dp / mp / ghp / pipelines, G / (t c) for megatron)."""
        return self.num_groups // (self.tp_degree * (self.cp_degree or 1))

    @property
    def label(self) -> str:
        options = (f" recompute={self.recompute}" if self.recompute else "") \
            + (f" zero{self.zero_stage}" if self.zero_stage else "")
        if self.kind == MEGATRON:
            return (f"megatron (t={self.tp_degree} x " + (f"c={self.cp_degree} x " if (self.cp_degree or 1) > 1 else "")
                    + f"p={self.workers_per_group} x d={self.data_parallel}) "
                    f"m={self.num_microbatches}" + (f" v={self.num_virtual_stages}" if self.num_virtual_stages > 1 else "")
                    + options + (" sp" if self.sequence_parallel else "")
                    + (f" ep={self.ep_degree}" if self.ep_degree and self.ep_degree > 1 else "")
                    + (" tp-dp-pp" if self.placement == "tp_dp_pp" else ""))
        text = f"{self.kind} (G={self.num_groups} x M={self.workers_per_group})"
        if self.kind in PIPELINE_KINDS:
            text += f" m={self.num_microbatches}" + (f" v={self.num_virtual_stages}" if self.num_virtual_stages > 1 else "")
        if self.num_groups > 1 and self.workers_per_group > 1:
            text += f" {self.placement}"
        return text + options


def grid_candidate(num_groups: int, workers_per_group: int, placement: str = "group_per_node") -> Candidate:
    """The plain (non-pipelined) candidate of a G x M grid: dp, mp or ghp."""
    if workers_per_group == 1:
        return Candidate("dp", num_groups, 1)
    if num_groups == 1:
        return Candidate("mp", 1, workers_per_group)
    return Candidate("ghp", num_groups, workers_per_group, placement)


def scenario_for_gpus(scenario: Scenario, num_gpus: int | None) -> Scenario:
    """`scenario` on N GPUs (see the module doc for the rule); unchanged for None or the scenario's N.

    The scenario's own allocation (`strategy.kind`, `num_groups`, `tp_degree`, `pp_degree`,
    `cp_degree`, `ep_degree`, an explicit placement) was chosen for its N and need not exist on
    another (G = 8 does not divide 12); every candidate sets its own (`candidate_scenario`), so on
    another N it is dropped: the returned strategy is `dp` (a megatron scenario, or one with ZeRO:
    `megatron` at t = p = 1) with the scenario's other settings (bucket size, collective, ...), which candidates inherit."""
    if num_gpus is None or num_gpus == scenario.num_gpus:
        return scenario
    per_node = scenario.cluster.gpus_per_node
    if num_gpus < 1 or (num_gpus > per_node and num_gpus % per_node):
        raise ScenarioError(f"--gpus: {num_gpus} is not a multiple of cluster.gpus_per_node={per_node} "
                            f"(nor at most one node)")
    raw = scenario.model_dump(mode="json")
    nodes, per_node = (num_gpus // per_node, per_node) if num_gpus >= per_node else (1, num_gpus)
    nics = math.gcd(raw["cluster"]["nics_per_node"], per_node)  # one node's NICs carry nothing, but divide its GPUs
    raw["cluster"] = {**raw["cluster"], "num_nodes": nodes, "gpus_per_node": per_node, "nics_per_node": nics}
    megatron = raw["strategy"]["zero_stage"] >= 1 or raw["strategy"]["kind"] == "megatron"  # ZeRO and FSDP are megatron's
    raw["strategy"] = {**raw["strategy"], "kind": "megatron" if megatron else "dp", "num_groups": None, "tp_degree": 1,
                       "pp_degree": 1, "cp_degree": 1, "ep_degree": 1}
    if not isinstance(raw["strategy"]["placement"], str):
        raw["strategy"]["placement"] = "group_per_node"
    try:
        return scenario_from_dict(raw, scenario.source, scenario.base_dir)
    except ScenarioError as error:  # a setting of the scenario's own size (a straggler's device): --gpus broke it
        raise ScenarioError(f"--gpus {num_gpus} ({nodes} node{'s' if nodes > 1 else ''} of {per_node}): {error}") from None


def candidate_kinds() -> tuple[str, ...]:
    """dp, mp, ghp, every pipeline kind the strategies implement now, and megatron."""
    return ("dp", "mp", "ghp", *(kind for kind in PIPELINE_KINDS if kind in STRATEGIES), MEGATRON)


def default_kinds(tensor_parallel: bool) -> tuple[str, ...]:
    """The kinds enumerated without `--kinds`: all, megatron only where `tensor_parallel` (a model
    with attention layers, simulated with analytic costs: a profile times whole layers)."""
    return tuple(kind for kind in candidate_kinds() if kind != MEGATRON or tensor_parallel)


def enumerate_candidates(scenario: Scenario, num_layers: int, kinds: tuple[str, ...] | None = None,
                         microbatch_counts: tuple[int, ...] | None = None) -> tuple[list[Candidate], list[dict]]:
    """(candidates to simulate, skipped [{"label", "reason"}]) on the scenario's N GPUs; `kinds`
    None: `default_kinds(True)`; `microbatch_counts` None: `default_microbatch_counts` per grid."""
    num_gpus, batch = scenario.num_gpus, scenario.training.global_batch_size
    divisors = [g for g in range(1, num_gpus + 1) if num_gpus % g == 0]
    proposed: list[Candidate] = []
    for kind in kinds or default_kinds(True):
        if kind == MEGATRON:
            proposed += megatron_candidates(num_gpus, scenario.cluster.gpus_per_node, microbatch_counts or MICROBATCH_COUNTS)
        elif kind in ("dp", "mp"):
            proposed.append(grid_candidate(num_gpus, 1) if kind == "dp" else grid_candidate(1, num_gpus))
        elif kind == "ghp":
            proposed += [Candidate("ghp", g, num_gpus // g, p) for g in divisors[1:-1] for p in PLACEMENTS]
        else:
            chunks = VIRTUAL_STAGES if kind == "interleaved_1f1b" else 1
            proposed += [Candidate(kind, g, num_gpus // g, p, m, chunks) for g in divisors[:-1]
                         for p in (PLACEMENTS if g > 1 else PLACEMENTS[:1])
                         for m in (microbatch_counts or default_microbatch_counts(num_gpus // g, batch // g))]
    candidates, skipped = [], []
    for candidate in proposed:
        reason = invalid_reason(candidate, batch, num_layers, scenario.cluster.num_nodes)
        if not reason and candidate.kind == MEGATRON and candidate.workers_per_group > 1 \
                and (scenario.strategy.zero_stage if candidate.zero_stage is None else candidate.zero_stage) >= 2:
            reason = "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (DeepSpeed)"
        if reason:
            skipped.append({"label": candidate.label, "reason": reason})
        else:
            candidates.append(candidate)
    return candidates, skipped


def megatron_candidates(num_gpus: int, gpus_per_node: int, microbatch_counts: tuple[int, ...]) -> list[Candidate]:
    """t x p x d = N with 2 <= t <= gpus_per_node (t | N), every p | N / t; m of `microbatch_counts`
    (only m = 1 for p = 1: no pipeline to fill)."""
    return [Candidate(MEGATRON, num_gpus // pp, pp, "group_per_node", micro, 1, tp)
            for tp in range(2, min(num_gpus, gpus_per_node) + 1) if num_gpus % tp == 0
            for pp in range(1, num_gpus // tp + 1) if (num_gpus // tp) % pp == 0
            for micro in (microbatch_counts if pp > 1 else (1,))]


def invalid_reason(candidate: Candidate, batch: int, num_layers: int, num_nodes: int) -> str | None:
    """Why a candidate cannot run (or need not: a duplicate), else None."""
    groups, workers, micro = candidate.data_parallel, candidate.workers_per_group, candidate.num_microbatches
    if candidate.kind == MEGATRON:
        if batch % groups:
            return f"training.global_batch_size {batch} is not divisible by d={groups} replicas"
        if (batch // groups) % micro:
            return f"replica batch {batch // groups} is not divisible by m={micro} micro-batches"
    if batch % groups:
        return f"training.global_batch_size {batch} is not divisible by G={groups}"
    if workers * candidate.num_virtual_stages > num_layers:
        return f"{workers * candidate.num_virtual_stages} stages for the model's {num_layers} layers"
    if candidate.kind in PIPELINE_KINDS and (batch // groups) % micro:
        return f"group batch {batch // groups} is not divisible by m={micro} micro-batches"
    if candidate.placement == "stage_per_node" and num_nodes == 1:
        return "same links as group_per_node on a single node"
    return None


def candidate_scenario(scenario: Scenario, candidate: Candidate) -> dict:
    """The scenario dict (JSON types) of `candidate`: the strategy section replaced."""
    raw = scenario.model_dump(mode="json")
    partition = raw["strategy"]["partition"]
    if not isinstance(partition, str) and len(partition) != candidate.workers_per_group * candidate.num_virtual_stages:
        partition = "balanced"
    if candidate.recompute:
        raw["training"] = {**raw["training"], "recompute": candidate.recompute}
    if candidate.kind == MEGATRON:  # dense gradients, each kept until the update, as compare.megatron_layout
        raw["training"]["memory_policy"] = raw["training"]["memory_policy"].replace("laysa", "reuse")
        from simulator.layout_geometry import megatron_placement
        placement = megatron_placement(candidate.placement, candidate.tp_degree, candidate.workers_per_group,
                                       candidate.data_parallel, candidate.cp_degree or 1)
        raw["strategy"] = {**raw["strategy"], "kind": MEGATRON, "num_groups": None, "dp_sync": "allreduce",
                           "num_parameter_servers": 1, "placement": placement if isinstance(placement, str) else list(placement),
                           "tp_degree": candidate.tp_degree, "pp_degree": candidate.workers_per_group, "gradient_compression": "none",
                           "num_microbatches": candidate.num_microbatches, "partition": partition,
                           "num_virtual_stages": candidate.num_virtual_stages, "cp_degree": candidate.cp_degree or 1}
        for key in ("sequence_parallel", "zero_stage", "ep_degree"):
            if getattr(candidate, key) is not None:
                raw["strategy"][key] = getattr(candidate, key)
        raw["strategy"]["tp_comm_overlap"] = bool(raw["strategy"]["tp_comm_overlap"] and raw["strategy"]["sequence_parallel"])
        raw["strategy"] = without_unused_fsdp_keys(raw["strategy"])  # the candidate's stage, not the scenario's
        return raw
    raw["strategy"] = {**without_zero(raw["strategy"]), "kind": candidate.kind, "placement": candidate.placement,
                       "ep_degree": 1, "cp_degree": 1, "num_groups": None if candidate.kind in ("dp", "mp") else candidate.num_groups,
                       "num_microbatches": candidate.num_microbatches, "partition": partition,
                       "num_virtual_stages": candidate.num_virtual_stages}
    return raw


# ----------------------------------------------------------------------------- simulation


def simulate_candidate(payload: dict) -> dict:
    """Worker body (a process pool's): one candidate's summary and per-rank peak memory, or its
    error. `payload` = {"label", "scenario" (dict), "origin", "base_dir", "profile" (path or None)}."""
    try:
        scenario = scenario_from_dict(payload["scenario"], payload["origin"], payload["base_dir"])
        workload = _workload(json.dumps(payload["scenario"]["model"], sort_keys=True), payload["base_dir"])
        costs = _profile_costs(payload["profile"], workload) if payload.get("profile") else None
        result = simulate(scenario, costs=costs, workload=workload,
                          topology=cached_topology(scenario.cluster.model_dump_json()))
    except (ScenarioError, SimulationError) as error:
        return {"label": payload["label"], "error": str(error)}
    devices = result.summary["devices"]
    if devices and all("peak_memory_bytes" in row for row in devices):
        memory, source = [row["peak_memory_bytes"] for row in devices], MEMORY_MODEL
    else:
        memory, source = planned_peak_memory_bytes(result.plan, workload, scenario), MEMORY_ESTIMATE
    return {"label": payload["label"], "summary": result.summary, "peak_memory_bytes": memory,
            "memory_source": source}


@lru_cache(maxsize=8)
def _workload(model_json: str, base_dir: str):
    from simulator.scenario import ModelConfig
    return resolve_workload(ModelConfig.model_validate(json.loads(model_json)), base_dir)


def _profile_costs(path: str, workload):
    from simulator.profile import load_profile
    from simulator.profile_costs import ProfileCosts
    profile = load_profile(path)
    return ProfileCosts(profile, workload)


def planned_peak_memory_bytes(plan, workload, scenario: Scenario) -> list[float]:
    """Per-rank estimate: the stages a rank holds (chunk c on rank c mod M), see the module doc."""
    strategy, training = scenario.strategy, scenario.training
    workers = plan.workers_per_group
    micro = strategy.num_microbatches if strategy.kind in PIPELINE_KINDS else 1
    per_stage = defaultdict(float)
    for index, stage in enumerate(plan.stages):
        position = index % workers
        stashed = plan.group_batch
        if micro > 1 and strategy.kind != "gpipe":
            stashed = min(micro, workers - position) * plan.group_batch / micro
        per_stage[position] += estimate_peak_memory_bytes(
            workload, stage.layer_start, stage.layer_end, dtype=training.dtype, optimizer=training.optimizer,
            stashed_samples=stashed, pass_samples=plan.group_batch / micro)
    return [per_stage[rank % workers] for rank in range(plan.num_ranks)]


def run_payloads(payloads: list[dict], workers: int = 1, show_progress: bool = True) -> list[dict]:
    """`simulate_candidate` over every payload (a process pool when workers > 1), in input order,
    with a rich progress bar on stderr when it is a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from simulator.progress import stderr_progress

    outcomes: dict[int, dict] = {}
    progress = stderr_progress(TextColumn("simulating candidates"), BarColumn(), MofNCompleteColumn(),
                               TimeRemainingColumn(), enabled=show_progress)
    if workers <= 1 or len(payloads) <= 1:
        with progress:
            task = progress.add_task("simulate", total=len(payloads))
            for index, payload in enumerate(payloads):
                outcomes[index] = simulate_candidate(payload)
                progress.advance(task)
    else:
        pool, finished = quiet_pool(min(workers, len(payloads))), False
        try:  # submit before the progress bar's refresh thread: fork-started workers start at the first submit
            futures = {pool.submit(simulate_candidate, payload): index for index, payload in enumerate(payloads)}
            with progress:
                task = progress.add_task("simulate", total=len(payloads))
                for future in as_completed(futures):
                    outcomes[futures[future]] = future.result()
                    progress.advance(task)
            finished = True
        finally:  # Ctrl-C or an error: the workers are ended, not waited for
            stop_pool(pool, abort=not finished)
    return [outcomes[index] for index in range(len(payloads))]


# ----------------------------------------------------------------------------- ranking


@dataclass
class Ranking:
    """Ranked candidates of one scenario on N GPUs: `rows` fastest first, those that do not fit
    in device memory last; `skipped` = candidates not simulated or that failed, with the reason."""

    scenario: Scenario
    rows: list[dict]
    skipped: list[dict]
    memory_source: str
    device_memory_bytes: float

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def find(self, label: str) -> dict | None:
        return next((row for row in self.rows if row["label"] == label), None)

    def to_dict(self) -> dict:
        cluster = self.scenario.cluster
        return {"scenario": self.scenario.name, "num_gpus": self.scenario.num_gpus,
                "num_nodes": cluster.num_nodes, "gpus_per_node": cluster.gpus_per_node, "inter_node_link":
                cluster.inter_node_link.name, "nics_per_node": cluster.nics_per_node, "memory_source": self.memory_source, "device_memory_bytes": self.device_memory_bytes,
                "rows": self.rows, "skipped": self.skipped}


def rank_candidates(scenario: Scenario, num_gpus: int | None = None, *, kinds: tuple[str, ...] | None = None,
                    microbatch_counts: tuple[int, ...] | None = None, workers: int | None = None,
                    profile_path: str | None = None, show_progress: bool = True) -> Ranking:
    """Enumerate, simulate (analytic costs, or the calibration profile at `profile_path`) and rank."""
    scenario = scenario_for_gpus(scenario, num_gpus)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    if profile_path:
        _profile_costs(profile_path, workload)  # a foreign or broken profile: one error, not one per candidate
    if kinds is None:
        kinds = default_kinds(not profile_path and any(layer.kind == "attention" for layer in workload.layers))
    candidates, skipped = enumerate_candidates(scenario, workload.num_layers, kinds, microbatch_counts)
    payloads = [{"label": c.label, "scenario": candidate_scenario(scenario, c), "origin": scenario.source,
                 "base_dir": scenario.base_dir, "profile": profile_path} for c in candidates]
    workers = (os.cpu_count() or 1) if workers is None else workers
    outcomes = run_payloads(payloads, workers, show_progress)
    device_memory = usable_memory_bytes(scenario)
    rows, sources = [], set()
    for candidate, outcome in zip(candidates, outcomes):
        if "error" in outcome:
            skipped.append({"label": candidate.label, "reason": outcome["error"]})
            continue
        rows.append(_row(candidate, outcome, device_memory))
        sources.add(outcome["memory_source"])
    rows.sort(key=lambda row: (not row["fits_in_memory"], row["step_time_s"], row["label"]))
    for position, row in enumerate(rows, start=1):
        row["rank"] = position
    return Ranking(scenario, rows, skipped, " + ".join(sorted(sources)) or MEMORY_ESTIMATE, device_memory)


def _row(candidate: Candidate, outcome: dict, device_memory_bytes: float) -> dict:
    summary = outcome["summary"]
    step_s, devices = summary["step_time_s"], summary["devices"]
    comm_s = sum(row["comm_s"] for row in devices) / len(devices)
    peak = max(outcome["peak_memory_bytes"])
    return {"label": candidate.label, "kind": candidate.kind, "num_groups": candidate.num_groups,
            "workers_per_group": candidate.workers_per_group, "placement": candidate.placement,
            "num_microbatches": candidate.num_microbatches, "num_virtual_stages": candidate.num_virtual_stages,
            "tp_degree": candidate.tp_degree, "cp_degree": candidate.cp_degree or 1,
            **{key: getattr(candidate, key) for key in ("recompute", "zero_stage", "sequence_parallel", "ep_degree")},
            "partition": summary["partition"], "step_time_s": step_s,
            "throughput_samples_per_s": summary["throughput_samples_per_s"], "speedup": summary["speedup"],
            "comm_share": comm_s / step_s if step_s > 0 else 0.0, "peak_memory_bytes": peak,
            "fits_in_memory": peak <= device_memory_bytes}
