"""The fitted figures a calibration profile holds, one small frozen dataclass per kind: a line
vs an amount (`LinearFit`), a layer's forward and backward fits (`LayerProfile`), Hockney's
latency-bandwidth model (`AlphaBeta`, Hockney 1994), a top-k selection curve (`SelectionFit`), the
handoff of a message to a waiting receiver (`Handoff`) and the overlap benchmark's allreduce stream
(`AllreduceStream`). `simulator.profile` reads them from a profile's JSON (`PROFILE_FORMAT`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class LinearFit:
    """`intercept_s + per_unit_s x amount`, with the R^2 of the fit (None when not recorded)."""

    intercept_s: float
    per_unit_s: float
    r2: float | None = None

    def at(self, amount: float) -> float:
        return self.intercept_s + self.per_unit_s * amount


@dataclass(frozen=True)
class LayerProfile:
    index: int
    name: str
    forward: LinearFit
    backward: LinearFit
    batch_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Handoff:
    """Mean delay of a `size_bytes` message to a waiting receiver on a busy shared host, with the
    receive posted on demand and (`preposted_mean_delay_s`; None in older profiles) one ahead."""

    size_bytes: float
    mean_delay_s: float
    preposted_mean_delay_s: float | None = None
    preposted_send_post_s: float | None = None
    """The pipeline runtime's rank time per message it sends: the median `isend` call (None: not measured)."""
    preposted_ready_receive_s: float | None = None
    """Its time per message that had arrived before it was waited for: the wait and posting the next receive."""
    preposted_send_post_mean_s: float | None = None
    """The mean `isend` call (None in older profiles): the median plus the tail of calls that waited for a core."""
    preposted_ready_receive_mean_s: float | None = None
    """The mean wait on an arrived message (None in older profiles)."""
    cycle: "CycleHandoff | None" = None
    """The same pre-posted figures with every rank in the asynchronous 1F1B steady state at once
    (`handoff.cycle`; None in profiles before 2026-11-23's sixth session)."""
    runtime: "CycleHandoff | None" = None
    """The same figures timed inside the pipeline runtime running an asynchronous plan of a synthetic
    workload (`handoff.runtime`, `validator.runtime_messages_bench`; None before 2026-11-24's
    twentieth session). Asynchronous pipelines pay it on a shared CPU host with a core per rank
    (`ProfileCosts.runtime_messages`, since the twenty-second session)."""


@dataclass(frozen=True)
class CycleHandoff:
    """`handoff.cycle` (`validator.handoff_bench.time_cycle_handoffs`): a waited message's mean delay
    from its `isend`, the `isend` call and the wait on an arrived message (median and mean), with
    all ranks cycling one forward and one backward at once, as asynchronous pipelines run."""

    mean_delay_s: float
    send_post_s: float
    ready_receive_s: float
    send_post_mean_s: float
    ready_receive_mean_s: float


@dataclass(frozen=True)
class AlphaBeta:
    """Hockney's model: `latency_s + size / bandwidth_bytes_per_s`."""

    latency_s: float
    bandwidth_bytes_per_s: float
    sizes_bytes: tuple[int, ...] = ()

    def time_s(self, size_bytes: float) -> float:
        if size_bytes <= 0:
            return 0.0
        return self.latency_s + size_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class SelectionFit:
    """Top-k selection time vs elements (`TOPK_FIT` in `PROFILE_FORMAT`): piecewise-linear through
    the measured (elements, median) points inside their range, the linear fit outside."""

    fit: LinearFit
    points: tuple[tuple[float, float], ...] = ()

    def at(self, num_elements: float) -> float:
        points = self.points
        if len(points) < 2 or not points[0][0] <= num_elements <= points[-1][0]:
            return self.fit.at(num_elements)
        index = max(1, bisect.bisect_left([n for n, _ in points], num_elements))
        (n0, t0), (n1, t1) = points[index - 1], points[index]
        return t0 + (t1 - t0) * (num_elements - n0) / (n1 - n0)


@dataclass(frozen=True)
class AllreduceStream:
    """`overlap.collective`: `num_messages` asynchronous allreduces of `size_bytes` among all ranks,
    issued back to back with no compute, took `stream_s` in all."""

    size_bytes: float
    num_messages: int
    stream_s: float
