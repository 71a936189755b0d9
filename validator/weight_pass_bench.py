"""Microbenchmark of the per-micro-batch weight passes of the asynchronous pipeline runtime.

`validator.pipeline_runtime` runs, besides a stage's forward, backward and update, passes over the
stage's parameters for every micro-batch of an asynchronous schedule (the simulator's Compute
phases of the same names, `simulator.strategies.pipeline`):

- **stash** (PipeDream with weight stashing): a copy of the weights for the micro-batch's forward
  and backward (Narayanan et al., SOSP 2019, 3.3), `weight_versions.stash_weights`;
- **predict** (SpecTrain): W_hat = W - s lr v from the momentum buffer (Chen et al., arXiv
  1809.02839), `weight_versions.predict_layer_weights`;
- **repredict** (staggered SpecTrain): the prediction again before the backward, copied into the
  weights the micro-batch's forward ran on, `weight_versions.repredict_layer_weights`;
- **accumulate** (every asynchronous kind: the backward ran on weights other than the live
  tensors): the micro-batch's weight gradients added onto the live gradients,
  `weight_versions.accumulate_gradients`;
- **average** (every runtime's update on a stage with G > 1 replicas): the reduced flat gradient
  bucket divided by G in place.

Each is the runtime's own function on copies of the stage's modules, timed back to back: one
iteration runs the five passes in turn, each timed apart, and a figure is the median over blocks
of back-to-back iterations (`validator.microbench._time_blocks`, with `barrier` and `agree` when
several ranks time at once).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch

from simulator.profile import WEIGHT_PASS_NAMES
from validator.microbench import DEFAULT_MIN_BLOCK_S, _same, _sync, _time_blocks
from validator.optimizers import make_optimizer
from validator.weight_versions import (accumulate_gradients, predict_layer_weights, repredict_layer_weights,
                                       stash_weights)

LEARNING_RATE = 0.01
REPLICAS = 2
"""G of the timed `average` pass (its cost does not depend on G)."""


def _passes(modules: dict, layers: range, device: torch.device) -> Callable[[], tuple[float, ...]]:
    """One iteration: the seconds of each of `WEIGHT_PASS_NAMES` over `layers`, in that order."""
    params = [p for layer in layers for p in modules[layer].parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    momentum = make_optimizer("momentum", params, LEARNING_RATE)
    momentum.step()  # creates the momentum buffers the prediction reads
    used = stash_weights(modules, layers)
    for weights in used.values():  # the weight gradients of a micro-batch's backward on its copy
        for tensor in weights.values():
            tensor.grad = torch.ones_like(tensor)
    flat = torch.cat([p.detach().reshape(-1) for p in params])

    def timed(function) -> float:
        _sync(device)
        start = time.perf_counter()
        function()
        _sync(device)
        return time.perf_counter() - start

    def run() -> tuple[float, ...]:
        parts = (timed(lambda: stash_weights(modules, layers)),
                 timed(lambda: predict_layer_weights(modules, layers, momentum, 1, LEARNING_RATE)),
                 timed(lambda: repredict_layer_weights(modules, layers, momentum, 1, LEARNING_RATE, used)),
                 timed(lambda: accumulate_gradients(modules, layers, used)),
                 timed(lambda: flat.div_(REPLICAS)))
        flat.mul_(REPLICAS)  # untimed: repeated halving would reach subnormal numbers, which are slow
        return parts

    return run


def time_weight_passes(modules: Sequence[torch.nn.Module], layer_sets: Sequence[Sequence[int]],
                       repeats: int = 7, device: str = "cpu", warmup: int = 2, *,
                       barrier: Callable[[], None] | None = None, agree: Callable[[int], int] | None = None,
                       min_block_s: float = DEFAULT_MIN_BLOCK_S) -> list[dict]:
    """Median time of each weight pass over each set of consecutive layers of `modules` (one module
    per layer; copies are used, so the originals are untouched). Returns, per set,
    `{"num_params", "num_tensors", "<pass>_s" for each of WEIGHT_PASS_NAMES}`."""
    barrier = barrier or (lambda: None)
    agree = agree or _same
    device = torch.device(device)
    results = []
    for layer_set in layer_sets:
        layers = range(min(layer_set), max(layer_set) + 1)
        if list(layers) != sorted(layer_set):
            raise ValueError(f"layer set {list(layer_set)}: the layers of a pipeline stage are consecutive")
        own = {layer: copy.deepcopy(modules[layer]).to(device) for layer in layers}
        params = [p for layer in layers for p in own[layer].parameters()]
        barrier()
        medians = _time_blocks(_passes(own, layers, device), repeats, warmup, min_block_s, agree)
        results.append({"num_params": int(sum(p.numel() for p in params)), "num_tensors": len(params),
                        **{f"{name}_s": median for name, median in zip(WEIGHT_PASS_NAMES, medians, strict=True)}})
        del own, params
    barrier()
    return results
