"""Microbenchmark of FSDP2's host work per collective: what `fully_shard` spends around each of its
all-gathers and reduce-scatters beyond the bare collective and the unit's compute.

FSDP2 runs, for every unit and pass, Python and dispatcher work besides the collective itself:
the pre-forward / pre-backward hooks, the all-gather's copy-in and copy-out
(`foreach_all_gather`, `foreach_all_gather_copy_out`), DTensor bookkeeping, and the
post-backward `foreach_reduce` (torch `distributed/fsdp/_fully_shard/_fsdp_collectives.py`,
`_fsdp_param_group.py`). The simulator charges that work once per collective on the compute
stream, with FSDP2's copy passes (`simulator.strategies.zero`; the profile's `fsdp`).

Measured as a slope over the number of units, so that nothing fixed per step (the loss, the
root's hooks, the barrier) enters: a stack of K tiny units of `nn.Linear(WIDTH, WIDTH)` layers, each under
`fully_shard` (full shard: 2 all-gathers and 1 reduce-scatter per unit and step), trained for
`steps` steps at K = 2 and K = 8 by all ranks at once; the same stacks trained without FSDP on each
rank. A unit adds u = ((T_fsdp(8) - T_fsdp(2)) - (T_local(8) - T_local(2))) / 6 to a step beyond its
compute (units this small compute in microseconds); `validator.calibrate` takes from u the unit's
collectives as the profile's own fits price them, 2 all-gathers and 1 reduce-scatter, so that the
simulator's unit costs u in all, and divides the rest by 3. FSDP2 shards, gathers and copies each
parameter tensor apart (per-parameter DTensors; `split_with_sizes_copy` and `_chunk_cat` over the
unit's tensors), so its work grows with them: two unit shapes, 1 Linear (2 tensors) and 4 (8),
give the work per collective as a + b x tensors (`host_work`).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from validator.microbench import _sync

WIDTH = 64
"""Features of each tiny `nn.Linear` (64 x 64 weights + 64 biases: 4,160 parameters, 2 tensors)."""
BATCH = 4
UNIT_COUNTS = (2, 8)
LINEARS_PER_UNIT = (1, 4)
"""The two unit shapes: 1 Linear (2 parameter tensors) and 4 (8 tensors)."""
COLLECTIVES_PER_UNIT = 3
"""Full shard: each unit gathered before its forward and its backward, its gradients reduce-scattered once."""


def _stack(num_units: int, linears: int, device: torch.device, shard: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(linears)])
                            for _ in range(num_units)]).to(device)
    if shard:
        from torch.distributed.fsdp import fully_shard
        for unit in model:
            fully_shard(unit)
        fully_shard(model)
    return model


def _step_s(model: nn.Module, device: torch.device, steps: int, warmup: int) -> float:
    """Median time of one training step (forward, backward, SGD update), all ranks at once."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(BATCH, WIDTH, device=device)
    times = []
    for index in range(warmup + steps):
        if dist.is_initialized():
            dist.barrier()
        _sync(device)
        started = time.perf_counter()
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        _sync(device)
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def time_fsdp_units(device: str = "cpu", steps: int = 30, warmup: int = 5, rounds: int = 3) -> list[dict]:
    """What one more full-shard unit adds to an FSDP2 step beyond its compute (module docstring), per
    unit shape, on the initialized process group, with the figures it comes from: `[{tensors,
    unit_params, unit_s, fsdp_step_s: {K: s}, local_step_s: {K: s}}]`; every rank returns rank 0's."""
    device = torch.device(device)
    cases = [(linears, count) for linears in LINEARS_PER_UNIT for count in UNIT_COUNTS]
    fsdp_s: dict[tuple, list[float]] = {case: [] for case in cases}
    local_s: dict[tuple, list[float]] = {case: [] for case in cases}
    for _ in range(rounds):  # interleaved, so that a drifting machine weighs on every case alike
        for linears, count in cases:
            fsdp_s[linears, count].append(_step_s(_stack(count, linears, device, True), device, steps, warmup))
            local_s[linears, count].append(_step_s(_stack(count, linears, device, False), device, steps, warmup))
    low, high = UNIT_COUNTS
    shapes = []
    for linears in LINEARS_PER_UNIT:
        fsdp = {count: statistics.median(fsdp_s[linears, count]) for count in UNIT_COUNTS}
        local = {count: statistics.median(local_s[linears, count]) for count in UNIT_COUNTS}
        shapes.append({"tensors": 2 * linears, "unit_params": linears * (WIDTH * WIDTH + WIDTH),
                       "unit_s": ((fsdp[high] - fsdp[low]) - (local[high] - local[low])) / (high - low),
                       "fsdp_step_s": fsdp, "local_step_s": local})
    shared = [shapes]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def host_work(shapes: list[dict], world_size: int, allgather_s, allreduce_s) -> dict[str, float]:
    """FSDP2's host work per collective, a + b x tensors of the unit: each shape's added step time
    less its collectives as the simulator prices them from the profile's fits (`allgather_s(bytes
    each rank contributes)`, `allreduce_s(bytes)`: gloo runs a reduce-scatter as an allreduce of
    the whole buffer), over its 3 collectives; b from the two shapes' difference, a from the
    smaller; both at least 0. `{collective_overhead_s: a, per_tensor_s: b}`."""
    per_collective = []
    for shape in shapes:
        unit_bytes = 4 * shape["unit_params"]  # fp32
        bare_s = 2 * allgather_s(unit_bytes / world_size) + allreduce_s(unit_bytes)
        per_collective.append((shape["tensors"], (shape["unit_s"] - bare_s) / COLLECTIVES_PER_UNIT))
    (few, few_s), (many, many_s) = sorted(per_collective)
    per_tensor_s = max(0.0, (many_s - few_s) / (many - few))
    return {"collective_overhead_s": max(0.0, few_s - per_tensor_s * few), "per_tensor_s": per_tensor_s}
