"""Measured peak memory per rank of a real run of a plan, against the simulator's prediction.

Each rank runs the plan's actions (`validator.runtime.RankExecutor`; pipeline kinds:
`validator.pipeline_runtime.PipelineExecutor`, several micro-batches in flight) for `warmup` steps,
so that gradients and optimizer state exist, drops the tensors its last step left behind (what a
training loop keeps between steps: parameters, gradients, optimizer state, top-k error-feedback
residuals; a pipeline rank's micro-batch states, predicted weights and stashes are rebuilt every
step), and measures one more step:
- CUDA: `torch.cuda.max_memory_allocated` over the step (the caching allocator's peak of live
  tensor bytes, reserved-but-free blocks excluded);
- CPU: the tensors alive at the step's start (parameters, gradients, optimizer state: unique
  storages) plus the peak of the CPU allocator's running total during the step, read from
  torch.profiler's memory events (`profile_memory=True`: every allocation and free through
  c10's CPU allocator, with the total allocated since profiling began).
Both count tensor bytes only: no allocator caching, framework code or communication library
buffers (gloo's own), which the simulator does not model either.
Known difference on pipelines: the runtime loads the group's whole batch on the first stage at the
step's start (as torch.distributed.pipelining splits the step's input), the model only the inputs
of the micro-batches in flight (a per-micro-batch loader, as Megatron's); under 1F1B stage 0
measures (m - p) micro-batches of input data more (under 0.5 % of the peak for the validation models).
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist

from simulator.compare import with_strategy
from simulator.grid_symmetry import every_rank
from simulator.model_source import resolve_workload
from simulator.plan import Plan
from simulator.scenario import PIPELINE_KINDS, Scenario
from simulator.simulate import simulate
from simulator.workload import Workload
from validator.comm_device import default_backend
from validator.kernel_trace import quiet_profiler
from validator.launch import LaunchConfig, spawn
from validator.models import as_built
from validator.pipeline_runtime import PipelineExecutor
from validator.runtime import RankExecutor

STEP_STATE = ("batch", "received", "pending_sends", "reductions", "layer_inputs", "layer_outputs",
              "input_grads", "loss", "last_segment", "selected",  # RankExecutor
              "flight", "predicted", "unreduced", "last_backward", "spans")  # PipelineExecutor
"""Attributes a `RankExecutor.step` / `PipelineExecutor.step` leaves behind (dropped before the
measured step)."""


@dataclass(frozen=True)
class MemoryRunOptions:
    warmup: int = 2
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    seed: int = 0
    device: str = "cpu"


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors`."""
    seen, total = set(), 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def persistent_tensors(executor: RankExecutor | PipelineExecutor) -> list[torch.Tensor]:
    """What the rank keeps between steps: parameters, gradients, optimizer state, residuals."""
    tensors = list(executor.parameters)
    tensors += list(getattr(executor, "residuals", {}).values())
    tensors += [p.grad for p in executor.parameters if p.grad is not None]
    for state in executor.optimizer.state.values():
        tensors += [value for value in state.values() if torch.is_tensor(value) and value.dim() > 0]
    return tensors


def profiled_peak_delta_bytes(profiler) -> float:
    """Peak of the CPU allocator's running total during a profile, relative to its start."""
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        with open(path, encoding="utf-8") as stream:
            events = json.load(stream)["traceEvents"]
    finally:
        os.unlink(path)
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                    key=lambda e: e["ts"])
    if not memory:
        return 0.0
    start = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]
    return max(0.0, max(e["args"]["Total Allocated"] for e in memory) - start)


def measured_step_peak_bytes(step, device: str, start_bytes: float) -> float:
    """Peak memory of one `step()` (module docstring): on CUDA `max_memory_allocated` over it; on the
    CPU `start_bytes` (what the caller counted alive at its start) plus the peak of the allocator's
    running total during it, from torch.profiler's memory events."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated())
    quiet_profiler()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    return start_bytes + profiled_peak_delta_bytes(profiler)


def measure_rank(rank: int, plan: Plan, workload: Workload, options: MemoryRunOptions) -> dict:
    """Body of one rank: warm-up steps, then the measured step (see the module docstring)."""
    executor_class = PipelineExecutor if plan.strategy in PIPELINE_KINDS else RankExecutor
    executor = executor_class(plan, workload, rank, options.optimizer, options.learning_rate,
                              options.seed, options.device)
    for step in range(options.warmup):
        dist.barrier()
        executor.load_batch(step)
        executor.step(step)
    for name in STEP_STATE:
        if hasattr(executor, name):
            setattr(executor, name, None)
    gc.collect()
    baseline = tensor_bytes(persistent_tensors(executor))
    dist.barrier()
    def step() -> None:
        executor.load_batch(options.warmup)  # the step's batch counts in its peak
        executor.step(options.warmup)
    peak = measured_step_peak_bytes(step, options.device, baseline)
    dist.barrier()
    return {"rank": rank, "peak_memory_bytes": peak, "persistent_bytes": float(baseline)}


def measure_memory(scenario: Scenario, specs: list[tuple[str, int | None]],
                   options: MemoryRunOptions = MemoryRunOptions(), timeout_s: float = 300.0) -> list[dict]:
    """Predicted and measured peak memory per rank for each strategy spec: (dp | mp | ghp, G) or
    ("KIND:m", None) for a pipeline kind with m micro-batches (`simulator.compare.with_strategy`)."""
    workload = as_built(resolve_workload(scenario.model, scenario.base_dir))  # predicted as the ranks run it
    rows = []
    for kind, groups in specs:
        variant = every_rank(with_strategy(scenario, kind, groups))  # every rank runs for real
        predicted = simulate(variant, workload=workload)
        plan = predicted.plan
        config = LaunchConfig(world_size=plan.num_ranks, device=options.device, timeout_s=timeout_s,
                              backend=default_backend(options.device))
        measured = spawn(measure_rank, (plan, workload, options), config)
        for device, result in zip(predicted.summary["devices"], measured):
            rows.append({
                "scenario": scenario.name, "strategy": f"{kind} (G={plan.num_groups} x M={plan.workers_per_group})",
                "rank": device["rank"], "predicted_bytes": device["peak_memory_bytes"],
                "measured_bytes": result["peak_memory_bytes"],
                "error_pct": 100.0 * (device["peak_memory_bytes"] - result["peak_memory_bytes"]) / result["peak_memory_bytes"],
                "breakdown_bytes": device["memory_breakdown_bytes"],
            })
    return rows
