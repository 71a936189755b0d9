"""Per-message overheads and the wake-up delay of a point-to-point message, from a chain of
computing ranks with receives posted one ahead, as the pipeline runtime (`validator.pipeline_runtime`)
posts them.

LogP (Culler et al., "LogP: towards a realistic model of parallel computation", PPoPP 1993) charges
a message o_s on the sender's and o_r on the receiver's processor besides its time on the wire; the
engine adds them to the compute stream of the ranks (`simulator.engine`, `P2PFit`):
- `send_overhead_s` o_s: the mean time of the `isend` call;
- `receive_overhead_s` o_r: the mean time from a rank reaching a receive whose message had already
  arrived to having completed it and posted its next receive (`wait()` on the done work + `irecv`).
And a message to a rank of a host whose other ranks compute reaches it later than the idle
ping-pong says (its thread, asleep in `wait()`, has to be scheduled): `SharedProcessors.wakeup_s` =
the mean delivery delay of the messages whose receiver was already waiting (from the start of the
`isend` to the receiver's `wait()` returning) minus the idle ping-pong fit p2p(size) minus o_s
(`wakeup_s`, at least 0; CPU profiles only).

The chain (the pre-refactor `validator/handoff_bench.py`'s pre-posted chain, slimmed): ranks 0 ->
1 -> ... -> W-1 pass `num_microbatches` messages of `size_bytes` down the chain and then back up;
before forwarding a message each rank computes the model's layer steps (`validator.overlap_bench`)
for its hop time, rank r for hop_compute_s x (1 + `STRETCH` x r). So going down each rank is slower
than the one feeding it and finds its messages already there (all but the first: o_r), and going up
each rank is faster and waits for every message (the delays: wake-up). The hop is fitted to the
model where that is cheap (a balanced stage's backward: `stage_hop_s`). Ranks share the host's
monotonic clock: single host only (the calibration's local spawn).

Measured on the project's 2-core CPU host (2026-11-28, quiet machine, 64 KiB): o_s 0.25-0.33 ms
(median 0.2-0.25), o_r 0.13-0.36 ms (median ~0.15) at 2 ranks; 0.77 / 0.40 ms means (medians 0.22 /
0.08 ms) at 4 ranks (the transformer). The mean delay to a waiting rank (0.32-0.36 ms at 2 ranks,
0.74 ms at 4) came out below p2p(64 KiB) + o_s every time: gloo writes a message whose receive is
posted during the `isend` call, so the call already holds most of the delivery; wakeup_s was 0.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from validator import comm_device

DEFAULT_MESSAGE_BYTES = 64 << 10
"""A micro-batch's activations in the validation models are tens to hundreds of KiB."""
DEFAULT_HOP_COMPUTE_S = 0.002
"""The hop when the model gives none, and the least one: the ready receives need a lead of
`READY_MARGIN_S`, which the stretch gives only for hops of at least 2 ms."""
MAX_HOP_COMPUTE_S = 0.05
"""Bounds the bench's time for large models (a repeat is about 2 x M x (1 + STRETCH x (W-1)) hops)."""
STRETCH = 0.5
"""Rank r computes hop x (1 + STRETCH x r): a hop of 2 ms puts 1 ms between a neighbour's message
and the rank reaching its receive."""
READY_MARGIN_S = 0.0005
"""A message sent at least this long before its receiver reached the receive had arrived (the idle
ping-pong of 64 KiB takes ~0.1 ms on the project's CPU host): the receive is the rank's own work."""
DEFAULT_MICROBATCHES = 4


def stage_hop_s(model_backward_s: float | None, world_size: int) -> tuple[float, str]:
    """The chain's hop: a balanced stage's backward (the whole model's backward over the world size),
    clamped to [DEFAULT_HOP_COMPUTE_S, MAX_HOP_COMPUTE_S]; DEFAULT_HOP_COMPUTE_S without a figure.
    Returns (seconds, where it came from)."""
    if model_backward_s is None or model_backward_s <= 0:
        return DEFAULT_HOP_COMPUTE_S, "default"
    stage_s = model_backward_s / world_size
    hop_s = min(MAX_HOP_COMPUTE_S, max(DEFAULT_HOP_COMPUTE_S, stage_s))
    return hop_s, "stage_backward" if hop_s == stage_s else "stage_backward_clamped"


def _compute_for(steps: Sequence[Callable[[], None]], duration_s: float, position: int,
                 device: torch.device) -> int:
    """Run the steps in turn (from `position`) until `duration_s` has passed; the next position."""
    end = time.perf_counter() + duration_s
    while True:
        steps[position % len(steps)]()
        position += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if time.perf_counter() >= end:
            return position


def _one_repeat(steps, buffer: torch.Tensor, num_microbatches: int, hop_s: float, repeat: int):
    """One sweep down the chain and one up on this rank: (sends as (key, sent_at, call_s), receives
    as (key, reached_at, arrived_at, done_at)); key = (repeat, direction, micro-batch, receiver)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sources = [rank - direction for direction in (1, -1) for _ in range(num_microbatches)
               if 0 <= rank - direction < world]
    buffers = [torch.empty_like(buffer) for _ in range(2)]
    posted = {"next": 0, "work": None}

    def post_next():
        if posted["next"] < len(sources):
            posted["work"] = comm_device.irecv(buffers[posted["next"] % 2], src=sources[posted["next"]])
            posted["next"] += 1

    post_next()
    sends, receives, pending, position = [], [], [], 0
    hop_rank_s = hop_s * (1 + STRETCH * rank)
    for direction in (1, -1):
        source, target = rank - direction, rank + direction
        for microbatch in range(num_microbatches):
            if 0 <= source < world:
                reached_at = time.perf_counter()
                posted["work"].wait()
                arrived_at = time.perf_counter()
                post_next()
                receives.append(((repeat, direction, microbatch, rank), reached_at, arrived_at, time.perf_counter()))
            position = _compute_for(steps, hop_rank_s, position, buffer.device)
            if 0 <= target < world:
                outgoing = buffer.clone()
                sent_at = time.perf_counter()
                pending.append(comm_device.isend(outgoing, dst=target))
                sends.append(((repeat, direction, microbatch, target), sent_at, time.perf_counter() - sent_at))
    for work in pending:
        work.wait()
    return sends, receives


def time_messages(steps: Sequence[Callable[[], None]], hop_compute_s: float,
                  size_bytes: int = DEFAULT_MESSAGE_BYTES, num_microbatches: int = DEFAULT_MICROBATCHES,
                  repeats: int = 10, warmup: int = 2) -> dict:
    """The chain (module docstring) `warmup + repeats` times, each after a barrier; the summary of
    the timed repeats (`message_summary`), the same on every rank. Every rank calls it at once
    (world size >= 2)."""
    if dist.get_world_size() < 2:
        raise ValueError("the message chain needs at least 2 ranks")
    buffer = torch.ones(max(size_bytes // 4, 1), device=comm_device.data_device())
    sends, receives = [], []
    for repeat in range(warmup + repeats):
        dist.barrier()
        sent, received = _one_repeat(steps, buffer, num_microbatches, hop_compute_s, repeat)
        if repeat >= warmup:
            sends += sent
            receives += received
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (sends, receives))
    return message_summary(everyone, size_bytes, hop_compute_s, num_microbatches)


# ----------------------------------------------------------------------------- pure functions


def _mean_median(values: Sequence[float]) -> tuple[float | None, float | None]:
    return (statistics.fmean(values), statistics.median(values)) if values else (None, None)


def message_summary(everyone: Sequence[tuple], size_bytes: int, hop_compute_s: float,
                    num_microbatches: int, ready_margin_s: float = READY_MARGIN_S) -> dict:
    """The chain's figures from every rank's records (`_one_repeat`'s (sends, receives)):
    - `send_call_*`: the `isend` calls (o_s: the mean);
    - `ready_receive_*`: receives of messages sent at least `ready_margin_s` before the rank reached
      the receive, from reaching it to its next receive posted (o_r: the mean);
    - `delay_*`: messages sent after their receiver reached the receive (it waited), from the start
      of the `isend` to the receiver's `wait()` returning (the delivery delay).
    Means and medians (they differ: a thread waiting for a core makes a long tail); None where the
    chain gave no such message."""
    sent_at, calls = {}, []
    for sends, _ in everyone:
        for key, started, call_s in sends:
            sent_at[tuple(key)] = started
            calls.append(call_s)
    delays, ready = [], []
    for _, receives in everyone:
        for key, reached_at, arrived_at, done_at in receives:
            lead = reached_at - sent_at[tuple(key)]
            if lead < 0:
                delays.append(arrived_at - sent_at[tuple(key)])
            elif lead >= ready_margin_s:
                ready.append(done_at - reached_at)
    summary = {"world_size": len(everyone), "size_bytes": size_bytes, "hop_compute_s": hop_compute_s,
               "num_microbatches": num_microbatches, "num_sends": len(calls), "num_waited": len(delays),
               "num_ready": len(ready)}
    for name, values in (("send_call", calls), ("ready_receive", ready), ("delay", delays)):
        summary[f"{name}_mean_s"], summary[f"{name}_median_s"] = _mean_median(values)
    return summary


def wakeup_s(mean_delay_s: float, p2p_s: float, send_overhead_s: float) -> float:
    """The wake-up delay: the mean delivery delay to a waiting rank while the host's other ranks
    compute, less the idle ping-pong's time of the same message and the sender's isend call; >= 0."""
    return max(0.0, mean_delay_s - p2p_s - send_overhead_s)
