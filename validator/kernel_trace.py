"""The GPU kernels a step launches, read from torch.profiler: `kernel_trace` (the kernels, copies
and fills of one call, as chrome-trace events with `ts` and `dur` in microseconds) and `busy_s`
(the seconds the GPU ran any of them: the union of their intervals)."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

GPU_EVENT_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
QUIET_KINETO_LOG_LEVEL = "6"
"""Above kineto's levels: torch 2.13's kineto prints `USDT: ... profiler_start` / `profiler_stop`
lines on stderr around every profile otherwise (level 4, its default)."""


def quiet_profiler() -> None:
    """Keep torch.profiler's start / stop lines out of the user's output, unless the user set
    KINETO_LOG_LEVEL: kineto reads it when a process's first profile starts."""
    os.environ.setdefault("KINETO_LOG_LEVEL", QUIET_KINETO_LOG_LEVEL)


def kernel_trace(step, device: str) -> list[dict]:
    """The GPU kernels, copies and fills of one `step()` (none on CPU, or where the profiler
    cannot start: the caller then has no trace, not an error)."""
    if device != "cuda":
        return []
    torch.cuda.synchronize()
    quiet_profiler()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as profiler:
            step()
            torch.cuda.synchronize()
    except RuntimeError as error:
        print(f"[trace] no kernel trace: {error}", file=sys.stderr, flush=True)
        return []
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    finally:
        os.unlink(path)
    return [event for event in events if event.get("cat") in GPU_EVENT_KINDS and "dur" in event]


def busy_s(kernels: list[dict]) -> float:
    """Seconds covered by the union of the kernels' [ts, ts + dur] intervals (microseconds)."""
    covered_us, reach = 0.0, -math.inf
    for start, end in sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels):
        if end > reach:
            covered_us += end - max(start, reach)
            reach = end
    return covered_us * 1e-6
