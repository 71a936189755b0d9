"""Microbenchmark of the per-micro-batch weight passes of the asynchronous pipeline runtime.

`validator.pipeline_runtime` runs, besides a stage's forward, backward and update, three
memory-bound passes over the stage's parameters for every micro-batch of an asynchronous
schedule (the simulator's Compute phases of the same names, `simulator.strategies.pipeline`):

- **stash** (pipedream with weight stashing): a copy of the weights for the micro-batch's forward
  and backward (Narayanan et al., SOSP 2019, 3.3): `p.detach().clone()` per parameter;
- **predict** (spectrain): W_hat = W - s lr v from the momentum buffer (Chen et al., arXiv
  1809.02839): the runtime's own `predicted_weights`;
- **accumulate** (every asynchronous kind: the backward ran on weights other than the live
  tensors): the micro-batch's weight gradients added onto the live gradients, `g.add_(u)`;
- **average** (every runtime's update on a stage with G > 1 replicas): the reduced flat gradient
  bucket divided by G in place, `flat /= G`.

Each is timed like the optimizer (`validator.microbench.time_optimizer`): per parameter set, the
median over blocks of back-to-back passes, all ranks at once (a barrier before each set).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from validator.microbench import DEFAULT_MIN_BLOCK_S, _same, _sync, _time_blocks, make_optimizer

WEIGHT_PASSES = ("stash", "predict", "accumulate", "average")


def _passes(params: list[torch.Tensor], used_grads: list[torch.Tensor], optimizer) -> dict[str, Callable]:
    from validator.pipeline_plan import predicted_weights

    flat = torch.cat([g.reshape(-1) for g in used_grads])

    def stash():
        return [p.detach().clone().requires_grad_(True) for p in params]

    def predict():
        return predicted_weights(params, optimizer, 1, 0.01)

    def accumulate():
        with torch.no_grad():
            for p, used in zip(params, used_grads):
                p.grad.add_(used)
    def average():
        flat.div_(2)

    return {"stash": stash, "predict": predict, "accumulate": accumulate, "average": average}


def time_weight_passes(parameter_sets: Sequence, repeats: int = 7, device: str = "cpu", warmup: int = 2, *,
                       barrier: Callable[[], None] | None = None, agree: Callable[[int], int] | None = None,
                       min_block_s: float = DEFAULT_MIN_BLOCK_S, seed: int = 0) -> list[dict]:
    """Time of each weight pass (`WEIGHT_PASSES`) over each set of parameters (a list of tensors;
    copies are used, with random gradients and a momentum buffer as after one update).

    Returns `[{"num_params", "num_tensors", "stash_s", "predict_s", "accumulate_s", "average_s"}]`.
    """
    barrier = barrier or (lambda: None)
    agree = agree or _same
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    results = []
    for parameter_set in parameter_sets:
        params, used_grads = [], []
        for shape in (tuple(p.shape) for p in parameter_set):
            p = torch.randn(shape, generator=generator).to(device).requires_grad_(True)
            p.grad = torch.randn(shape, generator=generator).to(device)
            params.append(p)
            used_grads.append(torch.randn(shape, generator=generator).to(device))
        optimizer = make_optimizer("momentum", params)
        optimizer.step()  # creates the momentum buffers the prediction reads
        passes = _passes(params, used_grads, optimizer)
        entry = {"num_params": int(sum(p.numel() for p in params)), "num_tensors": len(params)}
        for name in WEIGHT_PASSES:
            def run(weight_pass=passes[name]):
                _sync(device)
                start = time.perf_counter()
                weight_pass()
                _sync(device)
                return (time.perf_counter() - start,)

            barrier()
            (entry[f"{name}_s"],) = _time_blocks(run, repeats, warmup, min_block_s, agree)
        results.append(entry)
        del optimizer, params, used_grads, passes
    barrier()
    return results


__all__ = ["WEIGHT_PASSES", "time_weight_passes"]
