"""The calibration's layer-sweep phase: each layer's pass inside a whole-model sweep against the
same pass repeated back to back, every rank at once, at every calibrated batch size.

Why: the layer microbenchmark (`validator.microbench.time_layers`) times a layer on itself, back to
back, so its weights, gradient buffers and activations stay in the caches between iterations. A
step runs a layer once per sweep: its forwards in order, its backwards in reverse, the other layers
running through the caches in between. On this project's 2-core CPU host a memory-bound layer's
backward ran 11-30 % slower inside a sweep than back to back, its forward 0-15 %, a compute-bound
transformer layer's about 1.0x (`benchmarks/bench_sweep_cache.py`, reports/ACCURACY.md). The ratio
is measured rather than derived: it depends on the cache sizes, the other layers' footprint and how
many ranks share the host.

Method, per batch size: `trials` trials, each a barrier then, in alternating order, (a) `passes`
whole-model sweeps (each layer's input detached as the pipeline runtime does, the loss on the last
layer) and (b) each layer's forward and backward `passes` times back to back on the same inputs;
the first two passes of each are dropped. A trial's ratio per layer and phase is the median in (a)
over the median in (b); the figure is the median over trials. Both halves of a trial time single
passes on the same ranks at the same time, so the ratio keeps the cache's share and leaves the host
sharing to the layer microbenchmark's block timing. For that, on a CPU host no more ranks measure at
once than it has cores (the calibration's caller; the others wait at the barriers): with 4 ranks on
the project's 2 cores, single passes preempted at random put ratios of 0.7-2.4 on the MLP's layers
where 2 ranks gave 0.8-1.3. Gradients accumulate in `.grad` in both, as in a step's micro-batches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from simulator.workload import Workload
from validator.microbench import _as_input, _sync, _to, activation_chain, load_models_module

DEFAULT_TRIALS = 5
DEFAULT_PASSES = 6
DROPPED_PASSES = 2


class SweepModel:
    """A model's layer modules at one batch size, with each layer's input and output gradient fixed
    (also used by `benchmarks/bench_sweep_cache.py` on a stage's layers)."""

    def __init__(self, workload: Workload, batch_size: int, models, seed: int, device: torch.device,
                 include_loss: bool):
        self.workload = workload
        self.models = load_models_module(models)
        self.modules = [module.to(device).train() for module in self.models.build_modules(workload, seed=seed)]
        inputs, self.targets = self.models.make_batch(workload, batch_size, seed=seed)
        inputs, self.targets = _to(inputs, device), _to(self.targets, device)
        self.chain = activation_chain(self.modules, inputs)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.output_grads = [torch.randn(output.shape, generator=generator, dtype=output.dtype).to(device)
                             for output in self.chain[1:]]
        self.loss_fn = getattr(self.models, "loss_fn", None) if include_loss else None
        self.device = device

    def forward(self, layer: int):
        output = self.modules[layer](_as_input(self.chain[layer], needs_grad=layer > 0))
        if self.loss_fn is not None and layer == len(self.modules) - 1:
            output = self.loss_fn(self.workload, output, self.targets)
        return output

    def backward(self, layer: int, output) -> None:
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

    def sweeps_s(self, passes: int, layers: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
        """Per layer of `layers` (default all, in order): median forward and backward seconds inside
        `passes` sweeps over them."""
        layers = list(range(len(self.modules)) if layers is None else layers)
        forwards = {layer: [] for layer in layers}
        backwards = {layer: [] for layer in layers}
        for _ in range(passes):
            outputs = {}
            for layer in layers:
                forward_s, outputs[layer] = self._timed(lambda layer=layer: self.forward(layer))
                forwards[layer].append(forward_s)
            for layer in reversed(layers):
                backwards[layer].append(self._timed(lambda layer=layer: self.backward(layer, outputs.pop(layer)))[0])
        return _medians([forwards[layer] for layer in layers]), _medians([backwards[layer] for layer in layers])

    def tight_s(self, passes: int, layers: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
        """Per layer of `layers` (default all): median forward and backward seconds of the layer run
        `passes` times back to back."""
        forwards, backwards = [], []
        for layer in (range(len(self.modules)) if layers is None else layers):
            layer_forwards, layer_backwards = [], []
            for _ in range(passes):
                forward_s, output = self._timed(lambda layer=layer: self.forward(layer))
                backward_s, _ = self._timed(lambda layer=layer, output=output: self.backward(layer, output))
                layer_forwards.append(forward_s)
                layer_backwards.append(backward_s)
            forwards.append(layer_forwards)
            backwards.append(layer_backwards)
        return _medians(forwards), _medians(backwards)


def _medians(rows: list[list[float]]) -> list[float]:
    return [statistics.median(row[DROPPED_PASSES:] or row) for row in rows]


def time_layer_sweeps(workload: Workload, batch_sizes: Sequence[int], trials: int = DEFAULT_TRIALS,
                      passes: int = DEFAULT_PASSES, device: str = "cpu", *, models=None, seed: int = 0,
                      barrier: Callable[[], None] | None = None, include_loss: bool = True,
                      active: bool = True) -> dict | None:
    """The `layer_sweep` section of a profile (see the module): {"batch_sizes", "trials", "passes",
    "forward_ratios", "backward_ratios"}, the ratios one list per layer with one figure per batch
    size. Every rank calls it at the same time (`barrier` before every trial); with `active=False`
    a rank only takes part in the barriers and returns None."""
    if trials < 1 or passes <= DROPPED_PASSES:
        raise ValueError(f"trials must be >= 1 and passes > {DROPPED_PASSES}, got {trials} and {passes}")
    barrier = barrier or (lambda: None)
    if not active:
        for _ in range(len(batch_sizes) * trials + 1):
            barrier()
        return None
    num_layers = len(workload.layers)
    forward_ratios = [[] for _ in range(num_layers)]
    backward_ratios = [[] for _ in range(num_layers)]
    for batch_size in batch_sizes:
        model = SweepModel(workload, batch_size, models, seed, torch.device(device), include_loss)
        trial_forward = [[] for _ in range(num_layers)]
        trial_backward = [[] for _ in range(num_layers)]
        for trial in range(trials):
            barrier()
            if trial % 2 == 0:
                sweep, tight = model.sweeps_s(passes), model.tight_s(passes)
            else:
                tight, sweep = model.tight_s(passes), model.sweeps_s(passes)
            for layer in range(num_layers):
                trial_forward[layer].append(sweep[0][layer] / tight[0][layer])
                trial_backward[layer].append(sweep[1][layer] / tight[1][layer])
            for module in model.modules:
                module.zero_grad(set_to_none=True)
        for layer in range(num_layers):
            forward_ratios[layer].append(statistics.median(trial_forward[layer]))
            backward_ratios[layer].append(statistics.median(trial_backward[layer]))
    barrier()
    return {"batch_sizes": list(batch_sizes), "trials": trials, "passes": passes,
            "forward_ratios": forward_ratios, "backward_ratios": backward_ratios}
