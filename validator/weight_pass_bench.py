"""Microbenchmark of the per-micro-batch weight passes of the asynchronous pipeline runtime.

`validator.pipeline_runtime` runs, besides a stage's forward, backward and update, passes over the
stage's parameters for every micro-batch of an asynchronous schedule (the simulator's Compute
phases of the same names, `simulator.strategies.pipeline`):

- **stash** (pipedream with weight stashing): a copy of the weights for the micro-batch's forward
  and backward (Narayanan et al., SOSP 2019, 3.3), `weight_versions.stash_weights`; since the
  thirty-fourth session timed right after an update, where the runtime runs it (in the aged copy
  cycle at age 0, `_aged_cycle`), not after the cycle's forward and backward through the modules;
- **predict** (spectrain): W_hat = W - s lr v from the momentum buffer (Chen et al., arXiv
  1809.02839), `weight_versions.predict_layer_weights`;
- **repredict** (spectrain, staggered): the prediction again before the backward, copied into the
  weights the micro-batch's forward ran on, `weight_versions.repredict_layer_weights` (timed
  since 2026-11-23: on this project's CPU host, in a 2-stage MLP run, it took 1.1-1.5x the
  forward's prediction, which the simulator had charged for it);
- **accumulate** (every asynchronous kind: the backward ran on weights other than the live
  tensors): the micro-batch's weight gradients added onto the live gradients, then its backward
  state dropped, `weight_versions.accumulate_gradients` and `release_backward`;
- **average** (every runtime's update on a stage with G > 1 replicas): the reduced flat gradient
  bucket divided by G in place, `flat /= G`;
- **copy_forward** (every asynchronous kind): what a forward on weights other than the module's own
  (the stashed copy, the predicted weights, or an alias of the live ones) costs more than the same
  forward through the module: the runtime runs it through `torch.func.functional_call`, which swaps
  the tensors into the module for each layer call. Timed as the cycle's forward on the stashed copy
  minus a forward of the same layers through the modules in the same cycle (measured 2026-11-23 on
  this project's 2-core CPU host, ResNet-20 stages at a micro-batch of 16: 1.14-1.22x the plain
  forward, about 0.1 ms a stage; in 4-stage PipeDream runs the forwards' CPU time was 1.13x that
  of 1F1B's, the backwards' 0.96x, so the backward is not charged).
- **copy_backward** (every asynchronous kind, since the twenty-seventh session): the backward on
  the copy against the same backward through the modules in the same cycle. The copy's leaves are
  fresh, so its weight gradients are written, not added onto the live ones (the accumulate pass
  adds them later); on the Intel Xeon host a one-rank probe measured it at 0.53-0.74 of the
  modules' backward in most blocks, 1.02-1.61 in others; inside this cycle the two regimes did
  not show (a fresh run's profiles: the MLP 0.69-0.70, ResNet-20 and the transformer 0.98-1.00;
  `reports/diagnostics/copy_backward/`). The profile keeps each set's ratio and their median
  (`simulator.copy_backward`).
- **aged copy_backward** (since the twenty-ninth session): the same backward on a copy that has aged
  behind `age` forwards on other copies, as a pipeline stage's micro-batch does while the stages
  after it work (a stage s of p keeps p - s micro-batches in flight). Timed in its own cycle (stash,
  forward on the copy, the backward of the micro-batch `age` forwards back, its accumulate, the
  update), for every age from 0 (the cycle's own reference) to the calibration's world size - 1. On
  the Intel Xeon host a
  one-process probe of the MLP's first 2-stage stage measured the copy over the modules at 0.69-0.72
  fresh, 0.79-0.80 one forward back and 0.92-0.96 two back
  (`reports/diagnostics/copy_backward/aged_probe.py`). Charging that over the fresh modules' backward
  was scored on a fresh run and not kept (`reports/diagnostics/copy_age/`): the transformer's
  backward through the modules ages as much as its copy's, and synchronous plans are charged the
  fresh one. So the same cycle is also timed through the modules (no copy, no update: a synchronous
  stage with `age` micro-batches in flight), and the simulator takes only the copy's growth with age
  over the modules' (`simulator.copy_backward`).

The passes are timed where the runtime runs them: inside a micro-batch's cycle on the layers' own
modules (stash, predict, forward on the stashed copy, repredict, backward, accumulate, update), so each
pass meets the caches and the allocator as the runtime leaves them, and pays the runtime's own
per-tensor Python work (an earlier version timed bare tensor loops on hot buffers and measured
0.1-0.5x what the runtime spent; benchmarks/bench_pipeline_cpu_time.py). Per layer set, the
median over blocks of back-to-back cycles, as `validator.microbench.time_optimizer` (with
`barrier` and `agree` when several ranks time at once). Where ranks outnumber the host's cores the
calibration times them on one rank alone: a pass is a small share of its cycle, so most blocks see
no preemption inside it and the median hides the sharing. With a core per rank it times them with
all ranks at once, which shows what the ranks' memory traffic costs them
(`validator.calibration_phases.weight_pass_ranks_at_once`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch
from torch.func import functional_call

from simulator.costs import COPY_FORWARD
from validator.microbench import DEFAULT_MIN_BLOCK_S, _same, _sync, _time_blocks, make_optimizer

CYCLE_PASSES = ("stash", "predict", "repredict", "accumulate", "average")
"""The passes `_cycle` times as they run, in the order it returns them."""
WEIGHT_PASSES = (*CYCLE_PASSES, COPY_FORWARD)
LEARNING_RATE = 0.01


def _layer_inputs(modules: Sequence[torch.nn.Module], batch: torch.Tensor) -> list[torch.Tensor]:
    """The input of every layer for `batch` (the first layer's input), without a graph."""
    inputs, x = [], batch
    with torch.no_grad():
        for module in modules:
            inputs.append(x)
            x = module(x)
    return inputs


def _cycle(modules: dict, layers: range, x: torch.Tensor, optimizer, update, flat: torch.Tensor,
           device: torch.device) -> Callable[[], tuple[float, ...]]:
    """One asynchronous micro-batch on `layers`, the runtime's functions in the runtime's order,
    after a forward and a backward of the same layers through the modules (as a synchronous
    runtime runs them); returns the seconds of the stash, predict, repredict, accumulate and
    average passes, of the update (`update`: the profiled optimizer; the prediction reads
    `optimizer`'s momentum), of the modules' forward, of the forward on the stashed copy, of the
    modules' backward and of the backward on the copy."""
    from validator.weight_versions import (MicroState, accumulate_gradients, predict_layer_weights,
                                           release_backward, repredict_layer_weights, stash_weights)

    first = layers[0]

    def run() -> tuple[float, ...]:
        _sync(device)
        t_plain = time.perf_counter()
        plain = MicroState()
        out = x
        for layer in layers:  # the same forward through the modules' own weights, as a synchronous runtime
            if layer > 0:
                out = out.detach().requires_grad_(True)
            plain.inputs[layer] = out
            plain.outputs[layer] = out = modules[layer](out)
        _sync(device)
        t_plain_backward = time.perf_counter()
        _backward(plain, layers)  # onto the modules' own gradients, as the calibration's layers
        del out, plain
        _sync(device)
        t0 = time.perf_counter()
        plain_forward_s = t_plain_backward - t_plain
        plain_backward_s = t0 - t_plain_backward
        used = stash_weights(modules, layers)
        _sync(device)
        t1 = time.perf_counter()
        predicted = predict_layer_weights(modules, layers, optimizer, 1, LEARNING_RATE)
        _sync(device)
        t2 = time.perf_counter()
        del predicted
        state = MicroState(weights=used)
        out = x
        for layer in layers:  # the runtime's layer-wise graphs: each layer's input a leaf
            if layer > 0:
                out = out.detach().requires_grad_(True)
            state.inputs[layer] = out
            state.outputs[layer] = out = functional_call(modules[layer], used[layer], (out,))
        _sync(device)
        t_forward = time.perf_counter()
        repredict_layer_weights(modules, layers, optimizer, 1, LEARNING_RATE, used)
        _sync(device)
        t_repredicted = time.perf_counter()
        _backward(state, layers)  # onto the copy's fresh leaves, as the asynchronous runtime
        _sync(device)
        t3 = time.perf_counter()
        accumulate_gradients(modules, layers, used)
        del used
        release_backward(state, first)
        _sync(device)
        t4 = time.perf_counter()
        flat.div_(2)
        _sync(device)
        t5 = time.perf_counter()
        update.step()
        update.zero_grad(set_to_none=False)
        _sync(device)
        t6 = time.perf_counter()
        repredict_s = t_repredicted - t_forward
        return (t1 - t0, t2 - t1, repredict_s, t4 - t3, t5 - t4, t6 - t5, plain_forward_s, t_forward - t2,
                plain_backward_s, t3 - t_repredicted)

    return run


def _aged_cycle(modules: dict, layers: range, x: torch.Tensor, update, age: int,
                device: torch.device, on_copy: bool = True) -> Callable[[], tuple[float]]:
    """A stage's micro-batch with `age` others in flight: a stashed copy and a forward on it, then
    the backward of the micro-batch `age` forwards back on its own copy, its accumulate and the
    update; returns the seconds of that backward and of the new micro-batch's stash (0 through the
    modules). At age 0 the stash runs right after the previous update, as in the runtime: the
    calibration's stash since the thirty-fourth session (`reports/diagnostics/runtime_pass_gap/`: on
    the AMD EPYC host a stash of the MLP's stage-sized sets after the modules' forward and backward
    took 0.7-0.85x one right after the update). Primed: the first call already finds `age`
    micro-batches in flight. `on_copy=False`: the same through the modules (no copy, the backward
    onto their gradients, no accumulate and no update), as a synchronous 1F1B stage keeps
    micro-batches in flight within its step."""
    from validator.weight_versions import MicroState, accumulate_gradients, release_backward, stash_weights

    in_flight: list[MicroState] = []
    stash_s = [0.0]

    def forward() -> None:
        _sync(device)
        started = time.perf_counter()
        weights = stash_weights(modules, layers) if on_copy else None
        _sync(device)
        stash_s[0] = time.perf_counter() - started if on_copy else 0.0
        state = MicroState(weights=weights)
        out = x
        for layer in layers:
            if layer > 0:
                out = out.detach().requires_grad_(True)
            state.inputs[layer] = out
            state.outputs[layer] = out = (functional_call(modules[layer], state.weights[layer], (out,))
                                          if on_copy else modules[layer](out))
        in_flight.append(state)

    for _ in range(age):
        forward()

    def run() -> tuple[float, float]:
        forward()
        oldest = in_flight.pop(0)
        _sync(device)
        t0 = time.perf_counter()
        _backward(oldest, layers)
        _sync(device)
        t1 = time.perf_counter()
        if on_copy:
            accumulate_gradients(modules, layers, oldest.weights)
        release_backward(oldest, layers[0])
        if on_copy:  # through the modules no update: a synchronous stage updates after its step's last backward
            update.step()
            update.zero_grad(set_to_none=False)
        return (t1 - t0, stash_s[0])

    return run


def _backward(state, layers: range) -> None:
    """The runtime's layer-wise backward of one micro-batch over `layers` (each layer's input a
    leaf, its gradient handed to the layer before), from a gradient of ones at the last output."""
    for layer in reversed(layers):
        output, state.outputs[layer] = state.outputs[layer], None
        output.backward(state.input_grads[layer + 1] if layer < layers[-1] else torch.ones_like(output))
        state.input_grads[layer] = state.inputs[layer].grad


def time_weight_passes(modules: Sequence[torch.nn.Module], layer_sets: Sequence[Sequence[int]],
                       batch: torch.Tensor, repeats: int = 7, device: str = "cpu", warmup: int = 2, *,
                       barrier: Callable[[], None] | None = None, agree: Callable[[int], int] | None = None,
                       min_block_s: float = DEFAULT_MIN_BLOCK_S, optimizer: str = "momentum",
                       max_copy_age: int = 0) -> list[dict]:
    """Time of each weight pass (`WEIGHT_PASSES`) over each set of consecutive layers of `modules`
    (one module per layer; copies are used, so the originals are untouched), with `batch` as the
    first layer's input (the micro-batch the cycle's forward and backward run on), and of the
    update with `optimizer` (step, then the gradients zeroed) at the cycle's end, where every
    runtime runs it: after the stage's passes, not after itself as in `time_optimizer`'s blocks.

    Returns `[{"num_params", "num_tensors", "stash_s", "predict_s", "repredict_s", "accumulate_s",
    "average_s", "copy_forward_s", "update_s", "module_backward_s", "copy_backward_s",
    "stash_after_plain_s"}]` ("stash_s": timed in `_aged_cycle` at age 0, right after an update as the
    runtime runs it, since the thirty-fourth session; "stash_after_plain_s": `_cycle`'s, after a
    forward and a backward through the modules, the figure before it)
    ("copy_forward_s": the forward on the copy less the forward through the modules, each a median
    over blocks, at least 0; "module_backward_s" and "copy_backward_s": the backward through the
    modules, onto their gradients, and the backward on the copy, onto fresh leaves, medians over
    blocks), and with `max_copy_age` > 0, in `_aged_cycle`s: "aged_copy_backward_s", the backward on
    a copy `age` forwards old, for age 1 .. `max_copy_age`, "copy_cycle_fresh_s" the same at age 0,
    and "aged_module_backward_s" the backward through the modules with `age` micro-batches before it
    in flight, for age 0 .. `max_copy_age`.
    """
    barrier = barrier or (lambda: None)
    agree = agree or _same
    device = torch.device(device)
    inputs = _layer_inputs(modules, batch)
    results = []
    for layer_set in layer_sets:
        layers = range(min(layer_set), max(layer_set) + 1)
        if list(layers) != sorted(layer_set):
            raise ValueError(f"layer set {list(layer_set)}: the layers of a pipeline stage are consecutive")
        own = {layer: copy.deepcopy(modules[layer]).to(device) for layer in layers}
        params = [p for layer in layers for p in own[layer].parameters()]
        for p in params:
            p.grad = torch.zeros_like(p)
        momentum = make_optimizer("momentum", params, LEARNING_RATE)
        momentum.step()  # creates the momentum buffers the prediction reads
        update = momentum if optimizer == "momentum" else make_optimizer(optimizer, params, LEARNING_RATE)
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        run = _cycle(own, layers, inputs[layers[0]].to(device), momentum, update, flat, device)
        barrier()
        *medians, update_s, plain_forward_s, copy_forward_s, plain_backward_s, copy_backward_s = _time_blocks(
            run, repeats, warmup, min_block_s, agree)
        entry = {"num_params": int(sum(p.numel() for p in params)), "num_tensors": len(params)}
        entry.update({f"{name}_s": median for name, median in zip(CYCLE_PASSES, medians, strict=True)})
        entry[f"{COPY_FORWARD}_s"] = max(0.0, copy_forward_s - plain_forward_s)
        entry["update_s"] = update_s
        entry["module_backward_s"], entry["copy_backward_s"] = plain_backward_s, copy_backward_s
        # the stash as the runtime meets it, right after an update; `_cycle`'s kept beside it
        entry["stash_after_plain_s"] = entry["stash_s"]
        def aged_s(age: int, on_copy: bool) -> tuple[float, float]:
            barrier()
            aged = _aged_cycle(own, layers, inputs[layers[0]].to(device), update, age, device, on_copy)
            return _time_blocks(aged, repeats, warmup, min_block_s, agree)

        # the aged copy cycle at age 0 runs the stash in the runtime's order (alone where no ages are timed)
        copies = [aged_s(age, True) for age in range(max_copy_age + 1)]
        entry["stash_s"] = copies[0][1]
        if max_copy_age > 0:
            entry["copy_cycle_fresh_s"] = copies[0][0]
            entry["aged_copy_backward_s"] = [backward_s for backward_s, _stash in copies[1:]]
            entry["aged_module_backward_s"] = [aged_s(age, False)[0] for age in range(max_copy_age + 1)]
        results.append(entry)
        del momentum, update, own, params, run
    barrier()
    return results


__all__ = ["WEIGHT_PASSES", "time_weight_passes"]
