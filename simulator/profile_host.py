"""What a calibration profile says about its host and its messages, read for `ProfileCosts`: the
streamed allreduce's factor, a message's costs from the `handoff` figures, whether the ranks had a
core each or outnumbered the cores, and the host's parallelism curve. Nothing here imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.host_sharing import PoolCurve
from simulator.profile import Profile
from simulator.profile_fits import CycleHandoff


def streamed_allreduce_factor(profile: Profile) -> float:
    """Time per allreduce in the overlap microbenchmark's asynchronous stream over the alpha-beta
    fit of one at a time (same size, all ranks), at most 1; 1 without the stream or the fit.
    Both are the profile's own microbenchmarks: a stream's allreduces overlap their latencies."""
    stream, fit = profile.allreduce_stream, profile.allreduce.get(profile.world_size)
    if stream is None or fit is None:
        return 1.0
    return min(1.0, stream.stream_s / stream.num_messages / fit.time_s(stream.size_bytes))


def message_costs(figures: CycleHandoff, idle_s: float) -> MessageCosts:
    """A message's costs from a section of the `handoff` figures (`cycle` or `runtime`):
    the waited delay less the idle ping-pong (`idle_s`) and the isend call (median and tail), which
    the engine plays before the send; the isend call and the wait on an arrived message as median
    and tail."""
    send_tail_s = tail_over_median_s(figures.send_post_mean_s, figures.send_post_s)
    return MessageCosts(
        handoff_s=max(0.0, figures.mean_delay_s - idle_s - figures.send_post_s - send_tail_s),
        send_post_s=figures.send_post_s, send_post_tail_s=send_tail_s,
        ready_receive_s=figures.ready_receive_s,
        ready_receive_tail_s=tail_over_median_s(figures.ready_receive_mean_s, figures.ready_receive_s))


def tail_over_median_s(mean_s: float | None, median_s: float) -> float:
    """The mean's excess over the median of a per-message time (0 where the mean was not recorded)."""
    return 0.0 if mean_s is None else max(0.0, mean_s - median_s)


@dataclass(frozen=True)
class MessageCosts:
    """A pre-posted message's costs (`ProfileCosts.handoff_preposted_s`, `send_post_s`, their tails,
    `ready_receive_s`) measured under one kind of load."""

    handoff_s: float
    send_post_s: float
    send_post_tail_s: float
    ready_receive_s: float
    ready_receive_tail_s: float


def ranks_outnumber_cores(profile: Profile) -> bool:
    """Whether the calibration's ranks outnumbered its host's cores: on such a host it also times
    whole-model passes with as many ranks as there are cores, so `pass_jitter` has a level below
    the world size (`validator.pass_jitter_bench`). False without the section."""
    jitter = profile.pass_jitter
    return jitter is not None and bool(jitter.levels) and min(jitter.levels) < profile.world_size


def ranks_have_own_cores(profile: Profile) -> bool:
    """Whether each of the calibration's ranks had a core of its own: its `pass_jitter` levels say so
    (none below the world size). False without the section: the profile does not say."""
    jitter = profile.pass_jitter
    return jitter is not None and bool(jitter.levels) and not ranks_outnumber_cores(profile)


def pool_curve(profile: Profile, host_parallelism: float) -> PoolCurve | None:
    """The host's parallelism curve (`simulator.host_sharing.PoolCurve`) where the calibration's ranks
    outnumbered its host's cores (the cores: the smallest `pass_jitter` level, the passes timed with
    as many ranks as cores) and its cycle rounds measured P_round; else None."""
    cycle = profile.cycle_compute
    if cycle is None or cycle.host_parallelism <= 0 or not ranks_outnumber_cores(profile):
        return None
    cores = min(profile.pass_jitter.levels)
    return PoolCurve(cores=cores, parallelism_at_cores=min(host_parallelism, float(cores)),
                     parallelism_all=cycle.host_parallelism, world_size=profile.world_size)
