"""Memory floors and step-time bounds of a layout search's candidates (`simulator.step_bound`),
computed in the search's worker processes when it has several.

Each worker keeps one `BoundModel` per scenario, so the geometry, partition and link-rate floors
it remembers serve every later slice of candidates it gets. Candidates go out in slices of
consecutive ones (alike layouts share those memos) and come back in order; the figures are the
same as one process computes, since each is a pure function of the scenario and the candidate.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from simulator.errors import ScenarioError, SimulationError
from simulator.memory_buffers import usable_memory_bytes

SLICES_PER_WORKER = 4
"""Slices a worker gets: enough to even out slow and fast slices, few enough that little of each
worker's memo is computed twice."""

_MODELS: dict[str, object] = {}
"""Per process: the scenario's JSON -> its `BoundModel`."""


@dataclass(frozen=True)
class Screened:
    """One candidate's memory floor (None with `error`) and, where the floor fits, its step bound."""

    floor_bytes: float | None
    bound: object | None
    error: str | None = None


def bound_model(scenario, workload=None):
    """The `BoundModel` of a (GPU-count-resolved) scenario. Each candidate is priced with the costs
    it runs on: by kind, not the scenario's own (megatron pads the vocabulary and, in fp16, adds
    each micro-batch's weight gradients in kernels of their own; every other kind prices alike), and
    with selective recompute only where the candidate recomputes (its attention cores re-run in the
    backward, and the balanced partition follows those costs)."""
    from simulator.fabrics import cached_topology
    from simulator.planner import _workload
    from simulator.simulate import analytic_costs
    from simulator.step_bound import BoundModel
    workload = workload or _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True),
                                     scenario.base_dir)
    built: dict[tuple[bool, bool], object] = {}

    def costs_for(megatron: bool, selective: bool):
        if (megatron, selective) not in built:
            training = scenario.training.model_copy(update={"recompute": "selective" if selective else "none"})
            strategy = scenario.strategy.model_copy(update={"kind": "megatron" if megatron else "dp"})
            built[megatron, selective] = analytic_costs(
                scenario.model_copy(update={"training": training, "strategy": strategy}), workload)
        return built[megatron, selective]
    return BoundModel(scenario, workload, cached_topology(scenario.cluster.model_dump_json()), costs_for(False, False),
                      costs_for=costs_for)


def screen(model, candidates, advance=None) -> tuple[list[Screened], float, float]:
    """(per candidate its `Screened`, seconds in floors, seconds in bounds) with `model`;
    `advance(1)` after each candidate (a progress bar)."""
    capacity = usable_memory_bytes(model.scenario)
    found, memory_s, bound_s = [], 0.0, 0.0
    for candidate in candidates:
        if advance is not None and found:
            advance(1)
        clock = time.perf_counter()
        try:
            floor = model.memory_floor_bytes(candidate)
        except (ScenarioError, SimulationError, IndexError) as error:
            # IndexError: strategies.ghp's balanced partition of G > 1 pipeline replicas on mixed GPUs
            found.append(Screened(None, None, str(error) or type(error).__name__))
            continue
        middle = time.perf_counter()
        memory_s += middle - clock
        bound = model.bound(candidate) if floor <= capacity else None
        bound_s += time.perf_counter() - middle
        found.append(Screened(floor, bound))
    if advance is not None and found:
        advance(1)
    return found, memory_s, bound_s


def _screen_slice(payload: dict) -> tuple[list[Screened], float, float]:
    """Worker body: `screen` a slice with this process's model of the payload's scenario."""
    from simulator.scenario import scenario_from_dict
    key = json.dumps(payload["scenario"], sort_keys=True)
    model = _MODELS.get(key)
    if model is None:
        _MODELS.clear()  # one search at a time
        model = _MODELS[key] = bound_model(scenario_from_dict(payload["scenario"], payload["origin"],
                                                              payload["base_dir"]))
    return screen(model, payload["candidates"])


def screen_all(scenario, workload, candidates, pool=None, workers: int = 1,
               advance=None) -> tuple[list[Screened], float, float]:
    """`screen` every candidate: in this process without a pool, else in slices over its workers;
    `advance(n)` as n more are screened (a progress bar)."""
    if pool is None or workers < 2 or len(candidates) < 2:
        return screen(bound_model(scenario, workload), candidates, advance)
    raw = scenario.model_dump(mode="json")
    size = max(1, -(-len(candidates) // (workers * SLICES_PER_WORKER)))
    futures = [pool.submit(_screen_slice, {"scenario": raw, "origin": scenario.source, "base_dir": scenario.base_dir,
                                           "candidates": candidates[start:start + size]})
               for start in range(0, len(candidates), size)]
    found, memory_s, bound_s = [], 0.0, 0.0
    for future in futures:
        part, part_memory_s, part_bound_s = future.result()
        if advance is not None:
            advance(len(part))
        found += part
        memory_s += part_memory_s
        bound_s += part_bound_s
    return found, memory_s, bound_s
