"""Per-layer costs of the weight passes and of the update timed in cycle, from the calibration's sets.

The calibration (`validator.calibration_phases`) times the asynchronous runtimes' weight passes
(stash, predict, repredict, accumulate, average, copy_forward) and the update in cycle over each
single layer and each prefix of layers (`calibration_layer_sets`), and fits `intercept + per_param x
parameters` to those medians. On this project's CPU host the cost is per layer rather than per
parameter: a ResNet-20 single layer's stash took 0.027-0.029 ms whatever its size (3.5k-18.6k
parameters), prefixes grew by about 0.03 ms a layer (the runtime loops over layers and tensors), and
in a validated 2-stage PipeDream the last stage (few layers, most parameters) ran its accumulate,
update and stash at 0.40-0.54x the parameter fit while the first stage (many small layers) ran them at
1.2-1.5x (reports/ACCURACY.md, 2026-11-24).

Where the profile keeps the sets' medians, a pass over a stage costs the sum of its layers'
single-layer medians times r(P): P the stage's parameters, r each prefix's median over the sum of
its layers' singles, interpolated linearly in P between the prefixes (the first prefix's ratio, 1,
below; the last one's beyond). The prefixes' growth beyond their singles is the cost of a larger
working set, so a stage pays the growth of a set of its own size. The sets are rebuilt from the
workload's parameter counts by the calibration's own rule (which layers have weights); a pass whose
number of sets differs keeps its fit. (Since the twenty-seventh session, kept after a fresh run:
`reports/diagnostics/size_curve/`; on the Intel Xeon host the MLP's prefixes cost 1.0-1.1x their
singles up to 2.6 M parameters and 1.4-1.7x from 3.7 M on.)

Until then the per-layer costs c_l >= 0 were fitted by non-negative least squares to singles and
prefixes together (`per_layer_costs`, kept for the what-ifs): the prefixes' growth landed on the
later layers, and a 2-stage MLP's last stage (3.2 M parameters) paid 1.5-1.7x what the runtime's
step spans measured for its update, stash and accumulate.

Tried and not kept (2026-11-24, `reports/diagnostics/stage_ranges/results.md`): timing every
contiguous range of layers and costing a stage by its own range's median. On a fresh held-out run it
scored MAPE 8.8 % / worst 24.9 % against 8.4 / 23.6 for the least-squares costs on the same
measurements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

UPDATE = "update"
"""The key of the update timed in cycle (`optimizer.in_cycle`) among the per-layer costs."""


def timed_layer_sets(params: Sequence[int]) -> list[tuple[int, ...]]:
    """The layer sets the calibration times the update and the weight passes over
    (`validator.calibration_phases`): each single layer, then each prefix, in order, a set kept when
    no earlier one covered the same layers with weights."""
    sets, seen = [], set()
    for end in range(1, len(params) + 1):
        for candidate in ((end - 1,), tuple(range(end))):
            key = tuple(layer for layer in candidate if params[layer] > 0)
            if key and key not in seen:
                seen.add(key)
                sets.append(candidate)
    return sets


def calibration_layer_sets(params: Sequence[int]) -> list[tuple[int, ...]]:
    """`timed_layer_sets` as their layers with weights (the layers a pass's cost is spread over)."""
    return [tuple(layer for layer in layers if params[layer] > 0) for layers in timed_layer_sets(params)]


def nonnegative_least_squares(matrix: np.ndarray, target: np.ndarray, max_iterations: int = 200) -> np.ndarray:
    """x >= 0 minimising |matrix x - target| (Lawson & Hanson, "Solving Least Squares Problems", 1974,
    ch. 23: the active-set method)."""
    rows, columns = matrix.shape
    x, passive = np.zeros(columns), np.zeros(columns, dtype=bool)
    tolerance = 1e-12 * max(1.0, float(np.abs(matrix).max()) * float(np.abs(target).max()))
    for _ in range(max_iterations):
        gradient = matrix.T @ (target - matrix @ x)
        candidates = ~passive & (gradient > tolerance)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            trial = np.zeros(columns)
            trial[passive] = np.linalg.lstsq(matrix[:, passive], target, rcond=None)[0]
            if (trial[passive] > 0).all():
                x = trial
                break
            shrinking = passive & (trial <= 0)
            gaps = x[shrinking] - trial[shrinking]  # >= 0: x > 0 or a new column at 0
            step = float(np.min(np.divide(x[shrinking], gaps, out=np.zeros_like(gaps), where=gaps > 0)))
            x = x + step * (trial - x)
            passive &= x > tolerance
            x[~passive] = 0.0
    return x


def per_layer_costs(layer_sets: Sequence[Sequence[int]], medians_s: Sequence[float], num_layers: int) -> np.ndarray:
    """c_l >= 0 with sum over each set's layers close to its median (least squares)."""
    matrix = np.zeros((len(layer_sets), num_layers))
    for row, layers in enumerate(layer_sets):
        matrix[row, list(layers)] = 1.0
    return nonnegative_least_squares(matrix, np.asarray(medians_s, dtype=float))


@dataclass(frozen=True)
class PassSets:
    """The sets' medians a profile keeps: per pass name (and `UPDATE`), the median of each set in
    the calibration's order (`calibration_layer_sets`)."""

    medians_s: Mapping[str, tuple[float, ...]]
    alone_medians_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """The same sets timed by rank 0 alone, where the calibration timed them with all ranks at once
    and kept both (`alone.medians_s`, 2-rank profiles since the twenty-second session)."""


def parse_pass_sets(read, document: Mapping) -> PassSets | None:
    """The sets' medians of `weight_passes.*` and `optimizer.in_cycle` (`medians_s`, with
    `num_params` of the same length); None if no pass kept its medians. Malformed lists fail naming
    the field."""
    entries = {name: entry for name, entry in (document.get("weight_passes") or {}).items()
               if isinstance(entry, Mapping)}
    in_cycle = (document.get("optimizer") or {}).get("in_cycle")
    if isinstance(in_cycle, Mapping):
        entries[UPDATE] = in_cycle
    medians, alone_medians = {}, {}
    for name, entry in entries.items():
        where = "optimizer.in_cycle" if name == UPDATE else f"weight_passes.{name}"
        if entry.get("medians_s") is None:
            continue
        size = len(entry.get("num_params") or [])
        medians[name] = _medians(read, entry, where, size)
        alone = entry.get("alone")
        if isinstance(alone, Mapping) and alone.get("medians_s") is not None:
            alone_medians[name] = _medians(read, alone, f"{where}.alone", size)
    if not medians:
        return None
    return PassSets(medians, alone_medians)


def _medians(read, entry: Mapping, where: str, size: int) -> tuple[float, ...]:
    """`entry["medians_s"]`: `size` numbers >= 0, a malformed one failing as `where.medians_s[i]`."""
    values = entry["medians_s"]
    if not isinstance(values, list) or len(values) != size:
        raise read.fail(f"{where}.medians_s", f"expected a list as long as num_params, got {values!r}")
    return tuple(read.number({"value": value}, "value", f"{where}.medians_s[{i}]", minimum=0)
                 for i, value in enumerate(values))


class LayerPassCosts:
    """Each pass's cost over a stage, for one workload: the sum of its layers' single-layer medians
    times the prefixes' growth at the stage's size (module docstring)."""

    def __init__(self, sets: PassSets, layer_params: Sequence[int]):
        self.layer_params = tuple(layer_params)
        layer_sets = calibration_layer_sets(layer_params)
        self.singles_s: dict[str, np.ndarray] = {}
        """Pass name -> each layer's single-layer median (0 for layers without weights); a pass
        whose sets do not match the workload's is left out."""
        self.growth: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """Pass name -> (the prefixes' parameter counts, each prefix's median over the sum of its
        layers' singles), in increasing order."""
        for name, medians in sets.medians_s.items():
            if len(medians) == len(layer_sets):
                self.singles_s[name], self.growth[name] = _singles_and_growth(layer_sets, medians, self.layer_params)

    def over(self, name: str, layer_start: int, layer_end: int, num_params: int) -> float | None:
        """Seconds of pass `name` over layers [layer_start, layer_end), or None when this pass has no
        per-layer costs or the range does not hold exactly `num_params` (an interleaved stage's update
        over chunks apart; the caller then uses the fit)."""
        singles = self.singles_s.get(name)
        if singles is None or not 0 <= layer_start < layer_end <= len(self.layer_params):
            return None
        if sum(self.layer_params[layer_start:layer_end]) != num_params:
            return None
        sizes, ratios = self.growth[name]
        growth = float(np.interp(num_params, sizes, ratios)) if len(sizes) else 1.0
        return float(singles[layer_start:layer_end].sum()) * growth


def _singles_and_growth(layer_sets: Sequence[tuple[int, ...]], medians_s: Sequence[float],
                        layer_params: Sequence[int]) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Each layer's single-layer median, and the prefixes' (parameters, median / sum of singles),
    prefixes whose singles sum to 0 left out."""
    singles = np.zeros(len(layer_params))
    for layers, median in zip(layer_sets, medians_s):
        if len(layers) == 1:
            singles[layers[0]] = median
    weighted = [layer for layer in range(len(layer_params)) if layer_params[layer] > 0]
    points = []
    for layers, median in zip(layer_sets, medians_s):
        singles_s = float(singles[list(layers)].sum())
        if tuple(layers) == tuple(weighted[:len(layers)]) and singles_s > 0:  # a prefix
            points.append((sum(layer_params[layer] for layer in layers), median / singles_s))
    points.sort()
    return singles, (np.array([size for size, _ in points], dtype=float), np.array([ratio for _, ratio in points]))
