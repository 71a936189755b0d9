"""Horovod-style tensor fusion: which gradients go in one allreduce, and when it starts.

Horovod's background thread wakes every HOROVOD_CYCLE_TIME. At each tick it takes the tensors
that became ready on every rank since the last tick, in order, and fuses the first ones that fit
in HOROVOD_FUSION_THRESHOLD bytes into one allreduce, repeating until none of this cycle's is left
(a tensor larger than the threshold goes alone; a threshold of 0 disables fusion). Horovod docs,
"Tensor Fusion" (docs/tensor-fusion.rst); Sergeev & Del Balso, arXiv:1802.05799, sec. 4.
Defaults since Horovod 0.21.0: 1 ms and 128 MiB (changelog: "Changed default cycle time from 5ms
to 1ms and fusion threshold from 64MB to 128MB", horovod PR #2468); 5 ms and 64 MiB before.

In a plan a tensor is one layer's gradient. Its ready time is planned from the cost model: the
group's forwards, then the backwards of the later stages and of this stage's layers, last to
first (transfers not counted), with ticks at multiples of the cycle from the step's start
(`horovod_segments`). The engine then starts each fused allreduce at the first tick after its
dependencies are done, or as the previous allreduce ends when that is later (the loop runs all of a
tick's responses in that cycle, one after another) (`Collective.cycle_s`), so the grouping is
planned and the wait for the tick is played.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from simulator.workload import Workload

HOROVOD_CYCLE_TIME_S = 1e-3
HOROVOD_FUSION_THRESHOLD_BYTES = 128 * 2**20


def tick_of(ready_s: float, cycle_s: float) -> float:
    """Index of the first tick at or after `ready_s` (ticks at k x cycle_s); `ready_s` itself
    when there is no cycle."""
    return math.ceil(ready_s / cycle_s - 1e-9) if cycle_s > 0 else ready_s


def horovod_groups(ready_s: Sequence[float], sizes_bytes: Sequence[float], cycle_s: float,
                   threshold_bytes: float) -> list[list[int]]:
    """Indices of the tensors (in ready order) each fused allreduce carries: those ready by the
    same tick, taken in order while their total stays within `threshold_bytes` (module docstring)."""
    if any(later < earlier for earlier, later in zip(ready_s, ready_s[1:])):
        raise ValueError("ready_s must be in ready order (non-decreasing)")
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes, current_tick = 0.0, None
    for index, (ready, size) in enumerate(zip(ready_s, sizes_bytes)):
        tick = tick_of(ready, cycle_s)
        if current and (tick != current_tick or current_bytes + size > threshold_bytes):
            groups.append(current)
            current, current_bytes = [], 0.0
        current.append(index)
        current_bytes += size
        current_tick = tick
    if current:
        groups.append(current)
    return groups


def horovod_segments(workload: Workload, layer_start: int, layer_end: int, element_bytes: int,
                     backward_start_s: float, backward_s: Callable[[int], float], cycle_s: float,
                     threshold_bytes: float) -> list[tuple[int, int, float]]:
    """Backward segments [(start, end, gradient bytes)], last layers first (as
    `simulator.strategies.ghp.bucket_segments`), one per fused allreduce: layer i's gradient is
    ready at `backward_start_s` + the `backward_s` of layers layer_end - 1 .. i; layers without
    parameters join the segment after them."""
    layers, ready, sizes = [], [], []
    now_s = backward_start_s
    for index in range(layer_end - 1, layer_start - 1, -1):
        now_s += backward_s(index)
        size = workload.layers[index].num_params * element_bytes
        if size > 0:
            layers.append(index)
            ready.append(now_s)
            sizes.append(size)
    if not layers:
        return [(layer_start, layer_end, 0.0)]
    groups = horovod_groups(ready, sizes, cycle_s, threshold_bytes)
    segments, end = [], layer_end
    for number, group in enumerate(groups):
        start = layers[group[-1]] if number < len(groups) - 1 else layer_start
        segments.append((start, end, sum(sizes[i] for i in group)))
        end = start
    return segments
