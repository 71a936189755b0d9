"""The MLP's 2-stage PipeDream stages as loops without messages, against the calibration's cycle.

One process per stage, one thread each: stage 0 (fc1-fc3, two micro-batches in flight) and stage 1
(fc4-fc7, one), each looping the runtime's own functions (`validator.weight_versions`) in the
runtime's order: stash, forward on the copy, the oldest micro-batch's backward, accumulate, the
momentum update. Stage 0's per-pass medians are printed for: the loop alone; the loop with stage 1
looping on the other core; and the calibration's cycle (`validator.weight_pass_bench`, the very
code a profile's `weight_passes` come from) over the same layers, alone and beside stage 1's loop.
Writes nothing.

    python reports/diagnostics/runtime_pass_gap/loop_probe.py

Why (thirty-fourth session, AMD EPYC host): in the validated 2-stage MLP PipeDream the runtime's
passes took 1.15-1.6x what the calibration's cycle timed for the same layers
(`spans_amd.log`); the synchronous plans' passes matched (0.9-1.15x).
"""

import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from validator.weight_pass_bench import time_weight_passes  # noqa: E402
from validator.weight_versions import MicroState, accumulate_gradients, release_backward, stash_weights  # noqa: E402

DIMS = [512] + [1024] * 6 + [10]
MICROBATCH = 8
FIRST, LAST = range(0, 3), range(3, 7)


def build_modules() -> dict:
    torch.manual_seed(0)
    return {i: torch.nn.Sequential(torch.nn.Linear(DIMS[i], DIMS[i + 1]),
                                   *( [torch.nn.ReLU()] if i < len(DIMS) - 2 else []))
            for i in range(len(DIMS) - 1)}


def stage_loop(layers: range, in_flight_target: int, iterations: int, stop=None) -> dict:
    """The stage's asynchronous loop; per-pass medians in ms (all of them while `stop` is unset)."""
    modules = build_modules()
    params = [p for i in layers for p in modules[i].parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    update = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x = torch.randn(MICROBATCH, DIMS[layers[0]])
    in_flight, times = [], {k: [] for k in ("stash", "forward", "backward", "accumulate", "update")}
    iteration = 0
    while (stop is not None and not stop.is_set()) or (stop is None and iteration < iterations):
        t0 = time.perf_counter()
        state = MicroState(weights=stash_weights(modules, layers))
        t1 = time.perf_counter()
        out = x
        for layer in layers:
            if layer > layers[0]:
                out = out.detach().requires_grad_(True)
            state.inputs[layer] = out
            state.outputs[layer] = out = functional_call(modules[layer], state.weights[layer], (out,))
        in_flight.append(state)
        t2 = time.perf_counter()
        if len(in_flight) < in_flight_target:
            continue
        oldest = in_flight.pop(0)
        for layer in reversed(layers):
            output, oldest.outputs[layer] = oldest.outputs[layer], None
            output.backward(oldest.input_grads[layer + 1] if layer < layers[-1] else torch.ones_like(output))
            oldest.input_grads[layer] = oldest.inputs[layer].grad
        t3 = time.perf_counter()
        accumulate_gradients(modules, layers, oldest.weights)
        release_backward(oldest, layers[0])
        t4 = time.perf_counter()
        update.step()
        update.zero_grad(set_to_none=False)
        t5 = time.perf_counter()
        iteration += 1
        if iteration > 30:
            for key, span in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                times[key].append(span * 1e3)
    return {key: statistics.median(values) for key, values in times.items() if values}


def _neighbour(stop) -> None:
    torch.set_num_threads(1)
    stage_loop(LAST, 1, 0, stop)


def cycle_ms() -> dict:
    modules = build_modules()
    entry = time_weight_passes([modules[i] for i in range(7)], [list(FIRST)], torch.randn(MICROBATCH, DIMS[0]),
                               repeats=15)[0]
    return {key: entry[f"{key}_s"] * 1e3 for key in ("stash", "accumulate", "update", "copy_backward")}


def show(label: str, medians: dict) -> None:
    print(f"{label:34s} " + "  ".join(f"{k} {v:6.3f}" for k, v in medians.items()), flush=True)


def main() -> None:
    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    for round_index in range(3):
        show("loop alone", stage_loop(FIRST, 2, 400))
        show("cycle alone", cycle_ms())
        stop = context.Event()
        neighbour = context.Process(target=_neighbour, args=(stop,))
        neighbour.start()
        time.sleep(2.0)
        show("loop beside stage 1's loop", stage_loop(FIRST, 2, 400))
        show("cycle beside stage 1's loop", cycle_ms())
        stop.set()
        neighbour.join()


if __name__ == "__main__":
    main()
