"""Single-process reference of data-parallel training with top-k sparse gradients (issue 6).

G ranks each compute the gradient of their slice (B / G samples) of the step's batch; per gradient
bucket (a range of layers, flattened in module order) and per rank, with e the rank's residual:
  a = g + e;  S = the k = ceil(rho n) entries of largest |a|;  sent = a on S, 0 elsewhere;
  e = a - sent (error feedback; without it e stays 0 and the rest is dropped);
then the update uses sum over ranks of sent / G (Lin et al., "Deep Gradient Compression", ICLR
2018; Stich et al., "Sparsified SGD with memory", NeurIPS 2018). `density=None` is the dense
baseline: the plain mean of the G gradients. The selection here is written independently of the
runtime's (`validator.runtime.sparsify` uses torch.topk; this a stable descending sort), the
sums are added in rank order as the runtime's `densify` does. The numbers depend only on the
per-rank gradients, not on timing: tests/test_sparse_runtime.py checks that real gloo runs end
with these parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from simulator.plan import Compute, Plan
from simulator.sparse import SELECTION_PHASE, topk_count
from simulator.workload import Workload
from validator.optimizers import make_optimizer
from validator.models import build_modules, loss_fn, make_batch


@dataclass
class SparseTrainingResult:
    state: dict[str, torch.Tensor]
    """Parameters after the last step, keyed "layer.name" like the runtime's `state()`."""
    losses: list[float] = field(default_factory=list)
    """Per step: mean over ranks of their training loss."""
    evaluations: list[dict] = field(default_factory=list)
    """Every eval_every steps: {"step", "loss", "accuracy"} on the eval batch."""
    sent_fraction: list[float] = field(default_factory=list)
    """Per step: nonzero entries of the averaged gradient / its size (1 for dense)."""


def plan_buckets(plan: Plan) -> list[tuple[int, int]]:
    """Layer ranges of the top-k selections (gradient buckets) of group 0's ranks, each stage's in
    backward order: with G groups of M stages, the reference's G "ranks" are the groups."""
    return [(a.layer_start, a.layer_end) for rank in range(plan.workers_per_group) for a in plan.actions[rank]
            if isinstance(a, Compute) and a.phase == SELECTION_PHASE]


def select(accumulated: torch.Tensor, k: int) -> torch.Tensor:
    """`accumulated` on its k largest magnitudes, zero elsewhere."""
    chosen = torch.argsort(accumulated.abs(), descending=True, stable=True)[:k]
    sent = torch.zeros_like(accumulated)
    sent[chosen] = accumulated[chosen]
    return sent


def sparse_training(workload: Workload, num_ranks: int, buckets: list[tuple[int, int]], density: float | None,
                    num_steps: int, global_batch: int, optimizer: str = "sgd", learning_rate: float = 0.01,
                    seed: int = 0, error_feedback: bool = True,
                    batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
                    eval_batch: tuple[torch.Tensor, torch.Tensor] | None = None,
                    eval_every: int = 0) -> SparseTrainingResult:
    """Train `num_steps` steps (module docstring). `batch_fn(step)` gives the global batch (default
    `make_batch(workload, global_batch, seed + 1000 + step)`, the runtime's); rank g takes rows
    [g B/G, (g + 1) B/G). Buckets must cover the layers that have parameters."""
    modules = build_modules(workload, seed=seed)
    bucket_params = [[p for m in modules[a:b] for p in m.parameters()] for a, b in buckets]
    covered = {id(p) for params in bucket_params for p in params}
    if any(id(p) not in covered for m in modules for p in m.parameters()):
        raise ValueError("sparse_training: the buckets do not cover every parameter")
    opt = make_optimizer(optimizer, [p for m in modules for p in m.parameters()], learning_rate)
    residuals = [[torch.zeros(sum(p.numel() for p in params)) for params in bucket_params]
                 for _ in range(num_ranks)]
    per_rank = global_batch // num_ranks
    result = SparseTrainingResult({})
    for step in range(num_steps):
        inputs, targets = batch_fn(step) if batch_fn else make_batch(workload, global_batch, seed=seed + 1000 + step)
        totals = [torch.zeros_like(r) for r in residuals[0]]
        losses = []
        for rank in range(num_ranks):
            rows = slice(rank * per_rank, (rank + 1) * per_rank)
            opt.zero_grad(set_to_none=True)
            x = inputs[rows]
            for module in modules:
                x = module(x)
            loss = loss_fn(workload, x, targets[rows])
            loss.backward()
            losses.append(float(loss.detach()))
            for index, params in enumerate(bucket_params):
                gradient = torch.cat([p.grad.reshape(-1) for p in params])
                if density is None:
                    totals[index] += gradient
                    continue
                accumulated = gradient + residuals[rank][index]
                sent = select(accumulated, topk_count(accumulated.numel(), density))
                residuals[rank][index] = accumulated - sent if error_feedback else torch.zeros_like(sent)
                totals[index] += sent
        nonzero = 0
        for params, total in zip(bucket_params, totals):
            total /= num_ranks
            nonzero += int((total != 0).sum())
            offset = 0
            for p in params:
                p.grad = total[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        opt.step()
        result.losses.append(sum(losses) / num_ranks)
        result.sent_fraction.append(nonzero / max(1, sum(t.numel() for t in totals)))
        if eval_batch is not None and eval_every and (step + 1) % eval_every == 0:
            result.evaluations.append({"step": step + 1, **evaluate(workload, modules, *eval_batch)})
    result.state = {f"{i}.{name}": p.detach().clone() for i, m in enumerate(modules)
                    for name, p in m.named_parameters()}
    return result


def evaluate(workload: Workload, modules, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """Loss and top-1 accuracy (per token for LMs) of the current weights."""
    with torch.no_grad():
        x = inputs
        for module in modules:
            x = module(x)
        return {"loss": float(loss_fn(workload, x, targets)),
                "accuracy": float((x.argmax(dim=-1) == targets).float().mean())}
