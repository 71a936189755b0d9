"""Handoff microbenchmark: how long a message takes to reach a rank that is waiting for it while
other ranks of the same host compute.

The ping-pong of `validator.comm_bench.time_p2p` runs with every other rank idle. In a pipeline or
model-parallel step on a host with fewer cores than ranks, the receiver sleeps in `wait()` while
its neighbours compute; waking it (and the sender's communication thread) goes through the OS
scheduler, which here took a few tenths of a millisecond in the median but milliseconds in the
tail (traces of validation runs: 0.3 ms median, 0.75-0.95 ms mean, 2-2.6 ms at the 90th
percentile at 4 ranks on 2 cores), against ~0.1 ms for the idle ping-pong.

The benchmark: all ranks form a chain 0 -> 1 -> ... -> W-1 and pass `num_microbatches` messages of
`size_bytes` down the chain and then back up (a forward and a backward sweep); before forwarding,
each rank computes for `hop_compute_s` (the model's own layer steps, forward + backward, in
turn, as in `validator.overlap_bench`). A message's handoff delay is the time from the sender's
`isend` to the end of the receiver's `wait()`, counted only when the receiver was already waiting
when the message was sent (ranks share the host's monotonic clock: single host only). Reported:
the mean (what adds up along a critical path) and the median over all such messages; no
validated plan is run. The simulator adds `mean_delay_s` minus the idle ping-pong time of the
same message to every point-to-point arrival on a shared host (`ProfileCosts.handoff_s`).

The same chain also times the rank's own work per message, which a pipeline step pays on its
thread whether or not anyone waits: the `isend` call (`send_post_s`, median; ~0.1 ms here for a
64 KiB tensor) and the `wait()` on a message sent at least `READY_MARGIN_S` before the receiver
came to it (`ready_receive_s`, median: the wait on a completed receive plus posting the next one,
~0.1 ms here). In interleaved 1F1B (v = 2, 2 stages, 4 micro-batches) a rank sends and receives 12
messages a step against 4 in 1F1B; replaying measured steps with their measured passes put the
engine 17 % short for interleaved and 4 % for 1F1B without this work, 12 % and 2 % with it.

Two receive protocols, timed separately because they hand off differently: `preposted=False`
posts each receive when the rank is ready to wait for it (`dist.recv`, as the model-parallel
runtime `validator.runtime` does); `preposted=True` keeps the next receive posted one ahead (an
`irecv` posted as soon as the previous one completed, as the pipeline runtime
`validator.pipeline_runtime` does). Measured here, the same chain both ways a minute apart, 4 ranks
on 2 cores: the median delay 0.20-0.25 ms on demand and 0.28-0.35 ms pre-posted in every pair; the
means (tail-dominated) 0.62-0.91 vs 0.81-1.25 ms; at 2 ranks the pre-posted mean came out lower
(0.40-0.61 vs 0.46-0.99 ms).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from validator import comm_device
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

DEFAULT_HANDOFF_BYTES = 64 << 10
"""A micro-batch's activations in the validation models are tens to hundreds of KiB."""
READY_MARGIN_S = 0.0005
"""A message sent this long before its receiver reached `wait()` has arrived (the idle ping-pong of
a handoff-sized message takes ~0.1 ms here): the wait is the rank's own time, not a handoff."""
DEFAULT_HOP_COMPUTE_S = 0.002
"""Compute between handoffs: the order of a pipeline stage's pass over one micro-batch here."""


def _compute_for(steps: Sequence[Callable[[], None]], duration_s: float, position: int,
                 device: torch.device) -> int:
    """Run steps in turn (from `position`) until `duration_s` has passed; the next position. On a
    GPU the kernels are waited for, so that a send after it times the message's own staging, as
    the simulator plays it after a pass whose duration is the kernels' time."""
    end = time.perf_counter() + duration_s
    while True:
        steps[position % len(steps)]()
        position += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if time.perf_counter() >= end:
            return position


class _Receives:
    """This rank's receives from `sources`, in order; `preposted`: the next one always posted."""

    def __init__(self, buffer: torch.Tensor, sources: Sequence[int], preposted: bool):
        self.sources = list(sources)
        self.buffers = [torch.empty_like(buffer) for _ in range(2)]
        self.preposted, self.next, self.posted = preposted, 0, None
        if preposted:
            self._post()

    def _post(self) -> None:
        if self.next < len(self.sources):
            self.posted = comm_device.irecv(self.buffers[self.next % 2], src=self.sources[self.next])
            self.next += 1

    def wait(self) -> None:
        if not self.preposted:
            comm_device.irecv(self.buffers[0], src=self.sources[self.next]).wait()
            self.next += 1
            return
        self.posted.wait()
        self._post()


def _timed_send(buffer: torch.Tensor, target: int, key: tuple, sends: list, pending: list, posts: list) -> None:
    """`isend` a copy of `buffer` to `target`: its work into `pending`, the call's duration into
    `posts`, (*key, target, start time) into `sends`."""
    outgoing = buffer.clone()
    sent_at = time.perf_counter()
    pending.append(comm_device.isend(outgoing, dst=target))
    posts.append(time.perf_counter() - sent_at)
    sends.append((*key, target, sent_at))


def _sweeps(steps, buffer: torch.Tensor, num_microbatches: int, hop_compute_s: float, repeat: int,
            preposted: bool = False):
    """One forward and one backward sweep on this rank: (sends, receives) with monotonic times."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sends, receives, pending, posts, position = [], [], [], [], 0
    sources = [rank - direction for direction in (1, -1) for _ in range(num_microbatches)
               if 0 <= rank - direction < world]  # one sweep down, one up
    incoming = _Receives(buffer, sources, preposted)
    for direction in (1, -1):
        source, target = rank - direction, rank + direction
        for microbatch in range(num_microbatches):
            if 0 <= source < world:
                waited_from = time.perf_counter()
                incoming.wait()
                receives.append((repeat, direction, microbatch, rank, waited_from, time.perf_counter()))
            position = _compute_for(steps, hop_compute_s, position, buffer.device)
            if 0 <= target < world:
                _timed_send(buffer, target, (repeat, direction, microbatch), sends, pending, posts)
    for work in pending:
        work.wait()
    return sends, receives, posts


def time_handoffs(steps: Sequence[Callable[[], None]], size_bytes: int = DEFAULT_HANDOFF_BYTES,
                  hop_compute_s: float = DEFAULT_HOP_COMPUTE_S, num_microbatches: int = 4,
                  repeats: int = 10, warmup: int = 2, preposted: bool = False) -> dict:
    """Handoff delays of a chain of all ranks (see the module docstring) with receives posted on
    demand or, `preposted`, one ahead. Every rank must call it at the same time; returns the same
    dict on every rank."""
    buffer = torch.ones(max(size_bytes // 4, 1), device=comm_device.data_device())
    sends, receives, posts = [], [], []
    for repeat in range(warmup + repeats):
        dist.barrier()
        sent, received, posted = _sweeps(steps, buffer, num_microbatches, hop_compute_s, repeat, preposted)
        if repeat >= warmup:
            sends += sent
            receives += received
            posts += posted
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (sends, receives, posts))
    return handoff_summary(everyone, size_bytes, hop_compute_s, num_microbatches)


def handoff_summary(everyone: Sequence[tuple], size_bytes: int, hop_compute_s: float,
                    num_microbatches: int) -> dict:
    """Mean and median delay of the messages whose receiver was waiting when they were sent; and the
    rank's own time on each message: the `isend` call (`send_post_s` median, `send_post_mean_s`
    mean) and the `wait()` on a message sent at least `READY_MARGIN_S` before the wait began
    (`ready_receive_s` median, `ready_receive_mean_s` mean: the wait returns at once, plus posting
    the next receive where receives are posted one ahead; None if no message was that early). Both
    have a long tail on a shared host (the thread waiting for a core), so mean and median differ.

    `everyone`: per rank, (sends as (repeat, direction, microbatch, target, sent_at), receives as
    (repeat, direction, microbatch, rank, waited_from, done_at)[, isend call durations]).
    ValueError if no message met a waiting receiver (then the chain had no handoff to time)."""
    sent_at = {key[:4]: key[4] for sends, *_ in everyone for key in sends}
    receives = [(done - sent_at[(repeat, direction, microbatch, rank)], waited_from - sent_at[(repeat, direction, microbatch, rank)],
                 done - waited_from)
                for _, received, *_ in everyone
                for repeat, direction, microbatch, rank, waited_from, done in received]
    delays = [delay for delay, lead, _ in receives if lead < 0]
    if not delays:
        raise ValueError("handoff benchmark: no message found its receiver waiting")
    ready = [waited for _, lead, waited in receives if lead >= READY_MARGIN_S]
    posts = [post for _, _, *rest in everyone for post in (rest[0] if rest else [])]
    return {"world_size": len(everyone), "size_bytes": size_bytes, "hop_compute_s": hop_compute_s,
            "num_microbatches": num_microbatches, "num_messages": len(delays),
            "mean_delay_s": statistics.fmean(delays), "median_delay_s": statistics.median(delays),
            "send_post_s": statistics.median(posts) if posts else None,
            "send_post_mean_s": statistics.fmean(posts) if posts else None,
            "ready_receive_s": statistics.median(ready) if ready else None,
            "ready_receive_mean_s": statistics.fmean(ready) if ready else None, "num_ready": len(ready)}


def cycle_order(rank: int, world: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Asynchronous 1F1B on stage `rank` of `world`: world-1-rank forwards, then one forward and one
    backward in turn, then the remaining backwards; (pass, micro-batch) in order."""
    warmup = min(world - 1 - rank, num_microbatches)
    order = [("F", microbatch) for microbatch in range(warmup)]
    for microbatch in range(warmup, num_microbatches):
        order += [("F", microbatch), ("B", microbatch - warmup)]
    return order + [("B", microbatch) for microbatch in range(num_microbatches - warmup, num_microbatches)]


def run_cycle(steps, buffer: torch.Tensor, num_microbatches: int, hop_compute_s: float, repeat: int,
           windows: list | None = None, forward_share: float = 0.5):
    """One asynchronous 1F1B run of `num_microbatches` on this rank (receives posted one ahead, as
    `validator.pipeline_runtime`): a forward computes hop_compute_s x `forward_share`, a backward
    hop_compute_s.
    (sends, receives, isend calls) as `_sweeps` records them, direction +1 for activations, -1 for
    gradients. `windows`, if given, gets (start, end, steps done) of every compute window
    (`validator.cycle_compute_bench`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    order = cycle_order(rank, world, num_microbatches)
    sources = [rank - 1 if step == "F" else rank + 1 for step, _ in order
               if (step == "F" and rank > 0) or (step == "B" and rank < world - 1)]
    incoming = _Receives(buffer, sources, preposted=True)
    sends, receives, pending, posts, position = [], [], [], [], 0
    for step, microbatch in order:
        direction = +1 if step == "F" else -1
        if 0 <= rank - direction < world:
            waited_from = time.perf_counter()
            incoming.wait()
            receives.append((repeat, direction, microbatch, rank, waited_from, time.perf_counter()))
        duration_s = hop_compute_s * forward_share if step == "F" else hop_compute_s
        started = time.perf_counter()
        done = _compute_for(steps, duration_s, position, buffer.device)
        if windows is not None:
            windows.append((started, time.perf_counter(), done - position))
        position = done
        target = rank + direction
        if 0 <= target < world:
            _timed_send(buffer, target, (repeat, direction, microbatch), sends, pending, posts)
    for work in pending:
        work.wait()
    return sends, receives, posts


def time_cycle_handoffs(steps: Sequence[Callable[[], None]], size_bytes: int = DEFAULT_HANDOFF_BYTES,
                        hop_compute_s: float = DEFAULT_HOP_COMPUTE_S, num_microbatches: int = 24,
                        repeats: int = 3, warmup: int = 1) -> dict:
    """The pre-posted handoff figures again, with every rank in the asynchronous 1F1B steady state at
    once (all stages computing, as PipeDream and SpecTrain run) instead of one hop at a time along a
    chain. Only the steady state counts: messages of micro-batches `world` .. num_microbatches -
    world - 1 (the fill and drain dropped). Every rank must call it at the same time; returns the
    same dict on every rank (`handoff_summary`'s keys)."""
    world = dist.get_world_size()
    if num_microbatches < 2 * world + 2:
        raise ValueError(f"num_microbatches: the cycle needs at least {2 * world + 2} for a steady state, "
                         f"got {num_microbatches}")
    buffer = torch.ones(max(size_bytes // 4, 1), device=comm_device.data_device())
    sends, receives, posts = [], [], []
    for repeat in range(warmup + repeats):
        dist.barrier()
        sent, received, posted = run_cycle(steps, buffer, num_microbatches, hop_compute_s, repeat)
        if repeat >= warmup:
            steady = range(world, num_microbatches - world)
            sends += [record for record in sent if record[2] in steady]
            receives += [record for record in received if record[2] in steady]
            posts += [call for call, record in zip(posted, sent) if record[2] in steady]
    everyone = [None] * world
    dist.all_gather_object(everyone, (sends, receives, posts))
    return handoff_summary(everyone, size_bytes, hop_compute_s, num_microbatches)


PREPOSTED_KEYS = ("num_messages", "mean_delay_s", "median_delay_s", "send_post_s", "send_post_mean_s",
                  "ready_receive_s", "ready_receive_mean_s", "num_ready")
"""What a profile keeps of the pre-posted chain (`handoff.preposted`)."""


CYCLE_REPEATS = 24
"""Asynchronous 1F1B runs of 24 micro-batches timed for `handoff.cycle` (about 0.1 s each here).
The section's means sit on a heavy tail (a call or a wait now and then lasts a scheduler slice): with
6 runs (about 50 waited messages at 2 ranks) the mean isend call of one profile came out 1.45 ms where
same-day re-measurements gave 0.33-0.75 ms (2026-11-24), so four times as many."""


def stage_hop_compute_s(steps: Sequence[Callable[[], None]], minimum_s: float = DEFAULT_HOP_COMPUTE_S) -> float:
    """The cycle's backward window fitted to the model: a balanced stage's share of one forward and
    backward over every layer (each layer step timed once, after one untimed call, every rank at
    once; the median over ranks of their sums, over the world size), two thirds of it (a forward
    window is half a backward one); at least `minimum_s`. Every rank must call it at the same time.

    Why: with a fixed 2 ms window, the transformer's 9-16 ms layer steps overran every window, and
    its 2-rank cycle gave a mean isend call of 2.1-2.6 ms (median 1.7-2.1 ms) where its validated
    PipeDream's isend calls averaged 0.2 ms; with a 16 ms window the same cycle gave 0.7-0.8 ms
    (`reports/diagnostics/cycle_window/`)."""
    world = dist.get_world_size()
    for step in steps:
        step()
    total_s = 0.0
    for step in steps:
        started = time.perf_counter()
        step()
        total_s += time.perf_counter() - started
    everyone = [None] * world
    dist.all_gather_object(everyone, total_s)
    return max(minimum_s, statistics.median(everyone) / world * 2 / 3)


def measure_cycle(steps: Sequence[Callable[[], None]], repeats: int = CYCLE_REPEATS) -> dict | None:
    """The profile's `handoff.cycle` (`time_cycle_handoffs`, its backward window fitted to the model
    by `stage_hop_compute_s`, kept as `hop_compute_s`), or None if the cycle found no waited or no
    arrived message to time. Every rank must call it at the same time."""
    hop_compute_s = stage_hop_compute_s(steps)
    cycle = time_cycle_handoffs(steps, hop_compute_s=hop_compute_s, repeats=repeats)
    kept = {key: cycle[key] for key in PREPOSTED_KEYS if cycle[key] is not None}
    return {**kept, "hop_compute_s": hop_compute_s} if all(key in kept for key in CYCLE_REQUIRED_KEYS) else None


CYCLE_REQUIRED_KEYS = ("mean_delay_s", "send_post_s", "ready_receive_s", "send_post_mean_s", "ready_receive_mean_s")
"""What `simulator.profile` reads of `handoff.cycle`."""


def measure_handoff(steps: Sequence[Callable[[], None]], repeats: int, warmup: int,
                    say: Callable[[str], None] = lambda message: None) -> dict:
    """The profile's `handoff` section: the chain with receives on demand (top level) and posted one
    ahead (`preposted`), and every rank in the asynchronous cycle at once (`cycle`, if it timed
    both kinds of message). Every rank must call it at the same time."""
    say(f"handoff: messages along a chain of {dist.get_world_size()} computing ranks, receives on demand")
    handoff = time_handoffs(steps, repeats=repeats, warmup=warmup)
    say("handoff: the same chain, receives posted one ahead")
    preposted = time_handoffs(steps, repeats=repeats, warmup=warmup, preposted=True)
    handoff["preposted"] = {key: preposted[key] for key in PREPOSTED_KEYS if preposted[key] is not None}
    say("handoff: every rank in the asynchronous 1F1B cycle at once")
    cycle = measure_cycle(steps)
    if cycle is not None:
        handoff["cycle"] = cycle
    return handoff


def handoff_rank_main(rank: int, workload, batch: int, models, seed: int, repeats: int, warmup: int,
                      cycle_only: bool = False) -> dict | None:
    """A launch that measures the handoff section alone (`benchmarks/handoff_recalibrate.py`): each
    rank computes the workload's layer steps on its launch's device between hops. `cycle_only`:
    just `handoff.cycle` (None if it timed no waited or no arrived message)."""
    steps = model_steps(workload, batch, load_models_module(models), seed=seed, device=str(comm_device.data_device()))
    handoff = measure_cycle(steps) if cycle_only else measure_handoff(steps, repeats, warmup)
    return handoff if rank == 0 else None
