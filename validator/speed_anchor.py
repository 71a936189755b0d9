"""Speed anchor: the machine's compute speed during a validation launch, relative to its
calibration, from a microbenchmark timed inside the launch (never from the plan's steps).

Why: on a shared host the speed a calibration catches and the speed of a launch minutes later
differ. Measured on this project's 2-core CPU machine: one launch's step median scatters by
13-22 % (coefficient of variation) from launch to launch, and a benchmark's cases calibrated
together were all off by the same amount (mean signed error per calibration -43 to +31 %).
A reference kernel timed in a separate process around each launch did not follow the launches
(correlation ~0); the whole-model passes timed by the launch's own ranks did (32 launches each
of three cases: correlation 0.67-0.69 with the launch's step median over its prediction).

How: every rank times `passes` whole-model forward + backward passes (the calibration's
`pass_jitter` microbenchmark, `validator.pass_jitter_bench`, same batch size, all ranks at once)
before its warm-up steps and again after its measured steps. A launch's speed ratio is the median
of those times over the median of the calibration's own passes with all ranks at once
(`pass_jitter.times_s[world_size]`); a case's ratio is the median over its launches. The anchored
prediction is the plan simulated with every compute cost (layers, update, weight passes) times the
ratio (`ProfileCosts.speed_factor`); communication fits are left as calibrated.

Measured (bench_validation, 15 cases, 8 launches each): the anchored predictions scored a MAPE of
17.0 % (worst 32.6 %) against the calibration's own 12.5 % (24.8 %); across cases the whole-model
passes do not set the level of a plan's step (the ResNet's ran 0.75-0.91x the calibration's while
its plans ran slower than predicted). So the validator's prediction stays the calibration's; the
anchored figures are printed beside it as a diagnostic of the machine's speed.
"""

from __future__ import annotations

import statistics

import torch.distributed as dist

from validator.pass_jitter_bench import time_model_passes

DEFAULT_ANCHOR_PASSES = 8
"""Timed passes before and again after a launch's steps (each burst after one untimed pass)."""


def anchor_passes_s(workload, batch_size: int, passes: int, device: str) -> list[float]:
    """One burst of the anchor on this rank (collective: every rank of the launch calls it)."""
    return time_model_passes(workload, batch_size, passes, device=device, warmup=1, barrier=dist.barrier)


def calibration_anchor_s(pass_jitter, world_size: int) -> float | None:
    """Median whole-model pass of the calibration with `world_size` ranks at once, in seconds;
    None when the profile has no such level (older profiles, or another world size)."""
    if pass_jitter is None or world_size not in pass_jitter.times_s:
        return None
    return float(statistics.median(t for row in pass_jitter.times_s[world_size] for t in row))


def launch_speed_ratio(rank_anchor_s: list[list[float]], calibration_s: float) -> float:
    """A launch's anchor (all its ranks' passes, median) over the calibration's: > 1 = slower now."""
    times = [t for rank_times in rank_anchor_s for t in rank_times]
    if not times:
        raise ValueError("the launch timed no anchor passes")
    return float(statistics.median(times)) / calibration_s
