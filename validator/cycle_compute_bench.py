"""The profile's `cycle_compute` section: how much compute ranks get done inside the asynchronous
1F1B cycle on a shared CPU host, over what the engine's processor sharing expects
(`simulator.cycle_compute`, which has the formula).

Each round, every rank at once: the model's layer steps back to back for `CONTINUOUS_S` (all
ranks computing: their rate), then rank 0 alone for as long (the others at a barrier: the rate
alone), then one asynchronous 1F1B run of `handoff_bench`'s cycle with the same steps in its
compute windows, each window's start, end and steps recorded on the host's monotonic clock. The
pool's parallelism of the round is P = W x the all-ranks rate / the alone rate, as the profile's
compute_slowdown[W] gives it to the engine, at most W: W ranks cannot get more than W times one
rank's work done, so a round above W measured its alone window slowed by something outside the
ranks (a CI run measured 2.86 with 2 ranks on 2 cores). No validated run enters it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from simulator.cycle_compute import cycle_efficiency, summarize
from validator.handoff_bench import DEFAULT_HANDOFF_BYTES, run_cycle
from validator import comm_device

CYCLE_HOP_COMPUTE_S = 0.008
"""A backward window (a forward's is half): the order of a pipeline stage's pass over a micro-batch
of 16 in the validation models here. Shorter windows measured lower efficiencies (ResNet-20 at 4
ranks: 0.83 at 4 ms, 0.86 at 8 ms, 0.87 at 16 ms)."""
CYCLE_ROUNDS = 5
CYCLE_MICROBATCHES = 24
CONTINUOUS_S = 0.4


def _steps_for(steps: Sequence[Callable[[], None]], seconds: float, active: bool) -> tuple[int, float]:
    """(steps done, seconds) running `steps` in turn for `seconds` if `active`; between barriers."""
    dist.barrier()
    done, started = 0, time.perf_counter()
    while active and time.perf_counter() - started < seconds:
        steps[done % len(steps)]()
        done += 1
    elapsed_s = time.perf_counter() - started
    dist.barrier()
    return done, elapsed_s


def measure_cycle_compute(steps: Sequence[Callable[[], None]], hop_compute_s: float = CYCLE_HOP_COMPUTE_S,
                          rounds: int = CYCLE_ROUNDS, warmup: int = 1,
                          num_microbatches: int = CYCLE_MICROBATCHES) -> dict:
    """The `cycle_compute` section (`simulator.cycle_compute.summarize`), on every rank; all ranks
    of one host must call it at the same time."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buffer = torch.ones(max(DEFAULT_HANDOFF_BYTES // 4, 1), device=comm_device.data_device())
    efficiencies, parallelisms = [], []
    for repeat in range(warmup + rounds):
        busy = _steps_for(steps, CONTINUOUS_S, True)
        alone = _steps_for(steps, CONTINUOUS_S, rank == 0)
        windows: list = []
        dist.barrier()
        run_cycle(steps, buffer, num_microbatches, hop_compute_s, repeat, windows)
        everyone = [None] * world
        dist.all_gather_object(everyone, (busy, alone, windows))
        if repeat < warmup:
            continue
        alone_steps, alone_s = everyone[0][1]
        alone_rate = alone_steps / alone_s
        busy_rate = statistics.median(done / seconds for (done, seconds), _, _ in everyone)
        parallelism = min(float(world), world * busy_rate / alone_rate)
        parallelisms.append(parallelism)
        efficiencies.append(cycle_efficiency([w for _, _, w in everyone], alone_rate, parallelism))
    return summarize(efficiencies, hop_compute_s, statistics.median(parallelisms))
