"""The MLP's first 2-stage stage (fc1-fc3): its backward through the modules and on a fresh weight
copy with 1, 2 or 3 micro-batches in flight, each forward on its own copy made at that forward and
its backward `in flight - 1` forwards later (PipeDream's first stage keeps up to 2 at 2 stages), so
the copy a backward reads has aged behind other passes. One process, one thread. Prints one line per
depth; writes nothing.

    python reports/diagnostics/copy_backward/aged_probe.py

Why (twenty-eighth session): `pair_probe.py` found no neighbour that takes the copy backward's
advantage away; this asks whether the copy's age does.
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_probe import DIMS, MICROBATCH, build_layers, stage_output, weight_copy
torch.set_num_threads(1)
FIRST = [0, 1, 2]
layers = build_layers()
src = torch.randn(MICROBATCH, DIMS[0]); grad = torch.randn(MICROBATCH, DIMS[FIRST[-1] + 1])
def run(on_copy, versions, iterations=300, warmup=50):
    """`versions` micro-batches in flight: each forward on its own copy (made at its forward), its
    backward `versions - 1` forwards later, as PipeDream's first stage at 2 stages keeps 2."""
    pending, times = [], []
    for it in range(iterations):
        w = weight_copy(layers, FIRST) if on_copy else None
        pending.append(stage_output(layers, FIRST, src, w))
        if len(pending) >= versions:
            out = pending.pop(0)
            t = time.perf_counter(); out.backward(grad); times.append(time.perf_counter() - t)
        if not on_copy and it % 4 == 3:
            for i in FIRST:
                for p in layers[i].parameters(): p.grad = None
    return 1e3 * statistics.median(times[warmup:])
for versions in (1, 2, 3):
    m, c = run(False, versions), run(True, versions)
    print(f"{versions} in flight: modules {m:.3f} ms, copy {c:.3f} ms, ratio {c/m:.2f}")
