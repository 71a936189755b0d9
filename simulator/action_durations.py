"""How long each compute action of a plan takes on its rank's device, from the cost model.

Per rank the device's cost model (its GPU type and straggler slowdown, `simulator.heterogeneity`);
a forward or backward pass is the sum of its layers' times; an update is the optimizer's time,
plus averaging the reduced gradients where G > 1 replicas of a stage do (megatron plans count TP x
DP pipelines as groups, and ZeRO shards the update: not charged there); asynchronous pipelines'
weight passes and top-k selections are their own memory-bound passes. Every figure is priced once
per (cost model, action shape): the ranks of a stage update alike and passes recur every micro-batch.
"""

from __future__ import annotations

from simulator.costs import WEIGHT_PASS_WORDS, CostModel, pass_parts
from simulator.heterogeneity import DeviceCosts
from simulator.host_sharing import NO_SM_SHARING
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Compute, Plan
from simulator.sparse import SELECTION_PHASE
from simulator.topology import Topology


class ActionDurations:
    """Seconds of a plan's compute actions (module docstring)."""

    def __init__(self, plan: Plan, topology: Topology, costs: CostModel):
        self._device_costs = device_costs = DeviceCosts(costs, topology)
        self._rank_costs = [device_costs.model_of(device) for device in plan.rank_to_device]
        self._averages_gradients = plan.num_groups > 1 and "tensor" not in plan.meta
        self._topk_density = plan.meta["topk"]["density"] if "topk" in plan.meta else None
        self._cache: dict[tuple, float] = {}

    def device_processors(self) -> list | None:
        """Per device, the `shared_processors` of its own GPU's cost model (its SM count sets how
        much NCCL's kernels slow its compute, `simulator.host_sharing.sm_sharing`); None when every
        device has the scenario's. A device whose model has none is slowed by nothing."""
        device_costs = self._device_costs
        if device_costs.uniform or not getattr(device_costs.costs.shared_processors, "per_device", False):
            return None
        return [device_costs.model_of(device).shared_processors or NO_SM_SHARING
                for device in range(device_costs.topology.num_devices)]

    def seconds(self, action: Compute, rank: int = 0) -> float:
        costs = self._rank_costs[rank]
        if action.phase in (FORWARD, BACKWARD):
            return self._pass_s(costs, action)
        key = (id(costs), action.phase, action.layer_start, action.layer_end, action.num_params, None)
        duration = self._cache.get(key)
        if duration is None:
            duration = self._cache[key] = self._other_s(costs, action)
        return duration

    def parts(self, action: Compute, rank: int = 0) -> tuple[float, float]:
        """(device seconds, host seconds) of a compute action: a pass sums its layers'
        `simulator.costs.compute_parts` (`pass_parts`); an update, weight pass or selection runs on the device alone."""
        if action.phase in (OPTIMIZER, SELECTION_PHASE) or action.phase in WEIGHT_PASS_WORDS:
            return self.seconds(action, rank), 0.0
        costs = self._rank_costs[rank]
        key = ("parts", id(costs), action.phase, action.layer_start, action.layer_end, action.batch)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = pass_parts(costs, action.phase, action.layer_start, action.layer_end, action.batch)
        return found

    def _other_s(self, costs, action: Compute) -> float:
        """The optimizer, an asynchronous pipeline's weight pass, a top-k selection."""
        if action.phase == OPTIMIZER:
            layers = (action.layer_start, action.layer_end)  # per-layer costs where the profile has them
            average_s = (costs.weight_pass_s("average", action.num_params, layers=layers)
                         if self._averages_gradients else 0.0)
            return costs.optimizer_s(action.num_params, layers=layers) + average_s
        if action.phase in WEIGHT_PASS_WORDS:  # asynchronous pipelines' stash / predict / accumulate
            return costs.weight_pass_s(action.phase, action.num_params, layers=(action.layer_start, action.layer_end))
        if action.phase == SELECTION_PHASE:  # top-k selection over num_params gradient elements (simulator.sparse)
            return costs.topk_s(action.num_params, self._topk_density)
        return self._pass_s(costs, action)

    def _pass_s(self, costs, action: Compute) -> float:
        key = (id(costs), action.phase, action.layer_start, action.layer_end, action.batch)
        duration = self._cache.get(key)
        if duration is None:
            duration = self._cache[key] = sum(
                costs.compute_s(layer, action.phase, action.batch) for layer in range(action.layer_start, action.layer_end))
        return duration
