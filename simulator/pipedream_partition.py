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

DP state (first layer i, workers w, stages d of the suffix [i, L)); O(L^2 N^2 min(N, L)) steps,
vectorised with numpy over (last layer, replicas, workers), so ResNet-1001's 335 layers on 16 workers
take seconds; `replicas` fixed (uniform grids) takes O(L^2 N) steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

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

    @cached_property
    def _prefix(self) -> dict[str, np.ndarray]:
        """Prefix sums of the per-layer inputs: a range's sum is two lookups."""
        names = ("compute_s", "gradient_bytes", "state_bytes", "weight_bytes", "activation_bytes")
        size = len(self.compute_s)
        values = {name: getattr(self, name) for name in names}
        return {name: np.concatenate(([0.0], np.cumsum(np.asarray(v if len(v) else np.zeros(size), float))))
                for name, v in values.items()}

    def _sum(self, name: str, start, end):
        prefix = self._prefix[name]
        return prefix[end] - prefix[start]

    def time_s(self, start: int, end: int, replicas: int) -> float:
        compute = float(self._sum("compute_s", start, end))
        sync = self.allreduce_s(float(self._sum("gradient_bytes", start, end)), replicas) if replicas > 1 else 0.0
        boundary = self.boundary_s[end - 1] if end < len(self.compute_s) else 0.0
        return (compute + sync) / replicas + boundary

    def memory_bytes(self, start: int, end: int, depth: int) -> float:
        """Bytes on one worker of a stage with `depth` stages from it to the end."""
        return float(self.memory_row(start, end, depth))

    def memory_row(self, start: int, ends, depth: int):
        """memory_bytes(start, end, depth) for an array of ends."""
        return (self._sum("state_bytes", start, ends) + (depth - 1) * self._sum("weight_bytes", start, ends)
                + depth * self._sum("activation_bytes", start, ends))


def pipedream_partition(costs: StageCosts, num_workers: int, memory_bytes: float = math.inf,
                        replicas: int | None = None) -> PipeDreamPartition:
    """The partition minimising the slowest stage among those that fit; ScenarioError if none fits.

    `replicas` fixes every stage's replication (then num_workers / replicas stages: the uniform
    G x M grids of GHP and HyPar-Flow); None lets each stage take any number of workers.
    """
    num_layers = len(costs.compute_s)
    if replicas is not None and (num_workers % replicas or num_workers // replicas > num_layers):
        raise ScenarioError(f"strategy.partition: {num_workers} workers in stages of {replicas} replicas "
                            f"do not make at most {num_layers} stages")
    choices = list(range(1, num_workers + 1)) if replicas is None else [replicas]
    table = _time_table(costs, choices, num_layers)
    best, picks = {}, {}  # per depth d: (L + 1, N + 1) slowest stage of suffix [i, L) on w workers; its first stage
    for depth in range(1, min(num_workers, num_layers) + 1):
        best[depth] = np.full((num_layers + 1, num_workers + 1), np.inf)
        picks[depth] = np.zeros((num_layers + 1, num_workers + 1, 2), dtype=int)
        for start in range(num_layers - depth, -1, -1):
            _best_first_stages(costs, table, choices, best, picks, start, depth, num_workers, memory_bytes)
    options = [(best[d][0, num_workers], d) for d in best if np.isfinite(best[d][0, num_workers])]
    if not options:
        raise ScenarioError(f"cluster.gpu.memory_bytes: no PipeDream partition of the {num_layers} layers over "
                            f"{num_workers} workers fits {memory_bytes:.4g} bytes per worker")
    _, depth = min(options)
    stages, start, workers = [], 0, num_workers
    while depth:
        end, width = (int(x) for x in picks[depth][start, workers])
        stages.append(PipeDreamStage(start, end, width, costs.time_s(start, end, width),
                                     costs.memory_bytes(start, end, depth)))
        start, workers, depth = end, workers - width, depth - 1
    return PipeDreamPartition(tuple(stages))


def _time_table(costs: StageCosts, choices: list[int], num_layers: int) -> np.ndarray:
    """table[k, a, b] = costs.time_s(a, b, choices[k]) for a < b, inf elsewhere."""
    table = np.full((len(choices), num_layers + 1, num_layers + 1), np.inf)
    for k, width in enumerate(choices):
        for start in range(num_layers):
            table[k, start, start + 1:] = [costs.time_s(start, end, width) for end in range(start + 1, num_layers + 1)]
    return table


def _best_first_stages(costs, table, choices, best, picks, start, depth, num_workers, memory_bytes):
    """Fill best[depth][start, w] for every w: the first stage [start, end) on r workers, vectorised
    over (end, r, w); ties go to the smallest end, then the smallest r."""
    num_layers = len(costs.compute_s)
    ends = np.arange(num_layers, num_layers + 1) if depth == 1 else np.arange(start + 1, num_layers - depth + 2)
    fits = costs.memory_row(start, ends, depth) <= memory_bytes
    widths = np.array(choices)
    workers = np.arange(num_workers + 1)
    stage_s = table[:, start, ends].T[:, :, None]  # (end, r, 1)
    if depth == 1:
        rest = np.where(workers[None, None, :] == widths[None, :, None], 0.0, np.inf)
    else:
        left = workers[None, :] - widths[:, None]  # (r, w) workers for the rest of the pipeline
        rest = best[depth - 1][ends][:, np.maximum(left, 0)]  # (end, r, w)
        rest = np.where(left[None] >= 0, rest, np.inf)
    value = np.where(fits[:, None, None], np.maximum(stage_s, rest), np.inf).reshape(-1, num_workers + 1)
    index = np.argmin(value, axis=0)
    best[depth][start] = value[index, workers]
    picks[depth][start, :, 0] = ends[index // len(choices)]
    picks[depth][start, :, 1] = widths[index % len(choices)]
