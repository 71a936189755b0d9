"""Probe (twenty-sixth session): does a backward on a stashed weight copy cost what the same
backward through the modules costs?

The engine charges an asynchronous stage's backward from the calibration's per-layer backward
(`ProfileCosts.compute_s`), timed through the modules, where each micro-batch's weight gradients
are added onto the live `.grad` (a read-modify-write of every gradient). PipeDream's runtime runs
the backward on the stashed copy (`validator.weight_versions.stash_weights`), whose tensors have
no gradient yet, so the backward only writes fresh ones; adding them onto the live gradients is
the separate `accumulate` pass, which the engine charges on top. On the Intel Xeon host the MLP's
2-stage PipeDream backward spans measured 0.55-0.76 of what the engine charged
(`../calibration_launches/intel_step_spans.log`).

One process, one thread, the validation MLP's stages at 2 and 4 stages, micro-batch 8 and 16:
per stage, the median over blocks of
- `modules`: the layers' backward through the modules, the live gradients already present (as
  the second and later micro-batches of a synchronous step);
- `copy`: the same backward on a stashed copy (fresh gradients), as the asynchronous runtime runs it.
Prints each and copy / modules, in two rounds (the first rows of a process ran while the
allocator's thresholds were still settling: take the second round). Writes nothing. A probe on one rank, not a calibration.

Run: python reports/diagnostics/copy_backward/probe.py
"""

import statistics
import time

import torch
from torch.func import functional_call

from simulator.model_source import resolve_workload
from simulator.scenario import ModelConfig
from validator.models import build_modules, make_batch
from validator.weight_pass_bench import _layer_inputs
from validator.weight_versions import stash_weights

BLOCKS, REPEATS = 15, 10
STAGES = {2: [range(0, 3), range(3, 7)], 4: [range(0, 2), range(2, 3), range(3, 5), range(5, 7)]}


def _backward_s(modules, layers, x, use_copy: bool) -> float:
    weights = stash_weights(dict(enumerate(modules)), layers) if use_copy else None
    outs, ins = [], []
    out = x
    for layer in layers:
        out = out.detach().requires_grad_(True)
        ins.append(out)
        out = functional_call(modules[layer], weights[layer], (out,)) if use_copy else modules[layer](out)
        outs.append(out)
    grad = torch.ones_like(outs[-1])
    started = time.perf_counter()
    for out, inp in zip(reversed(outs), reversed(ins)):
        out.backward(grad)
        grad = inp.grad
    return time.perf_counter() - started


def median_backward_s(modules, layers, x, use_copy: bool) -> float:
    blocks = []
    for _ in range(BLOCKS):
        blocks.append(statistics.median(_backward_s(modules, layers, x, use_copy) for _ in range(REPEATS)))
    return statistics.median(blocks)


def main() -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    workload = resolve_workload(ModelConfig(name="mlp", params={"input_dim": 512, "hidden_dim": 1024,
                                                                 "num_hidden_layers": 6, "num_classes": 10}))
    modules = build_modules(workload)
    for p in (p for m in modules for p in m.parameters()):
        p.grad = torch.zeros_like(p)  # live gradients present, as after a step's first micro-batch
    print("round stages micro_batch layers   modules_ms  copy_ms  copy/modules")
    for round_index, batch_size in ((0, 8), (0, 16), (1, 8), (1, 16)):
        inputs = _layer_inputs(modules, make_batch(workload, batch_size)[0])
        for stages, ranges in STAGES.items():
            for layers in ranges:
                _backward_s(modules, layers, inputs[layers[0]], True)  # warm up both
                _backward_s(modules, layers, inputs[layers[0]], False)
                plain = median_backward_s(modules, layers, inputs[layers[0]], False)
                copy = median_backward_s(modules, layers, inputs[layers[0]], True)
                print(f"{round_index:5d} {stages:6d} {batch_size:11d} L{layers[0]}-{layers[-1]:<5d} {plain * 1e3:10.3f} "
                      f"{copy * 1e3:8.3f} {copy / plain:13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
