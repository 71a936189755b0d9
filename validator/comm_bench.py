"""Communication microbenchmarks for calibration: point-to-point ping-pong, allreduce and allgather
per message size, on the process group's backend (gloo on CPU, nccl on CUDA).

A collective's figure is the *mean* of `repeats` timed samples after `warmup` untimed ones, a
point-to-point figure their *median*; a sample is one operation, timed with wall time
(`time.perf_counter`; on CUDA the device is synchronised before each clock read), each after a
world-wide barrier. `validator.calibrate` fits the figures to alpha + size / beta.

Why the mean for collectives: a training step issues many of them and pays their sum, whose
expectation is the sum of their expectations (linearity of expectation). The median is that
expectation only for a symmetric spread. Where an operation is sometimes delayed by a whole
scheduling quantum (gloo on a host with as many busy threads as cores: 0.4 ms or 3.5-4 ms, the
slow mode in 25-50 % of samples), the median is the fast mode alone and the step pays more.
Where the samples are tight (NCCL on an accelerator) the two should agree. (The compute figures
average within blocks of back-to-back iterations for the same reason,
`validator.microbench._time_blocks`.)
Why the median for point-to-point: the p2p fit is the wire time of an idle exchange; what a
message costs beyond it on busy ranks is measured on its own, as means, by the message chain
(`validator.message_bench`: the LogP overheads o_s, o_r and the wake-up delay, whose mean is taken
over the p2p fit), so the p2p figure must not hold those delays a second time.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from validator import comm_device
from validator.comm_device import control_device, data_device
from validator.microbench import _sync


def _comm_device() -> torch.device:
    return control_device()


def agree_max(value: int) -> int:
    """The largest `value` over all ranks of the process group (every rank must call it)."""
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def _mean(samples: list[float], warmup: int) -> float:
    """The mean of the samples after the first `warmup` (all of them if there are no more)."""
    kept = samples[warmup:] or samples
    return float(sum(kept) / len(kept))


def _median(samples: list[float], warmup: int) -> float:
    """The median of the samples after the first `warmup` (all of them if there are no more)."""
    kept = samples[warmup:] or samples
    return float(statistics.median(kept))


def _buffer(size_bytes: int, device: torch.device) -> torch.Tensor:
    return torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)


def _size_order(count: int, repeat: int) -> list[int]:
    """Sizes in a shuffled order, a new one per repeat but the same on every rank: a message
    right after a large one is slower (the transport is still draining), and a fixed order would
    pin that penalty on one size."""
    order = list(range(count))
    random.Random(repeat).shuffle(order)
    return order


def time_p2p(sizes_bytes: Sequence[int], repeats: int = 10, warmup: int = 2, *, src: int = 0,
             dst: int = 1) -> list[float]:
    """One-way point-to-point time per size: half the median round trip of a ping-pong between
    ranks `src` and `dst` (blocking send/recv). Call on every rank of an initialised process group
    (the others only join the barriers); every rank gets the result (broadcast from `src`).
    Each repeat times every size once, in a shuffled order, each after a world-wide barrier."""
    rank, device = dist.get_rank(), _comm_device()
    buffers = [_buffer(size, data_device()) for size in sizes_bytes]
    samples: list[list[float]] = [[] for _ in sizes_bytes]
    for repeat in range(warmup + repeats):
        for position in _size_order(len(buffers), repeat):
            buffer = buffers[position]
            dist.barrier()
            if rank == src:
                _sync(buffer.device)
                start = time.perf_counter()
                comm_device.send(buffer, dst)
                comm_device.recv(buffer, dst)
                _sync(buffer.device)
                samples[position].append(time.perf_counter() - start)
            elif rank == dst:
                comm_device.recv(buffer, src)
                comm_device.send(buffer, src)
    medians = torch.zeros(len(sizes_bytes), dtype=torch.float64)
    if rank == src:
        medians = torch.tensor([_median(kept, warmup) / 2 for kept in samples], dtype=torch.float64)
    dist.barrier()
    medians = medians.to(device)
    dist.broadcast(medians, src)
    return medians.cpu().tolist()


def _time_collective(operation, count: int, repeats: int, group, warmup: int) -> list[float]:
    """Mean over repeats of `operation(position)` per position, each sample after a world-wide
    barrier, the positions in a shuffled order per repeat (`_size_order`); a sample's time is the
    slowest rank's of `group`, and every member gets the means."""
    device = _comm_device()
    samples = torch.zeros(count, warmup + repeats, dtype=torch.float64, device=device)
    for repeat in range(warmup + repeats):
        for position in _size_order(count, repeat):
            dist.barrier()
            _sync(data_device())
            start = time.perf_counter()
            operation(position)
            _sync(data_device())
            samples[position, repeat] = time.perf_counter() - start
    dist.all_reduce(samples, op=dist.ReduceOp.MAX, group=group)
    means = [_mean(row, warmup) for row in samples.cpu().tolist()]
    dist.barrier()
    return means


def time_allreduce(sizes_bytes: Sequence[int], repeats: int = 10, group=None, warmup: int = 2) -> list[float]:
    """Mean allreduce (sum, fp32) time per size within `group` (None: the whole world).

    Every rank of the world must call this at the same time, each with its own group (disjoint
    groups then run concurrently); every sample starts at a world-wide barrier, and each repeat
    visits the sizes in a shuffled order (as `time_p2p`). A sample's time is
    the slowest rank's of the group; the mean over repeats is returned to every member."""
    buffers = [_buffer(size, data_device()) for size in sizes_bytes]
    return _time_collective(lambda position: dist.all_reduce(buffers[position], group=group),
                            len(buffers), repeats, group, warmup)


def time_allgather(sizes_bytes: Sequence[int], repeats: int = 10, group=None, warmup: int = 2) -> list[float]:
    """Mean allgather time per size within `group` (None: the whole world), as `time_allreduce`;
    a size is the bytes *each rank contributes* (fp32), gathered with `dist.all_gather` into a list
    of the group's size, as the runtime's top-k exchange (`validator.runtime`) does."""
    members = dist.get_world_size(group)
    buffers = [_buffer(size, data_device()) for size in sizes_bytes]
    outputs = [[torch.empty_like(buffer) for _ in range(members)] for buffer in buffers]
    return _time_collective(lambda position: dist.all_gather(outputs[position], buffers[position], group=group),
                            len(buffers), repeats, group, warmup)
