"""The MLP's first 2-stage stage (fc1-fc3) timing its backward through the modules and on a fresh
weight copy while a second process, on the other core, runs one of: nothing; the last stage's
(fc4-fc7) backward through its modules in a loop; its momentum update, stash (a weight copy) and
gradient accumulation in a loop (the memory-bound passes). One thread per process; medians of 250
backwards after 50. Prints one line per neighbour; writes nothing.

    python reports/diagnostics/copy_backward/pair_probe.py

Why (twenty-eighth session): in the validated 2-stage PipeDream the first stage's copy backward
took 1.05x its 1F1B backward while the calibration's ratio, timed with both ranks running that
same backward at once, was 0.70 (`../memory_contention/results.md`, Left).
"""

import multiprocessing as mp
import statistics
import time

import torch
from torch.func import functional_call

DIMS = [512] + [1024] * 6 + [10]
MICROBATCH = 16
FIRST, LAST = [0, 1, 2], [3, 4, 5, 6]


def _layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(DIMS[i], DIMS[i + 1]) for i in range(len(DIMS) - 1)]


def _output(layers, indices, x, weights=None):
    for index in indices:
        layer = layers[index]
        x = layer(x) if weights is None else functional_call(layer, weights[index], (x,))
        if index < len(layers) - 1:
            x = torch.relu(x)
    return x


def _copy(layers, indices):
    return {i: {n: p.detach().clone().requires_grad_(True) for n, p in layers[i].named_parameters()} for i in indices}


def _neighbour(kind, stop):
    torch.set_num_threads(1)
    layers = _layers()
    x = torch.randn(MICROBATCH, DIMS[LAST[0]], requires_grad=True)
    grad = torch.randn(MICROBATCH, DIMS[-1])
    params = [p for i in LAST for p in layers[i].parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    while not stop.is_set():
        if kind == "backward":
            _output(layers, LAST, x).backward(grad)
            for p in params:
                p.grad = None
        elif kind == "update_stash_accumulate":
            for p in params:
                p.grad = torch.ones_like(p) if p.grad is None else p.grad
            optimizer.step()
            copy = _copy(layers, LAST)
            for i in LAST:
                for n, p in layers[i].named_parameters():
                    p.grad.add_(copy[i][n])
        else:
            time.sleep(0.01)


def _backward_ms(layers, on_copy, iterations=300, warmup=50):
    source = torch.randn(MICROBATCH, DIMS[0])
    grad = torch.randn(MICROBATCH, DIMS[FIRST[-1] + 1])
    times = []
    for iteration in range(iterations):
        weights = _copy(layers, FIRST) if on_copy else None
        output = _output(layers, FIRST, source, weights)
        started = time.perf_counter()
        output.backward(grad)
        times.append(time.perf_counter() - started)
        if not on_copy and iteration % 4 == 3:
            for i in FIRST:
                for p in layers[i].parameters():
                    p.grad = None
    return 1e3 * statistics.median(times[warmup:])


def main() -> None:
    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    layers = _layers()
    for kind in ("idle", "backward", "update_stash_accumulate"):
        stop = context.Event()
        process = context.Process(target=_neighbour, args=(kind, stop))
        process.start()
        time.sleep(1.0)
        modules_ms = _backward_ms(layers, on_copy=False)
        copy_ms = _backward_ms(layers, on_copy=True)
        stop.set()
        process.join()
        print(f"neighbour {kind:24s} first stage's backward: modules {modules_ms:.3f} ms, copy {copy_ms:.3f} ms, "
              f"ratio {copy_ms / modules_ms:.2f}")


if __name__ == "__main__":
    main()
