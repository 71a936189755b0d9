"""Every rank runs the asynchronous 1F1B cycle at once, with synthetic passes (prints figures).

Stage r of W does W-1-r forwards first, then alternates one forward and one backward, then drains
(`--cycles` of each in all); a forward is `--forward-ms` of one matrix product loop, a backward twice
that; activations go down and gradients up as `--size-bytes` tensors, each rank's next receive
posted one ahead (as `validator.pipeline_runtime`). Printed per rank: a pass timed in the cycle
against the same pass timed alone beforehand, the `isend` call (median / mean), the wait in
receives (mean), and the steady cycle (median time between consecutive backward ends, the first 20
dropped) against the passes' own time per cycle (forward + backward). On a host with as many cores
as ranks, the cycle minus the passes is what the messages cost a stage per micro-batch.

Measured here (2 cores, 1 ms forward, 128 KiB; reports/ACCURACY.md): at 2 ranks the cycle took
4.9-7.5 ms against 2.8-3.1 ms of passes (1.7-2.5x in three runs); at 4 ranks 9.0-9.7 ms, where the
2 cores need 6.1 ms for the four stages' passes (1.5x).

Run: python benchmarks/bench_async_cycle.py [--world-size 2] [--forward-ms 1.0] [--cycles 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from validator.handoff_bench import cycle_order
from validator.host_wake_bench import matmul_for
from validator.launch import LaunchConfig, RankFailure, spawn

DROPPED_CYCLES = 20


def _fixed_work(operand: torch.Tensor, count: int) -> None:
    for _ in range(count):
        operand @ operand


def cycle_rank_main(rank: int, forward_s: float, cycles: int, size_bytes: int) -> dict:
    world = dist.get_world_size()
    operand = torch.randn(128, 128)
    matmul_for(0.05, operand)  # warm up
    dist.barrier()
    count = torch.zeros(1, dtype=torch.int64)
    if rank == 0:  # sized on rank 0 alone, the others at the broadcast: the same work on every rank
        started = time.perf_counter()
        _fixed_work(operand, 200)
        count[0] = max(1, round(forward_s / ((time.perf_counter() - started) / 200)))
    dist.broadcast(count, src=0)
    products = int(count.item())
    forward_alone_s = 0.0
    for turn in range(world):  # one rank at a time, the others idle at the barrier
        dist.barrier()
        if turn == rank:
            started = time.perf_counter()
            for _ in range(20):
                _fixed_work(operand, products)
            forward_alone_s = (time.perf_counter() - started) / 20
    order = [step for step, _ in cycle_order(rank, world, cycles)]
    sources = [rank - 1 if step == "F" else rank + 1 for step in order
               if (step == "F" and rank > 0) or (step == "B" and rank < world - 1)]
    message = torch.ones(max(size_bytes // 4, 1))
    buffers = [torch.empty_like(message) for _ in range(2)]
    posted, next_receive = None, 0
    sends, calls, waits, passes, backward_ends = [], [], [], [], []

    def post():
        nonlocal posted, next_receive
        if next_receive < len(sources):
            posted = dist.irecv(buffers[next_receive % 2], src=sources[next_receive])
            next_receive += 1

    def receive():
        began = time.perf_counter()
        posted.wait()
        post()
        waits.append(time.perf_counter() - began)

    def send(target):
        began = time.perf_counter()
        sends.append(dist.isend(message.clone(), dst=target))
        calls.append(time.perf_counter() - began)

    post()
    dist.barrier()
    for step in order:
        if step == "F":
            if rank > 0:
                receive()
            began = time.perf_counter()
            _fixed_work(operand, products)
            passes.append(time.perf_counter() - began)
            if rank < world - 1:
                send(rank + 1)
        else:
            if rank < world - 1:
                receive()
            began = time.perf_counter()
            _fixed_work(operand, 2 * products)
            passes.append((time.perf_counter() - began) / 2)
            backward_ends.append(time.perf_counter())
            if rank > 0:
                send(rank - 1)
    for work in sends:
        work.wait()
    steady = backward_ends[DROPPED_CYCLES:]
    cycle_s = [later - earlier for earlier, later in zip(steady, steady[1:])]
    return {"rank": rank, "forward_alone_ms": 1e3 * forward_alone_s,
            "forward_in_cycle_ms": 1e3 * statistics.median(passes),
            "isend_median_ms": 1e3 * statistics.median(calls) if calls else 0.0,
            "isend_mean_ms": 1e3 * statistics.fmean(calls) if calls else 0.0,
            "receive_wait_mean_ms": 1e3 * statistics.fmean(waits) if waits else 0.0,
            "cycle_median_ms": 1e3 * statistics.median(cycle_s), "passes_per_cycle_ms": 3e3 * forward_alone_s}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--forward-ms", type=float, default=1.0)
    parser.add_argument("--cycles", type=int, default=150)
    parser.add_argument("--size-bytes", type=int, default=128 << 10)
    args = parser.parse_args()
    if args.world_size < 2:
        print(f"--world-size: needs 2 or more ranks, got {args.world_size}", file=sys.stderr)
        return 2
    if args.cycles <= DROPPED_CYCLES + args.world_size + 1:
        print(f"--cycles: needs more than {DROPPED_CYCLES + args.world_size + 1}, got {args.cycles}", file=sys.stderr)
        return 2
    config = LaunchConfig(world_size=args.world_size, backend="gloo", device="cpu", timeout_s=300.0)
    try:
        rows = spawn(cycle_rank_main, (args.forward_ms / 1e3, args.cycles, args.size_bytes), config)
    except RankFailure as failure:
        print(failure, file=sys.stderr)
        return 2
    print(f"{args.world_size} ranks, asynchronous 1F1B cycle, forward {args.forward_ms} ms, "
          f"{args.size_bytes} B messages")
    for row in rows:
        print(f"rank {row['rank']}: forward alone {row['forward_alone_ms']:.2f} ms, in the cycle "
              f"{row['forward_in_cycle_ms']:.2f} | isend median {row['isend_median_ms']:.3f} mean "
              f"{row['isend_mean_ms']:.3f} ms | receive wait mean {row['receive_wait_mean_ms']:.2f} ms | "
              f"cycle median {row['cycle_median_ms']:.2f} ms against {row['passes_per_cycle_ms']:.2f} ms of passes "
              f"({row['cycle_median_ms'] / row['passes_per_cycle_ms']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
