"""Execute a simulator `Plan` for one rank as real torch.distributed training.

The rank interprets its own ordered actions from the very plan the simulator ran:
- `Recv`/`Send`: activations forward and their gradients backward (blocking recv, isend);
- `Compute` F: the stage's layers on the group's slice of the batch (B / G samples);
- `Compute` B over [start, end): layer-by-layer autograd, so a gradient bucket is complete exactly
  where the plan says, and its `Collective` (an async allreduce among the stage's G peers) runs
  while the rest of backward continues — the overlap PyTorch DDP gives (Li et al., VLDB 2020);
- `Compute` opt: wait for the allreduces, average over G, optimizer step.
Gradient buckets are flat buffers and each parameter's `.grad` is a view into its bucket (from the
first step on), so backward accumulates straight into the buffer the allreduce reduces and no copy
is made either way: PyTorch DDP with `gradient_as_bucket_view=True` (Li et al., VLDB 2020, sec. 4.2).
Plans with top-k compression (`simulator.sparse`): at a `Compute` topk the bucket just produced
gets its error-feedback residual added, its k = ceil(rho n) largest magnitudes are kept and the
rest becomes the new residual (`sparsify`; Lin et al., ICLR 2018; Stich et al., NeurIPS 2018); its
`Collective` allgather sends the k values + k int32 indices (one fixed-size fp32 tensor) to the G
peers; the update scatter-adds the G contributions into a dense gradient and averages over G.
Every group uses the mean loss over its own samples; averaging gradients over the G groups then
gives exactly the full-batch mean gradient (GHP paper, Proposition 1).
Timings are spans in the simulator's format (`simulator.engine.SPAN_FIELDS`).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan, Recv, Send
from simulator.sparse import SELECTION_PHASE, topk_count
from simulator.workload import Workload
from validator import comm_device
from validator.optimizers import make_optimizer
from validator.models import build_modules, loss_fn, make_batch


def peer_groups(plan: Plan) -> dict[int, object]:
    """One process group per stage holding its G peers; every rank must create all, in order."""
    groups = {}
    for stage in range(plan.workers_per_group):
        ranks = [plan.rank_of(group, stage) for group in range(plan.num_groups)]
        groups[stage] = dist.new_group(ranks) if plan.num_groups > 1 else None
    return groups


def sparsify(flat: torch.Tensor, residual: torch.Tensor, k: int) -> torch.Tensor:
    """Error feedback + top-k on a flat gradient: residual += flat; the k largest |residual| are
    sent and zeroed in `residual` (which keeps the rest). Returns the payload of the allgather:
    [k values, k int32 indices viewed as fp32] (2k fp32 words = k x (4 + 4) bytes)."""
    residual.add_(flat)
    indices = residual.abs().topk(k, sorted=False).indices
    values = residual[indices]
    residual[indices] = 0.0
    return torch.cat([values, indices.to(torch.int32).view(torch.float32)])


def densify(gathered: list[torch.Tensor], num_elements: int) -> torch.Tensor:
    """Sum of the peers' sparse payloads (`sparsify`) as a dense tensor, added in peer order."""
    dense = torch.zeros(num_elements, dtype=gathered[0].dtype, device=gathered[0].device)
    for payload in gathered:
        k = payload.numel() // 2
        dense.index_add_(0, payload[k:].view(torch.int32).long(), payload[:k])
    return dense


def gradient_bucket(params: list[torch.Tensor]) -> torch.Tensor:
    """A flat copy of the parameters' gradients, each `.grad` then made a view of it, so backward
    accumulates into the buffer an allreduce reduces (DDP's gradient_as_bucket_view)."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def layer_output_shapes(workload: Workload, seed: int = 0) -> list[torch.Size]:
    """Per-sample output shape of every layer, from a two-sample forward on the CPU."""
    inputs, _ = make_batch(workload, 2, seed=seed)
    shapes = []
    with torch.no_grad():
        x = inputs
        for module in build_modules(workload, seed=seed):
            x = module.eval()(x)
            shapes.append(x.shape[1:])
    return shapes


class RankExecutor:
    """One rank's stage of the model, its optimizer, and the interpreter of its actions."""

    def __init__(self, plan: Plan, workload: Workload, rank: int, optimizer: str = "sgd",
                 learning_rate: float = 0.01, seed: int = 0, device: str = "cpu"):
        self.plan, self.workload, self.rank, self.seed = plan, workload, rank, seed
        self.device = torch.device(device)
        self.group_index, self.stage_index = plan.grid_position(rank)
        stage = plan.stages[self.stage_index]
        self.layer_start, self.layer_end = stage.layer_start, stage.layer_end
        modules = build_modules(workload, seed=seed)[self.layer_start:self.layer_end]
        self.modules = [module.to(self.device) for module in modules]
        self.parameters = [p for module in self.modules for p in module.parameters()]
        self.optimizer = make_optimizer(optimizer, self.parameters, learning_rate)
        self.groups = peer_groups(plan)
        self.group_batch = int(plan.group_batch)
        self.output_shapes = self._layer_output_shapes()
        self.density = plan.meta["topk"]["density"] if plan.meta.get("topk") else None
        self.residuals: dict[tuple[int, int], torch.Tensor] = {}  # bucket layer range -> error feedback
        self.buckets: dict[tuple[int, int], torch.Tensor] = {}  # bucket layer range -> flat gradients

    def _layer_output_shapes(self) -> list[torch.Size]:
        return layer_output_shapes(self.workload, self.seed)

    # ------------------------------------------------------------------ one step
    def load_batch(self, step_index: int) -> None:
        """Generate step `step_index`'s batch and keep this rank's part (a data loader's job: the
        measured runs call it before the step's barrier, so the step time excludes it)."""
        inputs, targets = make_batch(self.workload, int(self.plan.group_batch * self.plan.num_groups),
                                     seed=self.seed + 1000 + step_index)
        rows = slice(self.group_index * self.group_batch, (self.group_index + 1) * self.group_batch)
        # keep only what a data loader would give this rank: its group's rows (own storage, not a
        # view pinning the whole generated batch), the inputs on the first stage only
        self.batch = (inputs[rows].clone().to(self.device) if self.stage_index == 0 else None,
                      targets[rows].clone().to(self.device))

    def step(self, step_index: int) -> list[tuple]:
        """Run the rank's actions once on the batch `load_batch` holds; return its spans (seconds
        from the step's start)."""
        self.received, self.pending_sends, self.reductions, self.spans = {}, [], [], []
        self.span_cpu_s = {}
        self.layer_inputs, self.layer_outputs, self.input_grads = {}, {}, {}
        self.last_segment, self.selected = None, {}
        self.step_start = time.perf_counter()
        for action in self.plan.actions[self.rank]:
            HANDLERS[type(action)](self, action)
        for work in self.pending_sends:
            work.wait()
        return self.spans

    def _span(self, stream: str, name: str, kind: str, start: float, size_bytes: float = 0.0,
              microbatch: int = 0, end: float | None = None):
        now = time.perf_counter() if end is None else end
        self.spans.append((self.rank, stream, name, kind, start - self.step_start, now - self.step_start,
                           float(size_bytes), microbatch))

    def _recv(self, action: Recv) -> None:
        start = time.perf_counter()
        kind, _, sender_stage = action.key
        layer = self.layer_start - 1 if kind == "act" else self.layer_end - 1
        buffer = torch.empty((self.group_batch, *self.output_shapes[layer]), device=self.device)
        comm_device.recv(buffer, src=action.src)
        self.received[kind] = buffer
        self._span("recv", action.label, "recv", start, buffer.numel() * buffer.element_size())

    def _send(self, action: Send) -> None:
        start = time.perf_counter()
        if action.key[0] == "act":
            tensor = self.layer_outputs[self.layer_end - 1].detach().contiguous()
        else:
            tensor = self.input_grads[self.layer_start].contiguous()
        self.pending_sends.append(comm_device.isend(tensor, dst=action.dst))
        self._span("send", action.label, "send", start, tensor.numel() * tensor.element_size())

    def _compute(self, action: Compute) -> None:
        if action.phase not in (FORWARD, BACKWARD, SELECTION_PHASE):
            self._wait_reductions()  # the update's span starts once its gradients have arrived
        start, cpu_start_s = time.perf_counter(), time.thread_time()
        if action.phase == FORWARD:
            self._forward()
        elif action.phase == BACKWARD:
            self._backward(action.layer_start, action.layer_end)
        elif action.phase == SELECTION_PHASE:
            self._select(action)
        else:
            self._update()
        self.span_cpu_s[len(self.spans)] = time.thread_time() - cpu_start_s
        self._span("compute", action.label, action.phase, start)

    def _forward(self) -> None:
        x = self.batch[0] if self.stage_index == 0 else self.received["act"]
        for offset, module in enumerate(self.modules):
            layer = self.layer_start + offset
            if layer > self.layer_start or self.stage_index > 0:
                x = x.detach().requires_grad_(True)
            self.layer_inputs[layer] = x
            x = module(x)
            self.layer_outputs[layer] = x
        if self.stage_index == self.plan.workers_per_group - 1:
            self.loss = loss_fn(self.workload, x, self.batch[1])

    def _backward(self, layer_start: int, layer_end: int) -> None:
        for layer in range(layer_end - 1, layer_start - 1, -1):
            output = self.layer_outputs[layer]
            if layer == self.layer_end - 1:
                if self.stage_index == self.plan.workers_per_group - 1:
                    self.loss.backward()
                else:
                    output.backward(self.received["grad"])
            else:
                output.backward(self.input_grads[layer + 1])
            gradient = self.layer_inputs[layer].grad if self.layer_inputs[layer].requires_grad else None
            self.input_grads[layer] = gradient
        self.last_segment = (layer_start, layer_end)
        if layer_start == self.layer_start:  # the rank's backward is over: drop the step's feature
            # maps and gradient maps (autograd would have freed them), all but the gradient to send
            self.layer_inputs, self.layer_outputs, self.received, self.loss = {}, {}, {}, None
            self.input_grads = {layer_start: self.input_grads[layer_start]}

    def _bucket_params(self, layer_start: int, layer_end: int) -> list[torch.Tensor]:
        return [p for module in self.modules[layer_start - self.layer_start:layer_end - self.layer_start]
                for p in module.parameters()]

    def _bucket(self, layer_start: int, layer_end: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The flat gradient buffer of layers [layer_start, layer_end) and their parameters. The first
        time (the first step) the gradients are copied in once and `.grad` becomes a view of it."""
        params = self._bucket_params(layer_start, layer_end)
        flat = self.buckets.get((layer_start, layer_end))
        if flat is None:
            flat = self.buckets[(layer_start, layer_end)] = gradient_bucket(params)
        return flat, params

    def _select(self, action: Compute) -> None:
        """Top-k selection with error feedback of the bucket of layers [layer_start, layer_end)."""
        bucket = (action.layer_start, action.layer_end)
        flat, _ = self._bucket(*bucket)
        residual = self.residuals.setdefault(bucket, torch.zeros_like(flat))
        payload = sparsify(flat, residual, topk_count(flat.numel(), self.density))
        self.selected[action.id] = (payload, flat)

    def _collective(self, action: Collective) -> None:
        start = time.perf_counter()
        if action.op == "allgather":  # the top-k payload of the selection it depends on
            payload, flat = self.selected[action.deps[0]]
            gathered = [torch.empty_like(payload) for _ in range(self.plan.num_groups)]
            work = dist.all_gather(gathered, payload, group=self.groups[self.stage_index], async_op=True)
        else:
            flat, _ = self._bucket(*self.last_segment)
            gathered = None
            work = dist.all_reduce(flat, group=self.groups[self.stage_index], async_op=True)
        finished_at: list[float] = []
        work.get_future().add_done_callback(lambda _future: finished_at.append(time.perf_counter()))
        self.reductions.append((work, flat, gathered, action, start, finished_at))

    def _wait_reductions(self) -> None:
        """Wait for the rank's collectives and record their comm spans (each ending when its result
        arrived). Called before the update's compute span starts, so a rank's time waiting for its
        peers is communication in the measured breakdown, as in the simulator's."""
        for work, flat, gathered, action, start, finished_at in self.reductions:
            work.wait()
            size_bytes = (gathered[0].numel() * gathered[0].element_size()  # this rank's contribution
                          if gathered is not None else flat.numel() * flat.element_size())
            self._span("comm", action.label, action.op, start, size_bytes,
                       end=finished_at[0] if finished_at else None)

    def _update(self) -> None:
        for _work, flat, gathered, _action, _start, _finished_at in self.reductions:
            if gathered is not None:  # the bucket becomes the sum of the peers' sparse contributions
                flat.copy_(densify(gathered, flat.numel()))
            flat /= self.plan.num_groups  # the gradients are views of `flat`: averaged in place
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)

    def state(self) -> dict[str, torch.Tensor]:
        """This rank's parameters keyed by global layer index and parameter name."""
        return {f"{self.layer_start + i}.{name}": p.detach().cpu().clone()
                for i, module in enumerate(self.modules) for name, p in module.named_parameters()}


HANDLERS = {Recv: RankExecutor._recv, Send: RankExecutor._send, Compute: RankExecutor._compute,
            Collective: RankExecutor._collective}

__all__ = ["RankExecutor", "layer_output_shapes", "peer_groups", "OPTIMIZER"]
