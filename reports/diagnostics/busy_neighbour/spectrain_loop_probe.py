"""The MLP's 2-stage SpecTrain first stage as a loop without messages, beside different neighbours.

One process per stage, one thread each. Stage 0 (fc1-fc3, two micro-batches in flight) loops the
runtime's own functions (`validator.weight_versions`) in the runtime's SpecTrain order: predict,
forward on the predicted weights, then for the oldest micro-batch repredict, backward, accumulate,
and the momentum update. Its per-pass medians (ms) are printed with the other core:
- idle (no neighbour process);
- running stage 1's SpecTrain loop (fc4-fc7, one in flight): what the validated run has;
- running stage 1's synchronous passes (forward and backward through the modules, no copies);
- streaming memory (a 12 MB tensor copied over and over: about one stage's weights);
and, for reference, the calibration's cycle over the same layers alone (`validator.weight_pass_bench`,
the code a profile's `weight_passes` come from). Writes nothing.

    python reports/diagnostics/busy_neighbour/spectrain_loop_probe.py

Why (thirty-fifth session, AMD EPYC host): in the validated 2-stage MLP SpecTrain the runtime's
forward, predict and repredict took 1.26-1.46x what the model charged (`../runtime_pass_gap/spans_amd.log`);
the at-once calibration timings of the weight passes are about the alone ones on this host, so
the model's memory contention (`simulator.host_sharing`) adds nothing.
"""

import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.func import functional_call

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "runtime_pass_gap"))
from loop_probe import DIMS, FIRST, LAST, MICROBATCH, build_modules, show  # noqa: E402
from validator.weight_pass_bench import _backward, time_weight_passes  # noqa: E402
from validator.weight_versions import (MicroState, accumulate_gradients, predict_layer_weights,  # noqa: E402
                                       release_backward, repredict_layer_weights)

PASSES = ("predict", "forward", "repredict", "backward", "accumulate", "update")


def spectrain_loop(layers: range, in_flight_target: int, iterations: int, stop=None) -> dict:
    """The stage's SpecTrain loop; per-pass medians in ms (the neighbour's while `stop` is unset)."""
    modules = build_modules()
    params = [p for i in layers for p in modules[i].parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    update = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    update.step()  # the momentum buffers the prediction reads
    x = torch.randn(MICROBATCH, DIMS[layers[0]])
    in_flight, times = [], {k: [] for k in PASSES}
    iteration = 0
    while (stop is not None and not stop.is_set()) or (stop is None and iteration < iterations):
        t0 = time.perf_counter()
        state = MicroState(weights=predict_layer_weights(modules, layers, update, 1, 0.01))
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
        repredict_layer_weights(modules, layers, update, 1, 0.01, oldest.weights)
        t3 = time.perf_counter()
        _backward(oldest, layers)
        t4 = time.perf_counter()
        accumulate_gradients(modules, layers, oldest.weights)
        release_backward(oldest, layers[0])
        t5 = time.perf_counter()
        update.step()
        update.zero_grad(set_to_none=False)
        t6 = time.perf_counter()
        iteration += 1
        if iteration > 30:
            for key, span in zip(PASSES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                times[key].append(span * 1e3)
    return {key: statistics.median(values) for key, values in times.items() if values}


def synchronous_loop(layers: range, stop) -> None:
    """Forward and backward through the modules' own weights, no copies (a synchronous stage)."""
    modules = build_modules()
    x = torch.randn(MICROBATCH, DIMS[layers[0]])
    while not stop.is_set():
        state = MicroState()
        out = x
        for layer in layers:
            if layer > layers[0]:
                out = out.detach().requires_grad_(True)
            state.inputs[layer] = out
            state.outputs[layer] = out = modules[layer](out)
        _backward(state, layers)


def stream_loop(stop) -> None:
    source, target = torch.randn(3 * 1024 * 1024), torch.empty(3 * 1024 * 1024)
    while not stop.is_set():
        target.copy_(source)


def _neighbour(kind: str, stop) -> None:
    torch.set_num_threads(1)
    if kind == "spectrain":
        spectrain_loop(LAST, 1, 0, stop)
    elif kind == "synchronous":
        synchronous_loop(LAST, stop)
    else:
        stream_loop(stop)


def cycle_ms() -> dict:
    modules = build_modules()
    entry = time_weight_passes([modules[i] for i in range(7)], [list(FIRST)], torch.randn(MICROBATCH, DIMS[0]),
                               repeats=15)[0]
    return {key: entry[f"{key}_s"] * 1e3 for key in ("predict", "repredict", "accumulate", "update")}


def main() -> None:
    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    for _round in range(2):
        show("cycle alone (calibration)", cycle_ms())
        show("loop, other core idle", spectrain_loop(FIRST, 2, 400))
        for kind in ("spectrain", "synchronous", "stream"):
            stop = context.Event()
            neighbour = context.Process(target=_neighbour, args=(kind, stop))
            neighbour.start()
            time.sleep(2.0)
            show(f"loop beside a {kind} loop", spectrain_loop(FIRST, 2, 400))
            stop.set()
            neighbour.join()


if __name__ == "__main__":
    main()
