"""Small fixtures shared by the engine and strategy tests: toy workloads and a fixed cost model."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from simulator.engine import Engine
from simulator.hardware import LinkSpec
from simulator.plan import Plan
from simulator.records import span_table
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.ghp import GridConfig, compile_grid_plan
from simulator.topology import Topology
from simulator.workload import Layer, Workload


def toy_workload(num_layers: int, num_params: int = 1_000_000, output_elements: int = 1000) -> Workload:
    layers = tuple(
        Layer(name=f"l{i}", kind="linear", forward_flops_per_sample=1e9, backward_flops_per_sample=2e9,
              num_params=num_params, input_elements_per_sample=output_elements,
              output_elements_per_sample=output_elements, saved_elements_per_sample=output_elements)
        for i in range(num_layers))
    return Workload("toy", layers)


class FixedCosts:
    """Forward `forward_s_per_sample` x batch per layer, backward twice that; fixed optimizer time."""

    communication = None
    shared_processors = None

    def __init__(self, forward_s_per_sample: float = 1.0, optimizer_s: float = 0.0):
        self.forward_s_per_sample = forward_s_per_sample
        self.fixed_optimizer_s = optimizer_s

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        return self.forward_s_per_sample * batch * (1 if phase == "F" else 2)

    def optimizer_s(self, num_params: int, layers=None) -> float:
        return self.fixed_optimizer_s

    def weight_pass_s(self, name: str, num_params: int, layers=None) -> float:
        """Stash, predict and accumulate passes (asynchronous pipelines) are free."""
        return 0.0


def link(latency_s: float, bandwidth_bytes_per_s: float) -> LinkSpec:
    return LinkSpec(latency_s=latency_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s)


def run_grid(workload, topology: Topology, costs, groups: int, workers: int, batch: int, **options):
    config = GridConfig(strategy="ghp", num_groups=groups, workers_per_group=workers,
                        global_batch_size=batch, dtype="fp32", **options)
    plan = compile_grid_plan(config, workload, topology, costs)
    result = Engine(plan, topology, costs).run()
    return plan, span_table(result.spans)


def run_plan(plan: Plan, topology: Topology, costs):
    return span_table(Engine(plan, topology, costs).run().spans)


@lru_cache(maxsize=None)
def _simulated(resolved: str):
    return simulate(load_scenario(resolved))


def simulated_scenario(path):
    """`simulate(load_scenario(path))`, once per test run for each file: the scenario files' tests
    (loads and simulates, golden step times) share it."""
    return _simulated(str(Path(path).resolve()))
