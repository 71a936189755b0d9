"""Run a gpipe or 1f1b `Plan` through torch's own pipeline schedules (`--pipeline-runtime torch`).

The second runtime next to `validator.pipeline_runtime` (our send/recv interpreter of the plan's
actions): this rank's stage (the plan's layer range of its stage, `build_modules` with the same
seed, so the same initial weights) is wrapped in `torch.distributed.pipelining.PipelineStage` and
one step is one `ScheduleGPipe.step` / `Schedule1F1B.step` over the group's batch (B / G samples,
the same `make_batch` seeds as our runtime), which splits it into the plan's m micro-batches.

Loss scaling: `loss_fn` is the mean over a micro-batch; torch's schedules with `scale_grads=True`
(the default) divide the accumulated gradients by m once the last backward is done, so the
stage's gradient is the mean over the group's batch, as in our runtime (loss / m per micro-batch).
With G > 1 groups, each stage's gradient is then all-reduced among its G replicas (one flat
tensor, `peer_groups`) and divided by G: the full-batch mean gradient (GHP Proposition 1). Each
group's pipeline runs in its own process group (ranks `rank_of(g, 0..p-1)`), so the G pipelines'
messages never mix.

Timing: `schedule.step` is one opaque call, so a rank records one compute span "schedule" over
it, a comm span per replica allreduce (not overlapped with the backward: torch offers no hook at
bucket boundaries) and a compute span "optimizer"; no per-action spans.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist
from torch import nn

from simulator.errors import ScenarioError
from simulator.plan import Plan
from simulator.workload import Workload
from validator.optimizers import make_optimizer
from validator.models import build_modules, loss_fn, make_batch
from validator.pipeline_plan import chunk_ranges, num_microbatches
from validator.runtime import peer_groups

PIPELINE_RUNTIMES = ("own", "torch")
TORCH_SCHEDULE_NAMES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def check_pipeline_runtime(kind: str, pipeline_runtime: str) -> None:
    """ScenarioError unless (kind, runtime) can run: torch's schedules only for gpipe and 1f1b."""
    if pipeline_runtime not in PIPELINE_RUNTIMES:
        raise ScenarioError(f"--pipeline-runtime: {pipeline_runtime!r} is not one of {', '.join(PIPELINE_RUNTIMES)}")
    if pipeline_runtime == "torch" and kind not in TORCH_SCHEDULE_NAMES:
        raise ScenarioError(f"--pipeline-runtime torch: strategy kind {kind!r} has no torch.distributed.pipelining "
                            f"schedule here (only {', '.join(TORCH_SCHEDULE_NAMES)}); use --pipeline-runtime own")


def pipeline_groups(plan: Plan) -> dict[int, object]:
    """One process group per pipeline (group g: its p stages); every rank must create all, in order."""
    groups = {}
    for group in range(plan.num_groups):
        ranks = [plan.rank_of(group, stage) for stage in range(plan.workers_per_group)]
        groups[group] = dist.new_group(ranks) if plan.num_groups > 1 else None
    return groups


def _schedule_class(kind: str):
    try:
        from torch.distributed import pipelining
        return getattr(pipelining, TORCH_SCHEDULE_NAMES[kind])
    except (ImportError, AttributeError) as error:
        raise ScenarioError(f"--pipeline-runtime torch: this torch {torch.__version__} lacks "
                            f"torch.distributed.pipelining.{TORCH_SCHEDULE_NAMES[kind]} ({error})") from None


class TorchPipelineExecutor:
    """One rank's stage under torch's ScheduleGPipe / Schedule1F1B; same interface as PipelineExecutor."""

    def __init__(self, plan: Plan, workload: Workload, rank: int, optimizer: str = "sgd",
                 learning_rate: float = 0.01, seed: int = 0, device: str = "cpu"):
        check_pipeline_runtime(plan.strategy, "torch")
        if plan.meta.get("topk"):
            raise ScenarioError(f"strategy.gradient_compression: topk is not supported with --pipeline-runtime "
                                f"torch (strategy.kind {plan.strategy})")
        from torch.distributed.pipelining import PipelineStage
        self.plan, self.workload, self.rank, self.seed = plan, workload, rank, seed
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # the launcher set this rank's GPU
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.group_index, self.stage_index = plan.grid_position(rank)
        self.num_microbatches = num_microbatches(plan)
        self.group_batch = int(plan.group_batch)
        if self.group_batch % self.num_microbatches:
            raise ScenarioError(f"strategy.num_microbatches: {self.num_microbatches} does not divide the group's "
                                f"batch of {self.group_batch} (--pipeline-runtime torch needs equal micro-batches)")
        start, end = chunk_ranges(plan)[self.stage_index]
        built = build_modules(workload, seed=seed)
        self.modules = {layer: built[layer].to(self.device) for layer in range(start, end)}
        self.stage_module = nn.Sequential(*(self.modules[layer] for layer in range(start, end)))
        self.optimizer = make_optimizer(optimizer, list(self.stage_module.parameters()), learning_rate)
        self.replica_groups = peer_groups(plan)
        self.pipelines = pipeline_groups(plan)
        self.stage = PipelineStage(self.stage_module, self.stage_index, plan.workers_per_group, self.device,
                                   group=self.pipelines[self.group_index])
        self.schedule = _schedule_class(plan.strategy)(
            self.stage, self.num_microbatches, loss_fn=functools.partial(loss_fn, workload), scale_grads=True)
        self.losses: list[float] = []

    def load_batch(self, step_index: int) -> None:
        """Generate step `step_index`'s batch and keep this group's rows (before the step's barrier
        in measured runs, as `validator.runtime.RankExecutor.load_batch`)."""
        inputs, targets = make_batch(self.workload, self.group_batch * self.plan.num_groups,
                                     seed=self.seed + 1000 + step_index)
        base = self.group_index * self.group_batch
        self.batch = (inputs[base:base + self.group_batch].to(self.device),
                      targets[base:base + self.group_batch].to(self.device))

    def step(self, step_index: int) -> list[tuple]:
        """One schedule call on the batch `load_batch` holds, the replica allreduce (G > 1), the update; spans
        from the step's start."""
        inputs, targets = self.batch
        self.spans: list[tuple] = []
        self.step_start = time.perf_counter()
        args = (inputs,) if self.stage.is_first else ()
        extra = {"target": targets, "losses": []} if self.stage.is_last else {}
        try:
            self.schedule.step(*args, return_outputs=False, **extra)
        except (RuntimeError, NotImplementedError) as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ScenarioError(f"--pipeline-runtime torch: torch.distributed.pipelining failed on backend "
                                f"{dist.get_backend()} ({self.plan.strategy}): {first_line}") from None
        self._span("compute", "schedule", "schedule", self.step_start)
        self.losses = [float(loss.detach()) for loss in extra.get("losses", [])]
        if self.plan.num_groups > 1:
            self._allreduce_replicas()
        started = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self._span("compute", "optimizer", "opt", started)
        return self.spans

    def _allreduce_replicas(self) -> None:
        """Sum the stage's gradient over its G replicas (one flat tensor), then divide by G."""
        started = time.perf_counter()
        params = list(self.stage_module.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.replica_groups[self.stage_index])
        self._span("comm", f"allreduce stage {self.stage_index}", "allreduce", started,
                   flat.numel() * flat.element_size())
        flat /= self.plan.num_groups
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def _span(self, stream: str, name: str, kind: str, start: float, size_bytes: float = 0.0) -> None:
        now = time.perf_counter()
        self.spans.append((self.rank, stream, name, kind, start - self.step_start, now - self.step_start,
                           float(size_bytes), 0))

    def state(self) -> dict[str, torch.Tensor]:
        """This rank's parameters keyed by global layer index and parameter name."""
        return {f"{layer}.{name}": p.detach().cpu().clone()
                for layer in sorted(self.modules) for name, p in self.modules[layer].named_parameters()}


__all__ = ["PIPELINE_RUNTIMES", "TORCH_SCHEDULE_NAMES", "TorchPipelineExecutor", "check_pipeline_runtime",
           "pipeline_groups"]
