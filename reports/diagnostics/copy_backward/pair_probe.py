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
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_probe import DIMS, MICROBATCH, backward_ms, build_layers, stage_output, weight_copy  # noqa: E402

FIRST, LAST = [0, 1, 2], [3, 4, 5, 6]


def _neighbour(kind, stop):
    torch.set_num_threads(1)
    layers = build_layers()
    x = torch.randn(MICROBATCH, DIMS[LAST[0]], requires_grad=True)
    grad = torch.randn(MICROBATCH, DIMS[-1])
    params = [p for i in LAST for p in layers[i].parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    while not stop.is_set():
        if kind == "backward":
            stage_output(layers, LAST, x).backward(grad)
            for p in params:
                p.grad = None
        elif kind == "update_stash_accumulate":
            for p in params:
                p.grad = torch.ones_like(p) if p.grad is None else p.grad
            optimizer.step()
            copy = weight_copy(layers, LAST)
            for i in LAST:
                for n, p in layers[i].named_parameters():
                    p.grad.add_(copy[i][n])
        else:
            time.sleep(0.01)


def main() -> None:
    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    layers = build_layers()
    for kind in ("idle", "backward", "update_stash_accumulate"):
        stop = context.Event()
        process = context.Process(target=_neighbour, args=(kind, stop))
        process.start()
        time.sleep(1.0)
        modules_ms = backward_ms(layers, FIRST, on_copy=False, first_stage=True)
        copy_ms = backward_ms(layers, FIRST, on_copy=True, first_stage=True)
        stop.set()
        process.join()
        print(f"neighbour {kind:24s} first stage's backward: modules {modules_ms:.3f} ms, copy {copy_ms:.3f} ms, "
              f"ratio {copy_ms / modules_ms:.2f}")


if __name__ == "__main__":
    main()
