"""Which pause makes a pass cold: a stage's backwards timed after its forwards, with different gaps
in between. Prints figures (medians in ms and ratios to the back-to-back backward).

One process, one thread, one pipeline stage of a validation model (default: the narrow ResNet's
first 5 layers at micro-batch 8, a 2-stage pipeline's stage 0). Each round runs three forwards
(micro-batches 0-2, GPipe's order), then one of these gaps, then the three backwards, each timed:

- none: the backwards right after the forwards;
- sleep: 10 ms of `time.sleep` (the core free, as while a rank waits for a message);
- stream: 10 ms of adding 1 to a 64 MB buffer (the caches flushed, the core busy);
- spin: 10 ms of a loop reading the clock (the core busy, no memory touched).

Each B_i is compared with the same B_i after no gap (so that the gradient accumulation of later
micro-batches, which makes an MLP's B1 and B2 slower than its B0, cancels out). If the penalty
followed the age of a pass's operands (its saved activations were made before the gap), B1 and B2
would be as slow as B0 after every gap; if it follows the time since the rank last ran the layer,
only B0 pays. This is the measurement behind `simulator.cold_start`'s model (2026-11-23, on the
2-core AMD EPYC host, two runs each; first backward / later ones after a gap, medians over the
gaps: ResNet stage 1.18 / 1.00, the MLP's first two layers 1.31 / 1.05, the transformer's first
three layers 1.07 / 1.01).
The rounds rotate through the gaps so that all see the same spells of the machine's speed.

Run: python benchmarks/bench_cold_gap.py [--model resnet_cpu] [--layers 0-5] [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from validator.microbench import load_models_module

ROOT = Path(__file__).resolve().parent.parent
GAP_S = 0.010
STREAM_ELEMENTS = 16 * 2**20  # 64 MB of fp32, larger than the last-level cache of the hosts used here
MICROBATCHES = 3


def _stage(model: str, layers: str, batch: int):
    workload = resolve_workload(load_scenario(ROOT / "scenarios" / "validation" / f"{model}.yaml").model)
    models = load_models_module()
    modules = [module.train() for module in models.build_modules(workload, seed=0)]
    start, end = (int(value) for value in layers.split("-"))
    inputs, _ = models.make_batch(workload, batch, seed=0)
    with torch.no_grad():
        for module in modules[:start]:
            inputs = module(inputs)
    return modules[start:end], inputs, start > 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet_cpu")
    parser.add_argument("--layers", default="0-5", help="the stage's layers, start-end (end excluded)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    stage, inputs, input_needs_grad = _stage(args.model, args.layers, args.batch)
    buffer = torch.empty(STREAM_ELEMENTS)

    def forward():
        out = inputs.detach().requires_grad_(input_needs_grad)
        for module in stage:
            out = module(out)
        return out

    def until(deadline_s: float, work) -> None:
        while time.perf_counter() < deadline_s:
            work()

    gaps = {"none": lambda: None,
            "sleep": lambda: time.sleep(GAP_S),
            "stream": lambda: until(time.perf_counter() + GAP_S, lambda: buffer.add_(1.0)),
            "spin": lambda: until(time.perf_counter() + GAP_S, lambda: None)}
    samples = {(gap, index): [] for gap in gaps for index in range(MICROBATCHES)}
    warmup = 5
    for round_index in range(args.rounds + warmup):
        for gap, pause in gaps.items():
            outputs = [forward() for _ in range(MICROBATCHES)]
            pause()
            for index, out in enumerate(outputs):
                start = time.perf_counter()
                out.backward(torch.ones_like(out))
                if round_index >= warmup:
                    samples[(gap, index)].append(time.perf_counter() - start)
            for module in stage:
                module.zero_grad(set_to_none=True)
    medians = {key: statistics.median(values) for key, values in samples.items()}
    print(f"{args.model} layers {args.layers}, micro-batch {args.batch}: backward medians over {args.rounds} rounds, "
          "ms (ratio to the same backward after no gap)")
    print(f"  {'gap':8s}" + "".join(f"{f'B{index}':>16s}" for index in range(MICROBATCHES)))
    for gap in gaps:
        cells = "".join(f"{medians[(gap, index)] * 1e3:9.2f} ({medians[(gap, index)] / medians[('none', index)]:4.2f})"
                        for index in range(MICROBATCHES))
        print(f"  {gap:8s}{cells}")
    paused = ("sleep", "stream", "spin")
    first = statistics.median(medians[(gap, 0)] / medians[("none", 0)] for gap in paused)
    later = statistics.median(medians[(gap, index)] / medians[("none", index)] for gap in paused
                              for index in range(1, MICROBATCHES))
    print(f"after a gap: first backward {first:.2f}x, the later ones {later:.2f}x (median over the gaps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
