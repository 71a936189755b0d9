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

So where the profile keeps the sets' medians, a pass over a stage's layers costs the sum of per-layer
costs c_l >= 0 fitted by non-negative least squares to every set's median (sum of c_l over the set's
layers = median). A single layer's timing and the prefixes that contain it both enter, so a layer
whose passes run from cache when alone but not within a larger range (the MLP's 1M-parameter layers)
is costed between the two. The sets are rebuilt from the workload's parameter counts by the
calibration's own rule (which layers have weights); a pass whose number of sets differs keeps its fit.

Since 2026-11-24's twenty-third session the calibration times every contiguous range of layers
(`timed_layer_ranges`) and the profile keeps each set's `layer_ranges`; a pass over a stage's layers
then costs the median of the stage's own range, timed inside the cycle that stage runs. The large
prefixes had cost up to 2x what the runtime spent on the later stages: in two 2-rank calibrations
the ResNet-20's accumulate over all 11 layers took 0.37 ms against 0.17-0.18 in quieter ones, and
the 2-stage runs' last stage (layers 5-10) accumulated in 0.13 ms where the per-layer costs charged
0.27 (`reports/diagnostics/concurrent_passes/resnet2_step_spans.log`); a prefix's cycle runs the
early layers' large activations through the caches, which the last stage's cycle never does. Timed
alone on one rank, per-layer costs fitted to singles and prefixes fell short of the ranges' own
medians by 2.5-18 % (median over the 66 ranges; worst -26 to -62 %, the update's per-call work
spread over layers; `reports/diagnostics/stage_ranges/`). Profiles without `layer_ranges` keep the
singles-and-prefixes rule and its per-layer costs.
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


def timed_layer_ranges(params: Sequence[int]) -> list[tuple[int, ...]]:
    """Every contiguous range of layers, by last layer then first layer from the last one down (so
    each single layer comes before the ranges that end with it), a range kept when no earlier one
    held the same layers with weights: the sets the calibration times since 2026-11-24."""
    sets, seen = [], set()
    for end in range(1, len(params) + 1):
        for start in range(end - 1, -1, -1):
            key = tuple(layer for layer in range(start, end) if params[layer] > 0)
            if key and key not in seen:
                seen.add(key)
                sets.append(tuple(range(start, end)))
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
    the calibration's order, and where the profile records them, each set's `(first, last)` layers
    (`layer_ranges`; without them the sets are `calibration_layer_sets`)."""

    medians_s: Mapping[str, tuple[float, ...]]
    layer_ranges: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)


def parse_pass_sets(read, document: Mapping) -> PassSets | None:
    """The sets' medians of `weight_passes.*` and `optimizer.in_cycle` (`medians_s`, with
    `num_params` of the same length); None if no pass kept its medians. Malformed lists fail naming
    the field."""
    entries = {name: entry for name, entry in (document.get("weight_passes") or {}).items()
               if isinstance(entry, Mapping)}
    in_cycle = (document.get("optimizer") or {}).get("in_cycle")
    if isinstance(in_cycle, Mapping):
        entries[UPDATE] = in_cycle
    medians, ranges = {}, {}
    for name, entry in entries.items():
        where = "optimizer.in_cycle" if name == UPDATE else f"weight_passes.{name}"
        values = entry.get("medians_s")
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(entry.get("num_params") or []):
            raise read.fail(f"{where}.medians_s", f"expected a list as long as num_params, got {values!r}")
        medians[name] = tuple(read.number({"value": value}, "value", f"{where}.medians_s[{i}]", minimum=0)
                              for i, value in enumerate(values))
        raw_ranges = entry.get("layer_ranges")
        if raw_ranges is not None:
            ranges[name] = _parse_ranges(read, raw_ranges, len(values), f"{where}.layer_ranges")
    if not medians:
        return None
    return PassSets(medians, ranges)


def _parse_ranges(read, raw, count: int, where: str) -> tuple[tuple[int, int], ...]:
    """`[[first, last], ...]`, one per median, 0 <= first <= last."""
    if not isinstance(raw, list) or len(raw) != count:
        raise read.fail(where, f"expected a list of {count} [first, last] layer pairs (one per median), got {raw!r}")
    ranges = []
    for i, pair in enumerate(raw):
        if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                   for v in pair) or not 0 <= pair[0] <= pair[1]):
            raise read.fail(f"{where}[{i}]", f"expected [first, last] layer indices with 0 <= first <= last, got {pair!r}")
        ranges.append((pair[0], pair[1]))
    return tuple(ranges)


class LayerPassCosts:
    """Per-layer costs of each pass with kept medians, for one workload, and where the profile
    records the sets' layer ranges, each range's own median."""

    def __init__(self, sets: PassSets, layer_params: Sequence[int]):
        self.layer_params = tuple(layer_params)
        self.costs_s: dict[str, np.ndarray] = {}
        """Pass name -> per-layer seconds; a pass whose sets do not match the workload's is left out."""
        self.range_medians_s: dict[str, dict[tuple[int, ...], float]] = {}
        """Pass name -> {a timed range's layers with weights: its median} (profiles with `layer_ranges`)."""
        prefix_sets = calibration_layer_sets(layer_params)
        for name, medians in sets.medians_s.items():
            ranges = sets.layer_ranges.get(name)
            layer_sets = prefix_sets if ranges is None else self._weighted_sets(ranges)
            if layer_sets is None or len(medians) != len(layer_sets):
                continue
            self.costs_s[name] = per_layer_costs(layer_sets, medians, len(layer_params))
            if ranges is not None:
                self.range_medians_s[name] = dict(zip(layer_sets, medians))

    def _weighted_sets(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, ...]] | None:
        """Each range's layers with weights; None when a range lies outside the workload's layers
        (a profile of another model)."""
        if any(last >= len(self.layer_params) for _, last in ranges):
            return None
        return [tuple(layer for layer in range(first, last + 1) if self.layer_params[layer] > 0)
                for first, last in ranges]

    def over(self, name: str, layer_start: int, layer_end: int, num_params: int) -> float | None:
        """Seconds of pass `name` over layers [layer_start, layer_end): the median of that range where
        it was timed, else the sum of the per-layer costs; None when this pass has neither or the range
        does not hold exactly `num_params` (an interleaved stage's update over chunks apart; the caller
        then uses the fit)."""
        costs = self.costs_s.get(name)
        if costs is None or not 0 <= layer_start < layer_end <= len(self.layer_params):
            return None
        if sum(self.layer_params[layer_start:layer_end]) != num_params:
            return None
        key = tuple(layer for layer in range(layer_start, layer_end) if self.layer_params[layer] > 0)
        timed_s = self.range_medians_s.get(name, {}).get(key)
        return float(costs[layer_start:layer_end].sum()) if timed_s is None else timed_s
