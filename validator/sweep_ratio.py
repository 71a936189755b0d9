"""Each layer's pass inside a whole-model sweep against the same pass repeated back to back: the
ratio the calibration multiplies the layer microbenchmark's medians by before fitting them, so
that a profile's layer fits are the pass as a training step runs it (`simulator.profile`).

Why: `validator.microbench.time_layers` times a layer on itself, back to back, so its weights,
gradient buffers and activations stay in the caches between iterations. A step runs a layer once
per sweep: the forwards in order, the backwards in reverse, the other layers going through the
caches in between. On this project's 2-core CPU host small layers ran 0.8-2.4x slower inside a
sweep than back to back; a compute-bound transformer layer about 1.0x. The ratio is measured, not
derived: it depends on the cache sizes, the other layers' footprint and the ranks sharing the host.

Method (the pre-refactor `validator/sweep_bench.py`, slimmed), per batch size: `trials` trials,
each a barrier then, in alternating order, (a) `passes` whole-model sweeps (each layer's input
detached as the pipeline runtime does, the loss on the last layer) and (b) each layer's forward and
backward `passes` times back to back on the same inputs; the first `DROPPED_PASSES` of each are
dropped. A trial's ratio per layer and phase is the median in (a) over the median in (b); the
figure is the median over trials. Both halves time single passes on the same ranks at the same
time, so the ratio keeps the caches' share and leaves the host sharing to the microbenchmark's
block timing. For that, on a CPU host no more ranks measure at once than it has cores (the caller
picks them, `ranks_at_once`; the others wait at the barriers): with 4 ranks on 2 cores, single
passes preempted at random gave ratios of 0.7-2.4 on an MLP's layers where 2 ranks gave 0.8-1.3.
Gradients accumulate in `.grad` in both halves, as over a step's micro-batches.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from simulator.workload import Workload
from validator.microbench import _as_input, _sync, _to, activation_chain, load_models_module

DEFAULT_TRIALS = 5
DEFAULT_PASSES = 6
DROPPED_PASSES = 2
PHASE_NAMES = ("forward", "backward")


def ranks_at_once(world_size: int, device: str, cores: int | None = None) -> int:
    """Ranks that measure the ratios together: all of them on GPUs, at most one per core on a CPU."""
    return world_size if device != "cpu" else max(1, min(world_size, cores or os.cpu_count() or 1))


class SweepModel:
    """A model's layer modules at one batch size, each layer's input and output gradient fixed."""

    def __init__(self, workload: Workload, batch_size: int, models, seed: int, device: torch.device,
                 include_loss: bool = True):
        self.workload, self.device = workload, device
        self.models = load_models_module(models)
        self.modules = [module.to(device).train() for module in self.models.build_modules(workload, seed=seed)]
        inputs, self.targets = self.models.make_batch(workload, batch_size, seed=seed)
        inputs, self.targets = _to(inputs, device), _to(self.targets, device)
        self.chain = activation_chain(self.modules, inputs)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.output_grads = [torch.randn(output.shape, generator=generator, dtype=output.dtype).to(device)
                             for output in self.chain[1:]]
        self.loss_fn = getattr(self.models, "loss_fn", None) if include_loss else None

    def _forward(self, layer: int):
        output = self.modules[layer](_as_input(self.chain[layer], needs_grad=layer > 0))
        if self.loss_fn is not None and layer == len(self.modules) - 1:
            output = self.loss_fn(self.workload, output, self.targets)
        return output

    def _backward(self, layer: int, output) -> None:
        if self.loss_fn is not None and layer == len(self.modules) - 1:
            output.backward()
        else:
            output.backward(self.output_grads[layer])

    def _timed(self, step: Callable[[], object]) -> tuple[float, object]:
        _sync(self.device)
        started = time.perf_counter()
        result = step()
        _sync(self.device)
        return time.perf_counter() - started, result

    def sweeps_s(self, passes: int) -> tuple[list[float], list[float]]:
        """Per layer: median forward and backward seconds inside `passes` whole-model sweeps."""
        layers = range(len(self.modules))
        forwards, backwards = [[] for _ in layers], [[] for _ in layers]
        for _ in range(passes):
            outputs = {}
            for layer in layers:
                forward_s, outputs[layer] = self._timed(lambda layer=layer: self._forward(layer))
                forwards[layer].append(forward_s)
            for layer in reversed(layers):
                backwards[layer].append(self._timed(lambda layer=layer: self._backward(layer, outputs.pop(layer)))[0])
        return _medians(forwards), _medians(backwards)

    def back_to_back_s(self, passes: int) -> tuple[list[float], list[float]]:
        """Per layer: median forward and backward seconds of the layer run `passes` times in a row."""
        forwards, backwards = [], []
        for layer in range(len(self.modules)):
            layer_forwards, layer_backwards = [], []
            for _ in range(passes):
                forward_s, output = self._timed(lambda layer=layer: self._forward(layer))
                layer_forwards.append(forward_s)
                layer_backwards.append(self._timed(lambda layer=layer, output=output: self._backward(layer, output))[0])
            forwards.append(layer_forwards)
            backwards.append(layer_backwards)
        return _medians(forwards), _medians(backwards)


def _medians(rows: list[list[float]]) -> list[float]:
    return [statistics.median(row[DROPPED_PASSES:] or row) for row in rows]


def time_sweep_ratios(workload: Workload, batch_sizes: Sequence[int], trials: int = DEFAULT_TRIALS,
                      passes: int = DEFAULT_PASSES, device: str = "cpu", *, models=None, seed: int = 0,
                      barrier: Callable[[], None] | None = None, active: bool = True) -> dict | None:
    """This rank's ratios (module docstring): `{"forward_ratios", "backward_ratios"}`, one list per
    layer with one figure per batch size, and `sweep_backward_s`, per batch size the whole model's
    backward inside a sweep (sum over layers of the trials' median). Every rank calls it at the same
    time (`barrier` before every trial); with `active=False` a rank only joins the barriers and
    returns None."""
    if trials < 1 or passes <= DROPPED_PASSES:
        raise ValueError(f"trials must be >= 1 and passes > {DROPPED_PASSES}, got {trials} and {passes}")
    barrier = barrier or (lambda: None)
    if not active:
        for _ in range(len(batch_sizes) * trials + 1):
            barrier()
        return None
    num_layers = len(workload.layers)
    ratios = {phase: [[] for _ in range(num_layers)] for phase in PHASE_NAMES}
    sweep_backward_s = []
    for batch_size in batch_sizes:
        model = SweepModel(workload, batch_size, models, seed, torch.device(device))
        trial_ratios = {phase: [[] for _ in range(num_layers)] for phase in PHASE_NAMES}
        trial_backward_s = []
        for trial in range(trials):
            barrier()
            if trial % 2 == 0:
                sweep, alone = model.sweeps_s(passes), model.back_to_back_s(passes)
            else:
                alone, sweep = model.back_to_back_s(passes), model.sweeps_s(passes)
            for position, phase in enumerate(PHASE_NAMES):
                for layer in range(num_layers):
                    trial_ratios[phase][layer].append(sweep[position][layer] / alone[position][layer])
            trial_backward_s.append(sum(sweep[1]))
            for module in model.modules:
                module.zero_grad(set_to_none=True)
        for phase in PHASE_NAMES:
            for layer in range(num_layers):
                ratios[phase][layer].append(statistics.median(trial_ratios[phase][layer]))
        sweep_backward_s.append(statistics.median(trial_backward_s))
        del model
    barrier()
    return {"forward_ratios": ratios["forward"], "backward_ratios": ratios["backward"],
            "sweep_backward_s": sweep_backward_s}


# ----------------------------------------------------------------------------- pure functions


def combine_ranks(per_rank: Sequence[dict | None]) -> dict:
    """The ratios and sweep backwards of the ranks that measured (not None), averaged over them
    figure by figure. ValueError if none measured."""
    measured = [entry for entry in per_rank if entry is not None]
    if not measured:
        raise ValueError("no rank measured the sweep ratios")

    def mean(values):
        return statistics.fmean(values)

    combined = {key: [[mean(column) for column in zip(*layer_rows)] for layer_rows in zip(*(e[key] for e in measured))]
                for key in ("forward_ratios", "backward_ratios")}
    combined["sweep_backward_s"] = [mean(column) for column in zip(*(e["sweep_backward_s"] for e in measured))]
    return combined


def in_sweep(back_to_back_s: Sequence[float], ratios: Sequence[float]) -> list[float]:
    """A layer's back-to-back medians (one per batch size) times its sweep ratio at that batch size:
    the medians of its pass inside a sweep, which the profile's line is fitted to."""
    if len(back_to_back_s) != len(ratios):
        raise ValueError(f"{len(back_to_back_s)} medians but {len(ratios)} ratios")
    return [median * ratio for median, ratio in zip(back_to_back_s, ratios)]
