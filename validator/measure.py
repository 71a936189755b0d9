"""Measured runs: warm-up, then k synchronised steps per rank; and the single-process reference.

Step time: each rank loads its part of the step's batch, then every step starts after a barrier
(batch generation stands in for a data loader, which the simulator does not model, and stays
outside the timed step); a rank's step time runs from there to the end of its
last action (its sends and allreduces complete); the step's time is the maximum over ranks
(all-reduced with MAX). The reported figure is the median over the k measured steps.

Megatron plans (tp = pp = 1) run on `validator.fsdp_runtime` (FSDP2 / DDP), which also measures
peak memory after the timed steps (`RunOptions.measure_memory`).

Asynchronous pipelines (`RunOptions.steady_state`): the plan run is the simulator's steady-state
plan (several steps' micro-batches back to back, `simulator.schedules.steady_state`), and a
step's figure is the same window the simulator predicts: completion of micro-batch 2p + m - 1
minus completion of micro-batch 2p - 1, a completion being the end of the micro-batch's last
compute on any rank (all-reduced with MAX; ranks share the machine's monotonic clock and start
each step after a barrier).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from simulator.plan import Plan
from simulator.scenario import PIPELINE_KINDS
from simulator.schedules.analysis import steady_window
from simulator.schedules.steady_state import microbatch_completions
from simulator.workload import Workload
from validator.comm_device import control_device
from validator.fsdp_runtime import FsdpExecutor, measure_step_memory
from validator.models import build_modules, loss_fn, make_batch
from validator.microbench import make_optimizer
from validator.pipeline_runtime import PipelineExecutor
from validator.runtime import RankExecutor
from validator.torch_pipelining import TorchPipelineExecutor, check_pipeline_runtime


@dataclass(frozen=True)
class RunOptions:
    steps: int = 5
    warmup: int = 2
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    seed: int = 0
    device: str = "cpu"
    return_state: bool = False
    steady_state: tuple[int, int] | None = None
    """(p stages, m micro-batches per step): measure the steady-state window, see the docstring."""
    pipeline_runtime: str = "own"
    """own (validator.pipeline_runtime) | torch (validator.torch_pipelining: gpipe / 1f1b only)."""
    keep_step_spans: bool = False
    """Return every measured step's spans ("step_spans"), not only the median step's (`ghpsim validate
    --step-spans`): for the tails a single step's trace hides."""
    measure_memory: bool = False
    """After the timed steps, one more step measures the rank's peak memory (megatron plans:
    `validator.fsdp_runtime.measure_step_memory`); "peak_memory_bytes" and "persistent_bytes"."""


def run_rank(rank: int, plan: Plan, workload: Workload, options: RunOptions, on_step=None) -> dict:
    """Body of one rank (called by the launcher after the process group is up); `on_step()` after
    each step (progress, e.g. `validator.worker_watchdog.Watchdog.kick`)."""
    executor_class = PipelineExecutor if plan.strategy in PIPELINE_KINDS else RankExecutor
    check_pipeline_runtime(plan.strategy, options.pipeline_runtime)
    if options.pipeline_runtime == "torch":
        executor_class = TorchPipelineExecutor
    if plan.strategy == "megatron":  # tp = pp = 1: sharded data parallelism (FSDP2 / DDP)
        executor_class = FsdpExecutor
    executor = executor_class(plan, workload, rank, options.optimizer, options.learning_rate,
                              options.seed, options.device)
    step_times_s, step_spans, step_span_cpu = [], [], []
    for step in range(options.warmup + options.steps):
        executor.load_batch(step)  # the data loader's part, outside the timed step (not simulated)
        dist.barrier()
        started = time.perf_counter()
        spans = executor.step(step)
        if options.device == "cuda":
            torch.cuda.synchronize()
        slowest = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=control_device())
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        step_s = float(slowest.item())
        if options.steady_state is not None:
            step_s = _steady_state_window_s(spans, *options.steady_state)
        if step >= options.warmup:
            step_times_s.append(step_s)
            step_spans.append(spans)
            # {span index: the rank's thread CPU seconds in that compute span} (runtimes that time it)
            step_span_cpu.append(dict(getattr(executor, "span_cpu_s", {})))
        if on_step is not None:
            on_step()
    # numpy, not tensors: torch would share tensors through file descriptors that vanish when
    # the rank's process exits before the launcher has read them
    state = {k: v.cpu().numpy() for k, v in executor.state().items()} if options.return_state else None
    memory = measure_step_memory(executor, options.warmup + options.steps, options.device) \
        if options.measure_memory else {}  # one more step: after the state of the k steps is read
    median_index = min(range(len(step_times_s)), key=lambda i: abs(step_times_s[i] - statistics.median(step_times_s)))
    return {
        "rank": rank,
        "step_times_s": step_times_s,
        "spans": step_spans[median_index] if step_spans else [],
        **({"step_spans": step_spans, "step_span_cpu_s": step_span_cpu} if options.keep_step_spans else {}),
        "state": state,
        **memory,
    }


def _steady_state_window_s(spans: list[tuple], num_stages: int, num_microbatches: int) -> float:
    """The steady-state window of this step over all ranks (collective: every rank calls it)."""
    completion = microbatch_completions(spans)
    count = 1 + max(completion, default=-1)
    ends = torch.zeros(count, dtype=torch.float64, device=control_device())
    for microbatch, end_s in completion.items():
        ends[microbatch] = end_s
    dist.all_reduce(ends, op=dist.ReduceOp.MAX)
    first, last = steady_window(num_stages, num_microbatches)  # the window the simulator measures
    return float(ends[last] - ends[first]) * num_microbatches / (last - first)


def reference_training(workload: Workload, global_batch: int, num_steps: int, optimizer: str = "sgd",
                       learning_rate: float = 0.01, seed: int = 0) -> dict[str, torch.Tensor]:
    """Single-process training on the full batch with the same data and init (Proposition 1's baseline)."""
    modules = build_modules(workload, seed=seed)
    parameters = [p for module in modules for p in module.parameters()]
    opt = make_optimizer(optimizer, parameters, learning_rate)
    for step in range(num_steps):
        inputs, targets = make_batch(workload, global_batch, seed=seed + 1000 + step)
        x = inputs
        for module in modules:
            x = module(x)
        loss_fn(workload, x, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return {f"{i}.{name}": p.detach().clone() for i, module in enumerate(modules)
            for name, p in module.named_parameters()}
