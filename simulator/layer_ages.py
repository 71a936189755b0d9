"""The ages the cold-pass model (`simulator.cold_start`) is given, kept per rank while the engine
plays a plan: when each layer was last run by any pass or update on the rank (the previous step's
update is taken to end at the step's start, time 0), and when the rank last updated (its optimizer
state). Ages are wall time: a spin loop that touches no memory made the next pass as slow as a
sleep did (`benchmarks/bench_cold_gap.py`), so time spent on anything but the layer counts.

A pass over a stage of several layers pays the penalty once, the largest of its layers' excesses
(layer time x (factor - 1)), not their sum: the calibrated factors time each layer alone after a
pause, and the first layer after a pause pays for the wake-up the next ones then find done. Measured
(`bench_cold_gap.py`, the narrow ResNet's layers 0-4 at micro-batch 8, 10 ms gaps): its first
backward after a gap took 0.50-0.72 ms more than without; the profile's factors give 0.80 ms as the
largest layer excess and 2.37 ms as the sum.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Compute
from simulator.sparse import SELECTION_PHASE


class LayerAges:
    """Per-rank layer ages for the rank cost models that carry a `cold_start` section."""

    def __init__(self, rank_costs: Sequence):
        self._costs = list(rank_costs)
        self._cold = [getattr(model, "cold_start", None) for model in self._costs]
        self._layer_run_s: list[dict[int, float]] = [{} for _ in self._costs]
        self._updated_s = [0.0 for _ in self._costs]
        self._update_state_share = [getattr(model, "update_state_share", 1.0) for model in self._costs]
        self._update_in_cycle = [getattr(model, "update_timed_in_cycle", False) for model in self._costs]

    def tracks(self, rank: int) -> bool:
        return self._cold[rank] is not None

    def factor(self, action: Compute, rank: int, start_s: float) -> float:
        """How much slower than back to back `action` runs when it starts at `start_s`: 1 without a
        cold-start calibration; the update by the age of the optimizer state (the rank's previous
        update) and of its layers' weights, a top-k selection by its residual's (the previous
        step's, taken to end at time 0); a forward or backward pass over several layers pays the
        largest of its layers' cold excesses, once (see the module)."""
        cold = self._cold[rank]
        if cold is None:
            return 1.0
        if action.phase == OPTIMIZER:
            if self._update_in_cycle[rank]:
                return 1.0  # timed inside a micro-batch cycle: its fit holds the cold already
            return cold.update_factor(start_s - self._updated_s[rank], self._weights_coldness(action, rank, start_s),
                                      self._update_state_share[rank])
        if action.phase == SELECTION_PHASE:
            return cold.selection_factor(start_s)
        if action.phase not in (FORWARD, BACKWARD):
            return 1.0
        costs, last_run = self._costs[rank], self._layer_run_s[rank]
        excess_s = hot_s = 0.0
        for layer in range(action.layer_start, action.layer_end):
            base_s = costs.compute_s(layer, action.phase, action.batch)
            factor = cold.layer_factor(action.phase, layer, start_s - last_run.get(layer, 0.0))
            excess_s = max(excess_s, base_s * (factor - 1.0))
            hot_s += base_s
        return (hot_s + excess_s) / hot_s if hot_s > 0 else 1.0

    def ran(self, action: Compute, rank: int, end_s: float) -> None:
        """Record that `action` ended at `end_s`."""
        if action.phase == OPTIMIZER:
            self._updated_s[rank] = end_s
        last_run = self._layer_run_s[rank]
        for layer in range(action.layer_start, action.layer_end):
            last_run[layer] = end_s

    def _weights_coldness(self, action: Compute, rank: int, start_s: float) -> float:
        """Coldness of the updated layers' weights and gradients (last touched by their backward),
        weighted by the layers' parameters."""
        cold, last_run = self._cold[rank], self._layer_run_s[rank]
        layers = self._costs[rank].workload.layers
        weighted = total = 0.0
        for layer in range(action.layer_start, action.layer_end):
            params = layers[layer].num_params
            weighted += params * cold.coldness(start_s - last_run.get(layer, 0.0))
            total += params
        return weighted / total if total > 0 else cold.coldness(start_s - self._updated_s[rank])
