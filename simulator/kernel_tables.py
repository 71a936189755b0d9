"""Measured kernel tables (`ghpsim calibrate --kernels`) as the kernel model reads them: GEMM tile
efficiencies on an (M, N, K) grid per dtype and memory-bound efficiency against size, both
interpolated in log space (`simulator.kernel_costs` uses them in place of its ceilings)."""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

Axes = tuple[tuple[float, ...], ...]
DTYPE_STAND_INS = {"bf16": ("fp16",), "fp16": ("bf16",), "tf32": ("fp32",)}
"""A dtype without measured GEMMs takes these dtypes' rows (same peaks on every catalogue GPU)."""


def interpolate_log(axes: Axes, values: tuple[float, ...], point: tuple[float, ...]) -> float:
    """Multilinear interpolation of `values` (on the product grid of `axes`, last axis fastest) at
    `point`, each coordinate in log space and clamped to its axis's range."""
    corners = []
    for axis, x in zip(axes, point):
        x = min(max(x, axis[0]), axis[-1])
        hi = bisect.bisect_left(axis, x)
        lo = max(hi - 1, 0)
        w = math.log(x / axis[lo]) / math.log(axis[hi] / axis[lo]) if hi else 0.0
        corners.append(((lo, 1.0 - w), (hi, w)))
    total = 0.0
    for corner in itertools.product(*corners):
        flat, weight = 0, 1.0
        for (index, share), axis in zip(corner, axes):
            flat, weight = flat * len(axis) + index, weight * share
        total += weight * values[flat]
    return total


@dataclass(frozen=True)
class MeasuredTables:
    """Kernel timings of one GPU (`simulator.profile.KernelMeasurements`), as the model reads them.

    * GEMM: per dtype, each measured shape's tile efficiency (with which `tiled_compute_s` takes
      the measured time less the launch) on a grid of M, N, K values, interpolated multilinearly
      in (log M x batch_count, log N, log K) and clamped to the grid; the tile / wave model then
      times the GEMM with it. A dtype without rows (nor `DTYPE_STAND_INS`) keeps gemm_efficiency.
    * memory-bound: e(S) = S / ((time - launch) x datasheet bandwidth) per measured size S of bytes
      moved, linear in log S; S bytes take S / (bandwidth x e(S)), e constant above the largest
      size, the smallest size's time below it (the latency floor, which e includes)."""

    gemm: tuple[tuple[str, Axes, tuple[float, ...]], ...] = ()
    """(dtype, (M values, N values, K values), tile efficiencies with K fastest)."""
    memory_sizes_bytes: tuple[float, ...] = ()
    memory_efficiencies: tuple[float, ...] = ()

    @classmethod
    def from_rows(cls, gemm_rows, memory_rows) -> "MeasuredTables":
        """From `(dtype, m, n, k, tile_efficiency)` and `(size_bytes, efficiency)` rows (each
        dtype's rows a full grid)."""
        grids, table = [], {(d, m, n, k): e for d, m, n, k, e in gemm_rows}
        for dtype in sorted({key[0] for key in table}):
            axes = tuple(tuple(sorted({key[i] for key in table if key[0] == dtype})) for i in (1, 2, 3))
            grids.append((dtype, axes, tuple(table[(dtype, *shape)] for shape in itertools.product(*axes))))
        memory = sorted(memory_rows)
        return cls(tuple(grids), tuple(size for size, _ in memory), tuple(e for _, e in memory))

    def gemm_grid(self, dtype: str) -> tuple[Axes, tuple[float, ...]] | None:
        grids = {name: (axes, values) for name, axes, values in self.gemm}
        return next((grids[d] for d in (dtype, *DTYPE_STAND_INS.get(dtype, ())) if d in grids), None)

    def stream_s(self, size_bytes: float, bandwidth_bytes_per_s: float) -> float:
        size = max(size_bytes, self.memory_sizes_bytes[0])
        return size / (bandwidth_bytes_per_s * interpolate_log((self.memory_sizes_bytes,), self.memory_efficiencies,
                                                               (size,)))
