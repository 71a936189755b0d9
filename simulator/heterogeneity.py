"""Per-device compute costs on heterogeneous clusters.

A device computes with the cost model of its own GPU type (`cluster.node_gpus`: the analytic
roofline of that GPU, `simulator.costs.AnalyticCosts`, so compute- and memory-bound layers each
scale by the right datasheet figure) times its straggler slowdown (`cluster.stragglers`). The
engine times each rank's compute with `DeviceCosts`; the balanced partitioner gives each stage
the per-layer time of the slowest of the G devices that hold it (they meet at its allreduce).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.costs import BACKWARD, FORWARD, AnalyticCosts, CostModel, compute_parts
from simulator.errors import ScenarioError
from simulator.hardware import GpuSpec
from simulator.topology import Topology


class DeviceCosts:
    """The cost model of each device of a topology (see the module docstring)."""

    def __init__(self, costs: CostModel, topology: Topology):
        self.costs = costs
        self.topology = topology
        self.uniform = not topology.node_gpus and not topology.slowdowns
        self._models: dict[tuple, CostModel] = {}

    def model_of(self, device: int) -> CostModel:
        """The device's cost model: its GPU type's, slowed by its straggler factor; devices alike
        share one object (the scenario's own `costs` where nothing differs)."""
        gpu = self.topology.node_gpus.get(self.topology.node_of(device))
        slowdown = self.topology.slowdowns.get(device, 1.0)
        key = (gpu.model_dump_json() if gpu is not None else None, slowdown)
        model = self._models.get(key)
        if model is None:
            model = self.costs if gpu is None else _costs_for_gpu(self.costs, gpu)
            if slowdown != 1.0:
                model = Slowed(model, slowdown)
            self._models[key] = model
        return model

    def compute_s(self, device: int, layer_index: int, phase: str, batch: float) -> float:
        return self.model_of(device).compute_s(layer_index, phase, batch)


class Slowed:
    """A cost model whose device computes `factor` times slower (a straggler)."""

    def __init__(self, costs: CostModel, factor: float):
        self.costs = costs
        self.factor = factor
        self.communication = costs.communication
        self.shared_processors = costs.shared_processors

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        return self.costs.compute_s(layer_index, phase, batch) * self.factor

    def compute_parts(self, layer_index: int, phase: str, batch: float) -> tuple[float, float]:
        gpu_s, host_s = compute_parts(self.costs, layer_index, phase, batch)
        return gpu_s * self.factor, host_s * self.factor

    def optimizer_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        return self.costs.optimizer_s(num_params, layers=layers) * self.factor

    def weight_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float:
        return self.costs.weight_pass_s(name, num_params, layers=layers) * self.factor

    def topk_s(self, num_elements: int, density: float | None = None) -> float:
        return self.costs.topk_s(num_elements, density) * self.factor


def _costs_for_gpu(costs: CostModel, gpu: GpuSpec) -> CostModel:
    from simulator.kernel_costs import KernelCosts, device_for
    if not isinstance(costs, (AnalyticCosts, KernelCosts)):
        raise ScenarioError(f"cluster.node_gpus: GPU {gpu.name!r} needs a datasheet cost model (a calibration "
                            "profile times one GPU type)")
    try:
        gpu.peak_for(costs.dtype)
    except KeyError:
        raise ScenarioError(f"cluster.node_gpus: GPU {gpu.name!r} has no figure for training.dtype "
                            f"{costs.dtype!r}") from None
    if isinstance(costs, KernelCosts):  # the host's time per kernel is the host's, whatever the GPU
        parameters = replace(device_for(gpu, costs.dtype).parameters, host_overhead_s=costs.parameters.host_overhead_s)
        return costs.with_changes(gpu=gpu, parameters=parameters)
    return AnalyticCosts(costs.workload, gpu, costs.dtype, costs.optimizer, costs.efficiency,
                         recompute=costs.recompute, tp_degree=costs.tp_degree)


def stage_compute_s(costs: CostModel, topology: Topology, rank_to_device: tuple[int, ...], num_groups: int,
                    num_stages: int, num_layers: int, batch: float,
                    phases: tuple[str, ...] = (FORWARD, BACKWARD), parts: bool = False) -> np.ndarray:
    """Seconds per layer of `phases` (forward + backward by default): shape (L,) on uniform devices,
    else (M, L) with row j the slowest of stage j's G devices (ranks g x M + j). With `parts`, each
    phase's device and host seconds apart (`simulator.costs.compute_parts`) on a leading axis:
    shape (2 x len(phases), L) or (2 x len(phases), M, L), [device, host] of each phase in turn."""
    device_costs = DeviceCosts(costs, topology)

    def per_layer(device: int | None) -> np.ndarray:
        model = costs if device is None else device_costs.model_of(device)
        if parts:
            return np.array([[compute_parts(model, i, phase, batch) for i in range(num_layers)]
                             for phase in phases]).transpose(0, 2, 1).reshape(2 * len(phases), num_layers)
        return np.array([sum(model.compute_s(i, phase, batch) for phase in phases) for i in range(num_layers)])

    if device_costs.uniform:
        return per_layer(None)
    by_kind: dict[tuple, np.ndarray] = {}  # devices of one GPU type and slowdown time alike
    rows = []
    for stage in range(num_stages):
        kinds = {}
        for device in sorted({rank_to_device[group * num_stages + stage] for group in range(num_groups)}):
            kinds.setdefault(id(device_costs.model_of(device)), device)
        for kind, device in kinds.items():
            if kind not in by_kind:
                by_kind[kind] = per_layer(device)
        rows.append(np.max([by_kind[kind] for kind in kinds], axis=0))
    return np.moveaxis(np.array(rows), 0, 1) if parts else np.array(rows)
