"""Host-wake microbenchmark: what a message costs when the host's cores are busy, by how busy.

Why: the handoff chain (`validator.handoff_bench`) gives one mean delay per profile, measured with
whatever mix of busy neighbours its chain happens to have. In the pipeline validations the
asynchronous schedules at 4 stages (4 ranks on 2 cores) stayed 20-34 % under-predicted; their
traces show `isend` calls of 4-9 ms (the engine plays ~0.6 ms) while the other ranks computed. On
a kernel with a periodic tick (CONFIG_HZ=250 here: 4 ms) and no preemption (PREEMPT_NONE), a
thread woken while every core is taken can wait for the next tick or for a running thread's slice
to end, so the cost of a message depends on how many other threads compute at that moment, which
a fluid processor-sharing model (`simulator.host_sharing`) does not see.

What it times (ranks on one host, shared monotonic clock):
- `wake levels`: rank 0 computes `hop_compute_s` (the same matrix product loop every time), then
  `isend`s `size_bytes` to rank 1, which waits with its receive already posted; meanwhile `busy`
  other ranks (2 .. 1 + busy) compute without pause. Per level busy = 0 .. world_size - 2: the
  `isend` call's duration on the sender (`call`) and the delay from the call's start to the end
  of the receiver's `wait()` (`delay`), median, mean and 90th percentile.
- `crossing sends`: ranks 0 and 1, receives posted, `isend` to each other at the same moment (a
  barrier, then at once, as a stage's gradient and its neighbour's activation cross in 1F1B's
  steady state) and, for comparison, with rank 1 starting `offset_s` later; the other ranks idle.

Nothing here enters a profile; `benchmarks/bench_host_wake.py` prints the table.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from validator.handoff_bench import DEFAULT_HOP_COMPUTE_S

DEFAULT_SIZE_BYTES = 128 << 10
"""A ResNet stage boundary of the pipeline validation (131072 bytes per micro-batch)."""
MESSAGE_GAP_S = 0.001
"""The sender sleeps this long after each message, so that consecutive messages do not queue."""
WARMUP_MESSAGES = 5


def matmul_for(duration_s: float, operand: torch.Tensor) -> None:
    """Matrix products of `operand` with itself until `duration_s` has passed."""
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        operand @ operand


def _shared_deadline_s(duration_s: float) -> float:
    """Rank 0's clock + `duration_s`, on every rank (one host: one monotonic clock)."""
    deadline = torch.tensor([time.perf_counter() + duration_s], dtype=torch.float64)
    dist.broadcast(deadline, src=0)
    return float(deadline.item())


def _wake_level(busy: int, num_messages: int, size_bytes: int, hop_compute_s: float,
                operand: torch.Tensor, flag_folder: Path) -> tuple[list[float], list[float], list[float]]:
    """One level: (isend starts, isend call durations) on rank 0, wake times on rank 1; [] elsewhere.
    Rank 0 ends the level by creating a file the busy ranks look for between their 1 ms bursts (a
    gloo receive cannot be polled without waiting on it)."""
    rank = dist.get_rank()
    level_over = flag_folder / f"level{busy}.over"
    message = torch.ones(max(size_bytes // 4, 1))
    budget_s = num_messages * (hop_compute_s + MESSAGE_GAP_S + 0.02) + 5.0  # 20 ms a message: far beyond any seen
    dist.barrier()
    deadline_s = _shared_deadline_s(budget_s)
    starts, calls, wakes = [], [], []
    if rank == 0:
        for _ in range(num_messages):
            matmul_for(hop_compute_s, operand)
            started = time.perf_counter()
            work = dist.isend(message, dst=1)
            calls.append(time.perf_counter() - started)
            starts.append(started)
            work.wait()
            time.sleep(MESSAGE_GAP_S)
        level_over.touch()
    elif rank == 1:
        buffer = torch.empty_like(message)
        for _ in range(num_messages):
            dist.irecv(buffer, src=0).wait()
            wakes.append(time.perf_counter())
    elif rank - 2 < busy:  # compute in 1 ms bursts until rank 0 says the level is over
        while not level_over.exists():
            if time.perf_counter() > deadline_s:
                raise TimeoutError(f"rank {rank}: busy level {busy} not over within {budget_s:.1f} s")
            matmul_for(0.001, operand)
    dist.barrier()
    return starts, calls, wakes


def _crossing(num_messages: int, size_bytes: int, offset_s: float) -> list[float]:
    """Ranks 0 and 1 send to each other right after a barrier (rank 1 `offset_s` later); the
    `isend` call durations on this rank ([] on the others)."""
    rank = dist.get_rank()
    message = torch.ones(max(size_bytes // 4, 1))
    buffer = torch.empty_like(message)
    calls = []
    for _ in range(num_messages):
        receive = dist.irecv(buffer, src=1 - rank) if rank < 2 else None
        dist.barrier()
        if rank < 2:
            if rank == 1 and offset_s > 0:
                time.sleep(offset_s)
            started = time.perf_counter()
            send = dist.isend(message, dst=1 - rank)
            calls.append(time.perf_counter() - started)
            receive.wait()
            send.wait()
    return calls


def summary_ms(values_s: list[float]) -> dict:
    """median, mean and 90th percentile (nearest rank) in milliseconds; n."""
    ordered = sorted(values_s)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {"n": len(ordered), "median_ms": 1e3 * statistics.median(ordered),
            "mean_ms": 1e3 * statistics.fmean(ordered), "p90_ms": 1e3 * p90}


def wake_table(per_rank_levels: list[list[tuple]], warmup: int = WARMUP_MESSAGES) -> list[dict]:
    """Per busy level: the call and delay summaries. `per_rank_levels[rank][busy]` is that rank's
    (starts, calls, wakes); the first `warmup` messages of each level are dropped."""
    rows = []
    for busy in range(len(per_rank_levels[0])):
        starts, calls, _ = per_rank_levels[0][busy]
        wakes = per_rank_levels[1][busy][2]
        if len(wakes) != len(starts):
            raise ValueError(f"busy level {busy}: {len(starts)} messages sent but {len(wakes)} received")
        delays = [woke - started for started, woke in zip(starts, wakes)][warmup:]
        rows.append({"busy_ranks": busy, "call": summary_ms(calls[warmup:]), "delay": summary_ms(delays)})
    return rows


def host_wake_rank_main(rank: int, num_messages: int = 60, size_bytes: int = DEFAULT_SIZE_BYTES,
                        hop_compute_s: float = DEFAULT_HOP_COMPUTE_S, offsets_s: tuple = (0.0, 0.0001)) -> dict | None:
    """One launch (`validator.launch.spawn`, world size >= 2, one host): every wake level, then the
    crossing sends at each offset; rank 0 returns {"wake": rows, "crossing": rows}, others None."""
    world = dist.get_world_size()
    if world < 2:
        raise ValueError(f"world_size: the host-wake benchmark needs 2 or more ranks, got {world}")
    operand = torch.randn(128, 128)
    folder = [tempfile.mkdtemp(prefix="ghpsim-host-wake-") if rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    flag_folder = Path(folder[0])
    try:
        levels = [_wake_level(busy, num_messages, size_bytes, hop_compute_s, operand, flag_folder)
                  for busy in range(world - 1)]
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(flag_folder, ignore_errors=True)
    crossing = {offset: _crossing(num_messages, size_bytes, offset) for offset in offsets_s}
    everyone = [None] * world
    dist.all_gather_object(everyone, (levels, crossing))
    if rank != 0:
        return None
    crossing_rows = [{"offset_ms": 1e3 * offset,
                      "call": summary_ms(everyone[0][1][offset][WARMUP_MESSAGES:] +
                                         everyone[1][1][offset][WARMUP_MESSAGES:])}
                     for offset in offsets_s]
    return {"world_size": world, "size_bytes": size_bytes, "hop_compute_s": hop_compute_s,
            "num_messages": num_messages, "wake": wake_table([levels for levels, _ in everyone]),
            "crossing": crossing_rows}
