"""How fast ranks compute inside the asynchronous 1F1B cycle on a shared CPU host, over what the
engine's processor sharing gives them (the profile's `cycle_compute` section).

The engine plays a calibrated CPU host as a processor-sharing pool (`simulator.host_sharing`): a
compute thread runs at min(1, P / n) with n threads computing and P = W / compute_slowdown[W],
measured with all W ranks computing back to back. In an asynchronous pipeline every rank
alternates short passes with messages (gloo's transport threads wake, the receiver is woken, the
caches are shared among more switches), and on the project's 2-core host with 4 ranks the passes
got less done than that pool gives them (`validator.cycle_compute_bench`, measured 2026-11-23:
0.83-0.96 at 4 ranks, 0.92-0.98 at 2).

The calibration runs the cycle with the model's own layer steps in each rank's compute windows
(`validator.handoff_bench`'s asynchronous 1F1B order), records every window's start, end and steps
done, and integrates the pool's rate over the windows actually open at each moment:

    expected steps of a window = alone rate x integral over the window of min(1, P / n(t)) dt

where n(t) is the number of windows open at t on the host. `efficiency` is the steps done over
the steps expected, median over rounds. The engine divides nothing else: it multiplies the compute
work of asynchronous plans (`pipedream`, `spectrain`, `delayed_gradient`) by 1 / efficiency on
shared hosts whose ranks outnumber their cores (`ProfileCosts.asynchronous_compute_factor`; below).
Synchronous pipelines keep factor 1 (on a shared host 1F1B and interleaved 1F1B pay the cycle's
message figures, `handoff.cycle`, as the asynchronous kinds do: `Engine._messages_as_in_cycle`;
GPipe the chain's).

Where ranks outnumber the host's cores, the rounds also measure their own pool
(since 2026-11-24, twenty-first session): the rounds' P_round = W x (a rank's steps per second,
all ranks computing for 0.4 s) / (rank 0's alone) counts every scheduler slice a rank lost, while
the engine's P = W / compute_slowdown[W] comes from medians of >= 10 ms blocks, which drop the
blocks that lost one. With 4 ranks on the project's 2 cores P_round was below P in all 27 profiles
of nine pipeline runs (1.49-1.83 against 1.73-2.16); with 2 ranks, a core each, the two straddled
(1.74-2.03 against 1.75-1.98; below in 16 of 27). Until the twenty-sixth session asynchronous
compute then paid P / (P_round x efficiency) on every pass. Since then P_round enters the engine's
pool instead, as the parallelism with all W ranks computing (`simulator.host_sharing.PoolCurve`,
every plan): the rounds' loss is paid only while more ranks compute than the host has cores, and
asynchronous compute pays 1 / efficiency everywhere. (On the Intel Xeon host the constant was 1.96
and charged the MLP's 4-stage PipeDream passes about 2x what its step spans measured:
`reports/diagnostics/pool_curve/`.)

Since the thirtieth session the factor applies only where ranks outnumber the host's cores (or a
profile without `pass_jitter` levels does not say): with a core per rank it is 1. On the Intel Xeon
host the 2-rank efficiencies were 0.91-0.985, so the factor charged 2-stage asynchronous passes
1.02-1.10x, while the runtime's step spans measured them no slower than the same plan's synchronous
passes beyond the weight copy's own costs (the transformer's 2-stage PipeDream backward 0.98-1.00x
its 1F1B backward); and the 2-stage asynchronous cases sat above the synchronous ones of their
profiles in most runs (`reports/diagnostics/cycle_efficiency/`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Window = tuple[float, float, int]
"""A compute window: (start_s, end_s, steps done), on the host's monotonic clock."""


@dataclass(frozen=True)
class CycleCompute:
    """The profile's `cycle_compute` section."""

    efficiency: float
    """Steps done in the cycle's compute windows over the processor-sharing expectation (median over rounds)."""
    round_efficiencies: tuple[float, ...] = ()
    hop_compute_s: float = 0.0
    """The backward window's length (a forward's is half), as `validator.handoff_bench` computes."""
    host_parallelism: float = 0.0
    """P = W x (a rank's rate with all W computing back to back) / (rank 0's rate alone), same rounds."""


def expected_steps(windows_by_rank: Sequence[Sequence[Window]], alone_steps_per_s: float,
                   host_parallelism: float) -> float:
    """Steps the engine's processor sharing would have every window do, given the windows open
    at each moment on one host: alone rate x the integral of min(1, P / n(t)) over each window
    (Kleinrock, Queueing Systems vol. 2, 1976, ch. 4)."""
    spans = [(start, end) for windows in windows_by_rank for start, end, _ in windows if end > start]
    edges = sorted({t for span in spans for t in span})
    total_s = 0.0  # pool-rate-weighted window time: sum over windows of the integral of min(1, P / n)
    for left, right in zip(edges, edges[1:]):
        middle = (left + right) / 2
        open_windows = sum(1 for start, end in spans if start <= middle < end)
        if open_windows:
            total_s += (right - left) * open_windows * min(1.0, host_parallelism / open_windows)
    return alone_steps_per_s * total_s


def cycle_efficiency(windows_by_rank: Sequence[Sequence[Window]], alone_steps_per_s: float,
                     host_parallelism: float) -> float:
    """Steps done in the windows over `expected_steps`."""
    expected = expected_steps(windows_by_rank, alone_steps_per_s, host_parallelism)
    if expected <= 0:
        raise ValueError("cycle_efficiency: the windows expect no steps (no window, or no rate)")
    return sum(steps for windows in windows_by_rank for _, _, steps in windows) / expected


def summarize(round_efficiencies: Sequence[float], hop_compute_s: float, host_parallelism: float) -> dict:
    """The profile's `cycle_compute` section from per-round efficiencies."""
    return {"efficiency": statistics.median(round_efficiencies),
            "round_efficiencies": list(round_efficiencies),
            "hop_compute_s": hop_compute_s, "host_parallelism": host_parallelism}


EFFICIENCY_RANGE = (0.2, 2.0)
"""What the loader accepts: outside it the measurement broke (a rank stalled, a clock jumped)."""


def parse_cycle_compute(read, document: Mapping) -> CycleCompute | None:
    """The optional `cycle_compute` section (`read`: the profile's reader, which names the field of
    any error); None when absent."""
    section = read.mapping(document, "cycle_compute", "cycle_compute", optional=True)
    if not section:
        return None
    efficiency = read.number(section, "efficiency", "cycle_compute.efficiency", positive=True)
    low, high = EFFICIENCY_RANGE
    if not low <= efficiency <= high:
        raise read.fail("cycle_compute.efficiency", f"expected a ratio between {low} and {high}, got {efficiency!r}")
    rounds = section.get("round_efficiencies") or []
    if not isinstance(rounds, list):
        raise read.fail("cycle_compute.round_efficiencies", f"expected a list of ratios, got {rounds!r}")
    return CycleCompute(
        efficiency=efficiency,
        round_efficiencies=tuple(read.number({"value": value}, "value", f"cycle_compute.round_efficiencies[{i}]",
                                             positive=True) for i, value in enumerate(rounds)),
        hop_compute_s=read.number(section, "hop_compute_s", "cycle_compute.hop_compute_s", minimum=0)
        if section.get("hop_compute_s") is not None else 0.0,
        host_parallelism=read.number(section, "host_parallelism", "cycle_compute.host_parallelism", minimum=0)
        if section.get("host_parallelism") is not None else 0.0)


def asynchronous_compute_factor(cycle: CycleCompute, core_per_rank: bool = False) -> float:
    """What the engine multiplies asynchronous pipelines' compute by on a shared host: 1 / efficiency
    where the calibration's ranks outnumbered the host's cores or the profile does not say, 1 where
    each rank had a core of its own (`core_per_rank`; module docstring; the rounds' P_round enters
    the pool's curve instead, `host_sharing.PoolCurve`)."""
    return 1.0 if core_per_rank else 1.0 / cycle.efficiency
