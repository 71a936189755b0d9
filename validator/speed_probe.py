"""A fixed reference kernel, timed before calibration and after validation, so that a benchmark
can say how much the machine's own speed moved in between (shared VMs drift by tens of percent
over minutes). It only reports: predictions are never corrected with it."""

from __future__ import annotations

import statistics
import time

import torch

PROBE_SIZE = 256
PROBE_ITERATIONS = 40


def reference_kernel_s(repeats: int = 7) -> float:
    """Median over `repeats` of the time of PROBE_ITERATIONS single-threaded 256 x 256 fp32
    matrix products (with their allocations, as a layer's would be)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(PROBE_SIZE, PROBE_SIZE, generator=torch.Generator().manual_seed(0))
        samples = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            for _ in range(PROBE_ITERATIONS):
                a @ a
            samples.append(time.perf_counter() - started)
        return float(statistics.median(samples[1:]))
    finally:
        torch.set_num_threads(threads)
