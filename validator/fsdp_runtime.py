"""Sharded data parallelism for real: a megatron plan with tp_degree = pp_degree = 1 (d = N replicas)
run as PyTorch trains it, with FSDP2 (`torch.distributed.fsdp.fully_shard`) or DDP.

- zero_stage 3 / fsdp_sharding full_shard: `fully_shard` on every layer module that has parameters,
  then on the root (PyTorch FSDP2 docs, "fully_shard": one all-gather per module before its forward
  and again before its backward, parameters freed after each, gradients reduce-scattered; Zhao et
  al., "PyTorch FSDP", VLDB 2023, sec. 3).
- hybrid_shard: the same over a 2-D mesh (replicas x s shard ranks, s = `meta["tensor"]["shard_degree"]`,
  shard groups of consecutive ranks as in the plan): HSDP.
- zero_stage 2 / shard_grad_op: `reshard_after_forward=False` (parameters stay gathered from forward
  to backward: FSDP's SHARD_GRAD_OP, ZeRO-2's communication); `zero_stage: 2` alone is predicted as
  the shard_grad_op plan that runs (`validator.validate.prepare_case`), not DeepSpeed's ZeRO-2.
- zero_stage 0 / no_shard: `DistributedDataParallel` (Li et al., VLDB 2020; `gradient_as_bucket_view`,
  so the gradients are its buckets, as in `validator.runtime`), the unsharded baseline.
ZeRO-1 has no FSDP counterpart and is refused. The optimizer steps on the rank's shard (FSDP2
parameters are DTensors sharded on dim 0). Each rank trains on its B / d rows of the step's batch
(the global batch, as the other runtimes make it) in m micro-batches of the mean loss / m; FSDP2
and DDP average gradients over the d ranks, so a step equals single-process training on the global
batch (`validator.measure.reference_training`). FSDP2 reduce-scatters every micro-batch's gradients
into the shard (its default, and ZeRO-2/3's in `simulator.strategies.zero`); DDP allreduces on the
last micro-batch only (`no_sync` before it), as the megatron plan does.
Spans: one compute span per micro-batch forward and backward and one for the optimizer step; the
collectives run inside them (FSDP2 and DDP issue them from autograd hooks), so they are not timed
on their own.
Known difference on a CPU device: FSDP2 overlaps its all-gathers and reduce-scatters with compute
through CUDA streams; on the CPU they block the rank's thread (pre-forward unshard with
async_op=False, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py), and gloo runs each
reduce-scatter as an allreduce of the whole buffer (profiled: 6 `gloo:all_reduce` a step for the
6 units of a 4-block GPT). The plan's gathers prefetch on a communication stream.
"""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist
from torch import nn

from simulator.errors import ScenarioError
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Plan
from simulator.workload import Workload
from validator.models import build_modules, loss_fn, make_batch
from validator.optimizers import make_optimizer

SHARDINGS = ("full_shard", "hybrid_shard", "shard_grad_op", "no_shard")
"""The FSDP sharding strategies this runtime runs (`simulator.zero_config.FSDP_ZERO_STAGES`)."""
DEFAULT_SHARDING = {3: "full_shard", 2: "shard_grad_op", 0: "no_shard"}
"""zero_stage given without fsdp_sharding: the FSDP strategy of that stage."""


def runnable_sharding(tp_degree: int, pp_degree: int, zero_stage: int, fsdp_sharding: str | None,
                      cp_degree: int = 1) -> str:
    """The FSDP sharding strategy (`SHARDINGS`) a megatron layout runs with; a one-line
    ScenarioError naming the field for a layout or stage this runtime does not run."""
    for field, degree in (("tp_degree", tp_degree), ("pp_degree", pp_degree), ("cp_degree", cp_degree)):
        if degree != 1:
            raise ScenarioError(f"strategy.{field}: {degree}; the validator runs megatron plans only with "
                                f"tp_degree, pp_degree and cp_degree 1 (sharded data parallelism, "
                                f"validator/fsdp_runtime.py)")
    sharding = fsdp_sharding or DEFAULT_SHARDING.get(zero_stage)
    if sharding not in SHARDINGS:
        raise ScenarioError(f"strategy.zero_stage: {zero_stage} does not run for real (ZeRO-1 has no FSDP "
                            f"counterpart); the validator runs zero_stage 0, 2 and 3 (fsdp_sharding "
                            f"{', '.join(SHARDINGS)})")
    return sharding


def sharding_of(plan: Plan) -> str:
    """`runnable_sharding` of a megatron plan."""
    tensor = plan.meta["tensor"]
    return runnable_sharding(tensor["tp_degree"], tensor["pp_degree"], tensor.get("zero_stage", 0),
                             tensor.get("fsdp_sharding"), tensor.get("cp_degree", 1))


def world_size_of(plan: Plan) -> int:
    """Ranks of a megatron plan: t x p x d (a symmetric plan holds one representative rank only)."""
    tensor = plan.meta["tensor"]
    return tensor["tp_degree"] * tensor["pp_degree"] * tensor["dp_degree"]


def wrap_model(modules: list[nn.Module], sharding: str, shard_degree: int, device: torch.device) -> nn.Module:
    """The root module over `modules`, sharded (FSDP2; hybrid_shard over replicas x `shard_degree`)
    or replicated (DDP) across the world."""
    root = nn.Sequential(*modules).to(device)
    if sharding == "no_shard":
        device_ids = None if device.type == "cpu" else [torch.cuda.current_device()]  # set by launch.init_rank
        return nn.parallel.DistributedDataParallel(root, device_ids=device_ids,
                                                   gradient_as_bucket_view=True)  # .grad views its bucket
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world = dist.get_world_size()
    if sharding == "hybrid_shard":
        mesh = init_device_mesh(device.type, (world // shard_degree, shard_degree),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,))
    reshard = sharding != "shard_grad_op"
    for module in modules:
        if any(True for _ in module.parameters()):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    return fully_shard(root, mesh=mesh, reshard_after_forward=reshard)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own part of a tensor: a DTensor's local shard, any other tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class FsdpExecutor:
    """One rank of a sharded data-parallel run: the `RankExecutor` interface that `run_rank` and the
    memory measurement use (`load_batch`, `step`, `state`, `persistent_tensors`)."""

    def __init__(self, plan: Plan, workload: Workload, rank: int, optimizer: str = "sgd",
                 learning_rate: float = 0.01, seed: int = 0, device: str = "cpu"):
        self.plan, self.workload, self.rank, self.seed = plan, workload, rank, seed
        self.sharding = sharding_of(plan)
        self.world_size = world_size_of(plan)
        self.device = torch.device(device)
        self.modules = build_modules(workload, seed=seed)
        shard_degree = plan.meta["tensor"].get("shard_degree") or self.world_size
        self.model = wrap_model(self.modules, self.sharding, shard_degree, self.device)
        self.parameters = list(self.model.parameters())
        self.optimizer = make_optimizer(optimizer, self.parameters, learning_rate)
        self.num_microbatches = int(plan.meta["num_microbatches"])
        self.global_batch = int(plan.meta["tensor"]["dp_degree"] * plan.group_batch)
        self.rank_batch = self.global_batch // self.world_size

    def load_batch(self, step_index: int) -> None:
        """This rank's rows of step `step_index`'s global batch (a data loader's job, untimed)."""
        inputs, targets = make_batch(self.workload, self.global_batch, seed=self.seed + 1000 + step_index)
        rows = slice(self.rank * self.rank_batch, (self.rank + 1) * self.rank_batch)
        self.batch = (inputs[rows].clone().to(self.device), targets[rows].clone().to(self.device))

    def step(self, step_index: int) -> list[tuple]:
        """Forward and backward of each micro-batch, then the optimizer step; returns the spans."""
        self.spans, self.step_start = [], time.perf_counter()
        inputs, targets = self.batch
        m = self.num_microbatches
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
            if self.sharding == "no_shard":  # what DDP's no_sync() context toggles
                self.model.require_backward_grad_sync = i == m - 1
            start = time.perf_counter()
            loss = loss_fn(self.workload, self.model(x), y) / m
            self._span(f"{FORWARD}{i}", FORWARD, start, i)
            start = time.perf_counter()
            loss.backward()
            self._span(f"{BACKWARD}{i}", BACKWARD, start, i)
        start = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self._span("opt", OPTIMIZER, start, -1)
        return self.spans

    def _span(self, name: str, kind: str, start: float, microbatch: int) -> None:
        now = time.perf_counter()
        self.spans.append((self.rank, "compute", name, kind, start - self.step_start, now - self.step_start,
                           0.0, microbatch))

    def persistent_tensors(self) -> list[torch.Tensor]:
        """What the rank keeps between steps: its parameter shards, their gradients, optimizer state."""
        tensors = [local(p) for p in self.parameters]
        tensors += [local(p.grad) for p in self.parameters if p.grad is not None]
        for state in self.optimizer.state.values():
            tensors += [local(value) for value in state.values() if torch.is_tensor(value) and value.dim() > 0]
        return tensors

    def state(self) -> dict[str, torch.Tensor]:
        """The full parameters keyed by layer index and name (collective: every rank calls it)."""
        return {f"{i}.{name}": local(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
                for i, module in enumerate(self.modules) for name, p in module.named_parameters()}


def measure_step_memory(executor: FsdpExecutor, step_index: int, device: str) -> dict:
    """Peak memory of one more step, measured as `validator.memory_measure.measure_rank` measures it
    (after the step state is dropped): on CUDA `max_memory_allocated`; on the CPU the rank's
    persistent tensors (`persistent_tensors`: its shards, gradients, optimizer state) plus the peak
    of the CPU allocator's running total during the step (torch.profiler memory events). FSDP2's
    gathered parameters and reduce-scatter buffers go through the same allocator, so they count."""
    from validator.memory_measure import measured_step_peak_bytes, tensor_bytes
    executor.batch = executor.spans = None
    gc.collect()
    baseline = tensor_bytes(executor.persistent_tensors())
    dist.barrier()
    def step() -> None:
        executor.load_batch(step_index)  # the step's batch counts in its peak
        executor.step(step_index)
    peak = measured_step_peak_bytes(step, device, baseline)
    dist.barrier()
    return {"peak_memory_bytes": peak, "persistent_bytes": float(baseline)}
