"""The MLP's two 2-stage stages' backward through the modules (weight gradients added, zeroed every
4 micro-batches as a 1F1B step does) and on a fresh weight copy (as PipeDream's stash runs it), one
process, one thread, nothing else running: medians of 250 backwards after 50. Stage 0 is fc1-fc3
(its input needs no gradient); stage 1 is fc4-fc7 (ReLU between layers, an output gradient given).
Prints each stage's two medians and their ratio; writes nothing.

    python reports/diagnostics/copy_backward/stage_probe.py

Why (twenty-eighth session): in the validated 2-stage PipeDream the first stage's backward took
1.05x its 1F1B time and the last stage's 0.71x (`../memory_contention/step_spans_ws2_after.log`),
while the calibration's copy_backward ratio for the first stage's layer set was 0.65.
"""

import statistics
import time

import torch
from torch.func import functional_call

DIMS = [512] + [1024] * 6 + [10]
MICROBATCH = 16


def build_layers() -> list:
    """The MLP's layers (fc1-fc7), seeded."""
    torch.manual_seed(0)
    return [torch.nn.Linear(DIMS[i], DIMS[i + 1]) for i in range(len(DIMS) - 1)]


def stage_output(layers, indices, x, weights=None):
    """The stage's forward over `indices` (ReLU between layers), on `weights` where given."""
    for index in indices:
        layer = layers[index]
        x = layer(x) if weights is None else functional_call(layer, weights[index], (x,))
        if index < len(layers) - 1:
            x = torch.relu(x)
    return x


def weight_copy(layers, indices) -> dict:
    """A fresh copy of the layers' weights, as leaves (PipeDream's stash)."""
    return {index: {name: p.detach().clone().requires_grad_(True) for name, p in layers[index].named_parameters()}
            for index in indices}


def backward_ms(layers, indices, on_copy: bool, first_stage: bool, iterations: int = 300, warmup: int = 50) -> float:
    source = torch.randn(MICROBATCH, DIMS[indices[0]])
    output_grad = torch.randn(MICROBATCH, DIMS[indices[-1] + 1])
    times = []
    for iteration in range(iterations):
        x = source if first_stage else source.detach().requires_grad_(True)
        weights = weight_copy(layers, indices) if on_copy else None
        output = stage_output(layers, indices, x, weights)
        started = time.perf_counter()
        output.backward(output_grad)
        times.append(time.perf_counter() - started)
        if not on_copy and iteration % 4 == 3:
            for index in indices:
                for p in layers[index].parameters():
                    p.grad = None
    return 1e3 * statistics.median(times[warmup:])


def main() -> None:
    torch.set_num_threads(1)
    layers = build_layers()
    for name, indices, first in (("stage 0, fc1-fc3", [0, 1, 2], True), ("stage 1, fc4-fc7", [3, 4, 5, 6], False)):
        modules_ms = backward_ms(layers, indices, on_copy=False, first_stage=first)
        copy_ms = backward_ms(layers, indices, on_copy=True, first_stage=first)
        print(f"{name}: through the modules {modules_ms:.3f} ms, on a copy {copy_ms:.3f} ms, ratio {copy_ms / modules_ms:.2f}")


if __name__ == "__main__":
    main()
