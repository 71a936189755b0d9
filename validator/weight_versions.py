"""The weight versions of the asynchronous pipeline runtime (`validator.pipeline_runtime`): one
micro-batch's state on a chunk, and the per-micro-batch passes over a stage's weights (stash,
predict, repredict, accumulate, release). They live apart from the executor so that their
microbenchmark (`validator.weight_pass_bench`) times the very code the validated runs execute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from validator.pipeline_plan import predicted_weights


@dataclass
class MicroState:
    """One micro-batch on one chunk: layer inputs/outputs of its graph, input grads, weights used."""

    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    input_grads: dict = field(default_factory=dict)
    weights: dict | None = None
    """layer -> {name: tensor} the forward ran on (None: the live modules)."""
    loss: torch.Tensor | None = None


def stash_weights(modules: dict, layers: range) -> dict:
    """PipeDream weight stashing (Narayanan et al., SOSP 2019, 3.3): a copy of the layers' weights,
    layer -> {name: tensor}, for a micro-batch's forward and backward."""
    return {layer: {name: p.detach().clone().requires_grad_(True) for name, p in modules[layer].named_parameters()}
            for layer in layers}


def predict_layer_weights(modules: dict, layers: range, optimizer, steps: int, learning_rate: float) -> dict:
    """SpecTrain (Chen et al., arXiv 1809.02839): W_hat = W - steps * lr * v for the layers, as
    layer -> {name: tensor}."""
    params = [p for layer in layers for p in modules[layer].parameters()]
    values = iter(predicted_weights(params, optimizer, steps, learning_rate))
    return {layer: {name: next(values).requires_grad_(True) for name, _ in modules[layer].named_parameters()}
            for layer in layers}


def repredict_layer_weights(modules: dict, layers: range, optimizer, steps: int, learning_rate: float,
                            into: dict) -> None:
    """Staggered SpecTrain (Chen et al., arXiv 1809.02839, 3.3): W_hat = W - steps * lr * v for the
    layers, copied into `into` (layer -> {name: tensor}, the weights the micro-batch's forward ran
    on) without a version bump, since its graph reads them."""
    for layer in layers:
        live = dict(modules[layer].named_parameters())
        predicted = predicted_weights(live.values(), optimizer, steps, learning_rate)
        for name, value in zip(live, predicted):
            into[layer][name].data.copy_(value)


def accumulate_gradients(modules: dict, layers: range, used: dict) -> None:
    """The gradients w.r.t. the weights a micro-batch ran on (`used`, layer -> {name: tensor})
    added onto the live weights' gradients."""
    with torch.no_grad():
        for layer in layers:
            for name, p in modules[layer].named_parameters():
                grad = used[layer][name].grad
                p.grad = grad.clone() if p.grad is None else p.grad.add_(grad)


def release_backward(state: MicroState, first_layer: int) -> None:
    """A micro-batch's backward on a chunk is over: drop its feature maps, gradient maps and weights
    (autograd would have freed them), all but the input gradient to send."""
    state.inputs, state.weights, state.loss = {}, None, None
    state.input_grads = {first_layer: state.input_grads[first_layer]}
