"""PipeDream's partitioner: contiguous stages with per-stage replication, minimising the slowest stage.

Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019,
section 3.1: a dynamic program over contiguous layer ranges and the number of workers given to
each range. Here, for one micro-batch of the pipeline:

- a stage of layers [a, b) replicated r ways (data parallel inside the stage) costs
  (sum of compute_s[a:b] + allreduce_s(gradient bytes of [a, b), r)) / r
  plus, unless it is the last stage, boundary_s[b - 1]: sending layer b - 1's output forward and
  receiving its gradient back (one link carries every micro-batch crossing the cut, so this term
  is not divided by r);
- the pipeline's time per micro-batch is its slowest stage; all `num_workers` workers are used;
- memory (PipeDream with weight stashing, 1F1B order): a stage with d stages from it to the end
  (d = 1 for the last) has d micro-batches in flight, so it holds
  state_bytes (weights + gradients + optimizer state, once) + (d - 1) stashed weight copies
  + d x the activations saved for backward per micro-batch, which must fit `memory_bytes`.

DP state (first layer i, workers w, stages d of the suffix [i, L)); O(L^2 N^2 min(N, L)) steps, fine
for the tens of layers and workers it is meant for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simulator.errors import ScenarioError


@dataclass(frozen=True)
class PipeDreamStage:
    layer_start: int
    layer_end: int
    num_replicas: int
    time_s: float
    memory_bytes: float


@dataclass(frozen=True)
class PipeDreamPartition:
    stages: tuple[PipeDreamStage, ...]

    @property
    def slowest_stage_s(self) -> float:
        return max(stage.time_s for stage in self.stages)


@dataclass(frozen=True)
class StageCosts:
    """Per-layer inputs of the partitioner (lists of length L); see the module docstring."""

    compute_s: Sequence[float]
    gradient_bytes: Sequence[float]
    boundary_s: Sequence[float]
    allreduce_s: Callable[[float, int], float]
    state_bytes: Sequence[float] = ()
    weight_bytes: Sequence[float] = ()
    activation_bytes: Sequence[float] = ()

    def time_s(self, start: int, end: int, replicas: int) -> float:
        compute = sum(self.compute_s[start:end])
        sync = self.allreduce_s(sum(self.gradient_bytes[start:end]), replicas) if replicas > 1 else 0.0
        boundary = self.boundary_s[end - 1] if end < len(self.compute_s) else 0.0
        return (compute + sync) / replicas + boundary

    def memory_bytes(self, start: int, end: int, depth: int) -> float:
        """Bytes on one worker of a stage with `depth` stages from it to the end."""
        total = sum(self.state_bytes[start:end]) if self.state_bytes else 0.0
        total += (depth - 1) * sum(self.weight_bytes[start:end]) if self.weight_bytes else 0.0
        total += depth * sum(self.activation_bytes[start:end]) if self.activation_bytes else 0.0
        return total


def pipedream_partition(costs: StageCosts, num_workers: int, memory_bytes: float = math.inf) -> PipeDreamPartition:
    """The partition minimising the slowest stage among those that fit; ScenarioError if none fits."""
    num_layers = len(costs.compute_s)
    # best[(i, w, d)] = (slowest stage, (end, replicas) of the suffix's first stage)
    best: dict[tuple[int, int, int], tuple[float, tuple[int, int]]] = {}
    for start in range(num_layers - 1, -1, -1):
        for workers in range(1, num_workers + 1):
            for depth in range(1, min(workers, num_layers - start) + 1):
                choice = _best_first_stage(costs, best, start, workers, depth, num_layers, memory_bytes)
                if choice is not None:
                    best[(start, workers, depth)] = choice
    options = [(best[(0, num_workers, d)][0], d) for d in range(1, num_workers + 1) if (0, num_workers, d) in best]
    if not options:
        raise ScenarioError(f"cluster.gpu.memory_bytes: no PipeDream partition of the {num_layers} layers over "
                            f"{num_workers} workers fits {memory_bytes:.4g} bytes per worker")
    _, depth = min(options)
    stages, start, workers = [], 0, num_workers
    while depth:
        _, (end, replicas) = best[(start, workers, depth)]
        stages.append(PipeDreamStage(start, end, replicas, costs.time_s(start, end, replicas),
                                     costs.memory_bytes(start, end, depth)))
        start, workers, depth = end, workers - replicas, depth - 1
    return PipeDreamPartition(tuple(stages))


def _best_first_stage(costs, best, start, workers, depth, num_layers, memory_bytes):
    found = None
    for end in range(start + 1, num_layers + 1):
        if (end == num_layers) != (depth == 1):
            continue
        if costs.memory_bytes(start, end, depth) > memory_bytes:
            break  # longer first stages only need more memory
        for replicas in range(1, workers - (depth - 1) + 1):
            if depth == 1 and replicas != workers:
                continue
            rest = 0.0 if depth == 1 else best.get((end, workers - replicas, depth - 1), (math.inf,))[0]
            value = max(costs.time_s(start, end, replicas), rest)
            if found is None or value < found[0]:
                found = (value, (end, replicas))
    return found if found is not None and math.isfinite(found[0]) else None
