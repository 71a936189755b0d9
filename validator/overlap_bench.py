"""Overlap microbenchmark: how much compute and communication slow each other on shared cores.

Every rank of the world runs, at the same time, three timed phases per repeat (a barrier before
each):
1. compute alone: each compute step (one per layer of the model: its forward + backward at one
   batch size) in turn, its time;
2. communication alone: a stream of `num_messages` asynchronous operations started at once and
   run back to back by the backend's worker (allreduces of one buffer among all ranks; or
   point-to-point messages from each even rank to the next odd rank), time to the last completion;
3. both: the same stream started (a thread waits for it and dates its last completion), and
   compute steps until the stream is done.
Compute slowdown = (time of the steps run in 3) / (the same steps' times in 1); communication
slowdown = (time to the last completion in 3) / (the same in 2). Medians over repeats, averaged over ranks (the
communication times: the slowest rank's). This is the situation of a data-parallel backward with
bucketed allreduces, or of a pipeline stage sending while its neighbours compute; no validated
plan is run. The calibration writes the two factors per kind into the profile's
`shared_processors` (`simulator.profile.SharedProcessors`), which `simulator.host_sharing` plays.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from validator.microbench import activation_chain

OVERLAP_KINDS = ("collective", "p2p")
DEFAULT_OVERLAP_BYTES = {"collective": 1 << 20, "p2p": 64 << 10}
"""Buffer size per operation: a gradient bucket's order of magnitude; a micro-batch's activations."""
DEFAULT_OVERLAP_MESSAGES = {"collective": 16, "p2p": 64}
MAX_STREAM_FACTOR = 16
"""At most this many times the default number of messages when lengthening a stream."""


def layer_steps(modules, inputs, output_grads) -> list[Callable[[], None]]:
    """One compute step per layer: its forward on a saved input and its backward from a saved
    output gradient (what `validator.microbench.time_layers` times)."""
    steps = []
    for index, module in enumerate(modules):
        def step(module=module, x=inputs[index], grad=output_grads[index], needs_grad=index > 0):
            x = x.detach().requires_grad_(needs_grad) if x.is_floating_point() else x
            module(x).backward(grad)
        steps.append(step)
    return steps


def _start_stream(kind: str, buffers: Sequence[torch.Tensor]) -> list:
    if kind == "collective":
        return [dist.all_reduce(buffer, async_op=True) for buffer in buffers]
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank % 2 == 0 and rank + 1 < world:
        return [dist.isend(buffer, dst=rank + 1) for buffer in buffers]
    if rank % 2 == 1:
        return [dist.irecv(buffer, src=rank - 1) for buffer in buffers]
    return []  # odd world size: the last rank only computes


def _step_times_alone_s(steps, passes: int = 2) -> list[float]:
    """Mean time of each compute step alone over `passes` passes through the steps."""
    totals = [0.0] * len(steps)
    for _ in range(passes):
        for index, step in enumerate(steps):
            started = time.perf_counter()
            step()
            totals[index] += time.perf_counter() - started
    return [total / passes for total in totals]


def _stream_alone_s(kind: str, buffers) -> float:
    start = time.perf_counter()
    for work in _start_stream(kind, buffers):
        work.wait()
    return time.perf_counter() - start


def _both_s(kind: str, buffers, steps) -> tuple[float, list[int], float]:
    """(compute time, indices of the steps run, time to the stream's last completion) with both
    running. A thread waits on the stream (gloo's point-to-point works complete only inside
    `wait()`, which runs without the GIL) and dates its end; compute steps run until it has."""
    start = time.perf_counter()
    works = _start_stream(kind, buffers)
    finished_s: list[float] = []

    def wait_all():
        for work in works:
            work.wait()
        finished_s.append(time.perf_counter() - start)

    waiter = threading.Thread(target=wait_all, daemon=True)
    waiter.start()
    ran: list[int] = []
    while not ran or waiter.is_alive():
        ran.append(len(ran) % len(steps))
        steps[ran[-1]]()
    elapsed_s = time.perf_counter() - start
    waiter.join()
    return elapsed_s, ran, finished_s[0]


def _agree_max(value: float) -> float:
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def time_overlap(steps: Sequence[Callable[[], None]], kind: str, size_bytes: int, num_messages: int,
                 repeats: int = 5, warmup: int = 1, min_steps: int = 20) -> dict:
    """Slowdowns of compute and of a `kind` stream run together (see the module docstring). The
    stream is lengthened (more messages, agreed by all ranks) until it lasts `min_steps` mean
    compute steps alone. Every rank must call it at the same time; returns the same on every rank."""
    buffer = torch.ones(max(size_bytes // 4, 1))
    _step_times_alone_s(steps, passes=1)  # warm-up
    dist.barrier()
    mean_step_s = _agree_max(statistics.fmean(_step_times_alone_s(steps, passes=1)))
    _stream_alone_s(kind, [buffer] * num_messages)
    dist.barrier()
    stream_s = _agree_max(_stream_alone_s(kind, [buffer] * num_messages))
    wanted = math.ceil(num_messages * min_steps * mean_step_s / stream_s)
    num_messages = min(max(num_messages, wanted), MAX_STREAM_FACTOR * num_messages)
    buffers = [buffer.clone() for _ in range(num_messages)]
    samples = []
    for repeat in range(warmup + repeats):
        dist.barrier()
        alone_s = _step_times_alone_s(steps)
        dist.barrier()
        stream_s = _stream_alone_s(kind, buffers)
        dist.barrier()
        both_compute_s, ran, both_stream_s = _both_s(kind, buffers, steps)
        if repeat >= warmup:
            samples.append((both_compute_s / sum(alone_s[i] for i in ran), stream_s, both_stream_s))
    columns = [statistics.median(column) for column in zip(*samples)]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, columns)
    stream_s, both_stream_s = (max(r[i] for r in everyone) for i in (1, 2))
    return {"compute_slowdown": statistics.fmean(r[0] for r in everyone), "comm_slowdown": both_stream_s / stream_s}


def model_steps(workload, batch: int, models, seed: int = 0, device: str = "cpu") -> list[Callable[[], None]]:
    """`layer_steps` of the workload's torch modules (`models`: validator.models or a stand-in), on `device`."""
    modules = [module.train() for module in models.build_modules(workload, seed=seed)]
    inputs, _ = models.make_batch(workload, batch, seed=seed)
    chain = activation_chain(modules, inputs)
    generator = torch.Generator().manual_seed(seed)
    grads = [torch.randn(output.shape, generator=generator, dtype=output.dtype) for output in chain[1:]]
    if device != "cpu":
        modules = [module.to(device) for module in modules]
        chain, grads = [tensor.to(device) for tensor in chain], [grad.to(device) for grad in grads]
    return layer_steps(modules, chain[:-1], grads)
