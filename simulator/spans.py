"""What one engine run returns: its span tuples (`SPAN_FIELDS`), bytes per network tier, events
handled and collective algorithms (`EngineResult`); `simulator.records` analyses the spans."""

from __future__ import annotations

from dataclasses import dataclass

SPAN_FIELDS = ("rank", "stream", "name", "kind", "start_s", "end_s", "size_bytes", "microbatch")


@dataclass
class EngineResult:
    spans: list[tuple]
    """Tuples in SPAN_FIELDS order."""
    tier_bytes: dict[str, float]
    num_events: int
    """Discrete events handled: SimPy events processed plus action completions."""
    collective_algorithms: dict[str, int]
