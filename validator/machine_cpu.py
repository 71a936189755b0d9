"""The whole machine's CPU time so far, from /proc/stat (Linux), without torch: read around a
calibration's measurements (`validator.calibration_phases`) and a diagnostic's window
(`benchmarks/host_cpu.py`)."""

from __future__ import annotations

import os
from pathlib import Path


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat; None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick
