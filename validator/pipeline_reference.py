"""Single-process reference emulation of a pipeline plan's weight-version semantics.

Replays the plan's per-stage order of F / B / opt / predict events for k steps in one process, with
explicit weight versions instead of the distributed runtime's mutable stashes and aliases:
- every stage keeps its weight history: version u = the weights after its u-th update;
- the forward of micro-batch i on stage j records the version it read: u_f = updates of j so far
  (accumulate, stash, newest), or W_hat = W - s_f * lr * v computed at its predict event (predict);
- the backward reads, per `validator.pipeline_plan.weight_mode`: version u_f (accumulate — no
  update can fall in between — and stash), the newest version (newest), W - s_b * lr * v computed
  at its backward predict event (staggered predict), or the forward's W_hat (forward predict).
  "Reads" means: the forward's saved activations, with those weights put into the graph's
  parameter leaves before the backward (the chain rule evaluated at the backward's weights);
- the update is plain (momentum) SGD on the newest version, written out here: v = mu v + g,
  W = W - lr v (torch.optim.SGD's rule, dampening 0).
Events of different stages run in any order that respects the data they need (activations
forward, gradients backward); since a stage's numbers depend only on its own event order, the
result is deterministic and independent of timing. `tests/test_pipeline_runtime.py` checks that
real multi-process runs end with these parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.func import functional_call

from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Compute, Plan
from simulator.workload import Workload
from validator.models import build_modules, loss_fn, make_batch
from validator.pipeline_plan import (PREDICT, REPREDICT_PHASE, chunk_ranges, num_microbatches, prediction_steps,
                                     prediction_variant, weight_mode)

MOMENTUM = 0.9


@dataclass
class EmulationResult:
    state: dict[str, torch.Tensor]
    """Parameters after the last step, keyed "layer.name" like the runtime's."""
    losses: list[float]
    """Per step: mean training loss of its micro-batches (as the last stage computed them)."""
    evaluations: list[dict] = field(default_factory=list)
    """Every eval_every steps: {"step", "loss", "accuracy"} of the newest weights on the eval batch."""
    microbatch_losses: list[list[float]] = field(default_factory=list)
    """Per step: the loss of each micro-batch (and group), in the order the last stage ran them."""


@dataclass
class _InFlight:
    leaves: dict                      # layer -> {name: leaf tensor} the chunk's graph uses
    backward_weights: dict | None     # layer -> {name: tensor} to put into the leaves (None: keep)
    x_in: torch.Tensor
    output: torch.Tensor
    loss: torch.Tensor | None = None


class PipelineEmulator:
    def __init__(self, plan: Plan, workload: Workload, optimizer: str = "momentum",
                 learning_rate: float = 0.01, seed: int = 0):
        if optimizer not in ("sgd", "momentum"):
            raise ValueError(f"the pipeline emulator implements sgd and momentum, not {optimizer!r}")
        self.plan, self.workload, self.seed = plan, workload, seed
        self.learning_rate, self.momentum = learning_rate, (MOMENTUM if optimizer == "momentum" else 0.0)
        self.mode = weight_mode(plan)
        self.chunks = chunk_ranges(plan)
        self.num_stages, self.num_groups = plan.workers_per_group, plan.num_groups
        self.num_microbatches = num_microbatches(plan)
        self.microbatch_size = int(plan.group_batch) // self.num_microbatches
        self.modules = build_modules(workload, seed=seed)
        self.weights = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in self.modules]
        self.velocity = [{n: torch.zeros_like(w) for n, w in layer.items()} for layer in self.weights]
        self.events = [[a for a in plan.actions[plan.rank_of(0, j)] if isinstance(a, Compute)]
                       for j in range(self.num_stages)]
        for j in range(self.num_stages):
            for g in range(1, self.num_groups):
                assert [a for a in plan.actions[plan.rank_of(g, j)] if isinstance(a, Compute)] == self.events[j]
        self.steps = [prediction_steps(j, self.num_stages, prediction_variant(plan, plan.rank_of(0, j)))
                      for j in range(self.num_stages)] if self.mode == "predict" else None
        self.updates = [0] * self.num_stages
        self.history = [{0: self._snapshot(j)} for j in range(self.num_stages)]

    # ------------------------------------------------------------------ weights
    def _layers(self, stage: int) -> list[int]:
        return [layer for c in range(stage, len(self.chunks), self.num_stages) for layer in range(*self.chunks[c])]

    def _snapshot(self, stage: int) -> dict:
        """The stage's current version (updates make new tensors, so a shallow copy is frozen)."""
        return {layer: dict(self.weights[layer]) for layer in self._layers(stage)}

    def _predicted(self, stage: int, steps: int) -> dict:
        lr = self.learning_rate
        return {layer: {n: self.weights[layer][n] - steps * lr * self.velocity[layer][n] for n in self.weights[layer]}
                for layer in self._layers(stage)}

    def _update(self, stage: int, gradients: dict) -> None:
        for layer in self._layers(stage):
            for n, w in self.weights[layer].items():
                v = self.momentum * self.velocity[layer][n] + gradients[layer][n]
                self.velocity[layer][n] = v
                self.weights[layer][n] = w - self.learning_rate * v
        self.updates[stage] += 1
        if self.mode == "stash":
            self.history[stage][self.updates[stage]] = self._snapshot(stage)

    # ------------------------------------------------------------------ one step
    def run_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """All events of one step; returns the mean loss of its micro-batches."""
        self.inputs, self.targets = inputs, targets
        self.acts, self.grads, self.flight, self.losses = {}, {}, {}, []
        self.forward_weights, self.versions, self.predicted = {}, {}, {}
        self.gradients = [self._zero_gradients(j) for j in range(self.num_stages)]
        position = [0] * self.num_stages
        while any(position[j] < len(self.events[j]) for j in range(self.num_stages)):
            progressed = False
            for j in range(self.num_stages):
                while position[j] < len(self.events[j]) and self._ready(self.events[j][position[j]]):
                    self._run(j, self.events[j][position[j]])
                    position[j] += 1
                    progressed = True
            assert progressed, f"plan deadlocks at event positions {position}"
        return sum(self.losses) / len(self.losses)

    def _zero_gradients(self, stage: int) -> dict:
        return {layer: {n: torch.zeros_like(w) for n, w in self.weights[layer].items()} for layer in self._layers(stage)}

    def _chunk(self, layer: int) -> int:
        return next(c for c, (a, b) in enumerate(self.chunks) if a <= layer < b)

    def _ready(self, event: Compute) -> bool:
        if event.phase == FORWARD:
            chunk = self._chunk(event.layer_start)
            return chunk == 0 or (chunk - 1, event.microbatch) in self.acts
        if event.phase == BACKWARD:
            chunk = self._chunk(event.layer_start)
            first_segment = event.layer_end == self.chunks[chunk][1]
            return not first_segment or chunk == len(self.chunks) - 1 or (chunk, event.microbatch) in self.grads
        return True

    def _run(self, stage: int, event: Compute) -> None:
        if event.phase == FORWARD:
            self._forward(stage, self._chunk(event.layer_start), event.microbatch)
        elif event.phase == BACKWARD and event.layer_end == self.chunks[self._chunk(event.layer_start)][1]:
            self._backward(stage, self._chunk(event.layer_start), event.microbatch)
        elif event.phase == OPTIMIZER:
            self._update(stage, self.gradients[stage])
            self.gradients[stage] = self._zero_gradients(stage)
            self._prune(stage)
        elif event.phase in (PREDICT, REPREDICT_PHASE):  # v = 1: chunk == stage
            forward_steps, backward_steps = self.steps[stage]
            key = (stage, event.microbatch)
            if key not in self.forward_weights:
                self.predicted[("F", *key)] = self._predicted(stage, forward_steps)
            elif backward_steps is not None:
                self.predicted[("B", *key)] = self._predicted(stage, backward_steps)
        # later backward segments of a chunk: its whole backward ran with the first segment

    def _weights_for_forward(self, stage: int, chunk: int, microbatch: int) -> dict:
        if self.mode == "predict":
            return self.predicted.pop(("F", chunk, microbatch))
        self.versions[(chunk, microbatch)] = self.updates[stage]
        return self.history[stage][self.updates[stage]] if self.mode == "stash" else self._snapshot(stage)

    def _forward(self, stage: int, chunk: int, microbatch: int) -> None:
        weights = self.forward_weights[(chunk, microbatch)] = self._weights_for_forward(stage, chunk, microbatch)
        start, end = self.chunks[chunk]
        for group in range(self.num_groups):
            rows = slice(group * int(self.plan.group_batch) + microbatch * self.microbatch_size,
                         group * int(self.plan.group_batch) + (microbatch + 1) * self.microbatch_size)
            x_in = self.inputs[rows] if chunk == 0 else self.acts[(chunk - 1, microbatch)][group].detach().requires_grad_()
            leaves = {layer: {n: w.clone().requires_grad_() for n, w in weights[layer].items()}
                      for layer in range(start, end)}
            x = x_in
            for layer in range(start, end):
                x = functional_call(self.modules[layer], leaves[layer], (x,))
            record = _InFlight(leaves, None, x_in, x)
            if chunk == len(self.chunks) - 1:
                loss = loss_fn(self.workload, x, self.targets[rows])
                self.losses.append(float(loss.detach()))
                record.loss = loss / self.num_microbatches if self.mode == "accumulate" else loss
            self.acts.setdefault((chunk, microbatch), {})[group] = x.detach()
            self.flight[(chunk, microbatch, group)] = record

    def _weights_for_backward(self, stage: int, chunk: int, microbatch: int) -> dict:
        forward = self.forward_weights.pop((chunk, microbatch))
        self.versions.pop((chunk, microbatch), None)
        if self.mode == "newest":
            return self._snapshot(stage)
        if self.mode == "predict":
            return self.predicted.pop(("B", chunk, microbatch), forward)
        return forward

    def _backward(self, stage: int, chunk: int, microbatch: int) -> None:
        weights = self._weights_for_backward(stage, chunk, microbatch)
        for group in range(self.num_groups):
            record = self.flight.pop((chunk, microbatch, group))
            with torch.no_grad():
                for layer, leaves in record.leaves.items():
                    for n, leaf in leaves.items():
                        leaf.data.copy_(weights[layer][n])  # the backward's weights; saved activations stay
            if chunk == len(self.chunks) - 1:
                record.loss.backward()
            else:
                record.output.backward(self.grads[(chunk, microbatch)][group])
            if chunk > 0:
                self.grads.setdefault((chunk - 1, microbatch), {})[group] = record.x_in.grad
            for layer, leaves in record.leaves.items():
                for n, leaf in leaves.items():
                    self.gradients[stage][layer][n] += leaf.grad / self.num_groups

    def _prune(self, stage: int) -> None:
        """Drop the versions no micro-batch in flight on this stage still reads."""
        if self.mode != "stash":
            return
        own = range(stage, len(self.chunks), self.num_stages)
        oldest = min((v for (chunk, _), v in self.versions.items() if chunk in own), default=self.updates[stage])
        for version in [v for v in self.history[stage] if v < oldest]:
            del self.history[stage][version]

    def state(self) -> dict[str, torch.Tensor]:
        return {f"{layer}.{n}": w.clone() for layer, params in enumerate(self.weights) for n, w in params.items()}

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
        """Loss and accuracy (top-1; per token for LMs) of the newest weights."""
        with torch.no_grad():
            x = inputs
            for module, weights in zip(self.modules, self.weights):
                x = functional_call(module, weights, (x,))
            loss = float(loss_fn(self.workload, x, targets))
            accuracy = float((x.argmax(dim=-1) == targets).float().mean())
        return {"loss": loss, "accuracy": accuracy}


def emulate(plan: Plan, workload: Workload, num_steps: int, optimizer: str = "momentum",
            learning_rate: float = 0.01, seed: int = 0, batch_fn=None, eval_batch=None,
            eval_every: int = 0) -> EmulationResult:
    """Replay `num_steps` steps of `plan`. `batch_fn(step) -> (inputs, targets)` of the global
    batch (default: the runtime's `make_batch(workload, B, seed + 1000 + step)`)."""
    emulator = PipelineEmulator(plan, workload, optimizer, learning_rate, seed)
    global_batch = int(plan.group_batch) * plan.num_groups
    batch_fn = batch_fn or (lambda step: make_batch(workload, global_batch, seed=seed + 1000 + step))
    losses, evaluations, microbatch_losses = [], [], []
    for step in range(num_steps):
        losses.append(emulator.run_step(*batch_fn(step)))
        microbatch_losses.append(list(emulator.losses))
        if eval_batch is not None and eval_every and ((step + 1) % eval_every == 0 or step + 1 == num_steps):
            evaluations.append({"step": step + 1, **emulator.evaluate(*eval_batch)})
    return EmulationResult(emulator.state(), losses, evaluations, microbatch_losses)
