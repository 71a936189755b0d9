"""Cold operands: a pass over weights and activations last touched long ago runs slower than the
same pass repeated back to back, which is what the layer and optimizer microbenchmarks time.

In a training step a layer's weights were last touched by the previous update or by another
micro-batch's pass, its saved activations by the micro-batch's own forward; meanwhile other layers,
other ranks and (on a shared host) other tenants pass through the caches. Measured on this project's
CPU machine (`validator.cold_bench`): MLP layers' backward +30-60 % and the update +70 % after a
50 ms pause, most of it within ~15 ms; a pass whose operands were touched 2 ms earlier is within a
few per cent of the back-to-back time. The mechanism is the memory hierarchy (Williams et al.,
"Roofline", CACM 2009: a memory-bound kernel runs at the bandwidth of the level its operands come
from); the model here is empirical:

    factor(age) = 1 + (F - 1) x (1 - exp(-age / decay_s))

where F >= 1 is the calibrated ratio of the pass after a pause of `gap_s` to the pass back to back
(per layer and phase, at one batch size; values below 1 are noise and count as 1), and `decay_s`
the time constant fitted to pauses shorter than `gap_s`. A layer pass reads weights and
activations whose ages differ, so its factor mixes both by their share of the bytes read:

    loss = w x (1 - exp(-age_weights / decay_s)) + (1 - w) x (1 - exp(-age_activations / decay_s))
    factor = 1 + (F - 1) x loss,    w = params / (params + batch x activation elements per sample)

(activations: the layer's input for a forward, its saved tensors for a backward). The engine
(`simulator.engine`) supplies the ages from the schedule it plays. The update mixes two ages the
same way: its optimizer state (momentum, Adam's moments) was last touched by the previous update,
its weights and gradients by the layers' last backward (the calibration times it with all three
cold), each by its share of the bytes the update moves; traced on this machine, a ResNet's SGD
update right after the data-parallel allreduce took 0.84 ms, its back-to-back time, not the
3x of an update on state untouched for a step. The top-k selection (`simulator.sparse`) is slowed
by the age of its error-feedback residual, last touched by the previous step's selection.

The factors are relative to a pass timed right after the same pass ("hot"), but the layer fits
are iterations of blocks of back-to-back passes lasting >= 10 ms (`validator.microbench`), and on
this project's CPU host a single hot pass can take longer than a block iteration (paired in time,
0.5 ms a pass for a narrow ResNet, most of it in the first and the loss layer; compared with block
medians taken at other moments, the host's slow spells had inflated it to 5.4 ms). No pass of a
training step runs inside such a block, so each
layer's pass costs its fit plus that measured difference (`forward_single_pass_s`,
`backward_single_pass_s`, `validator.cold_bench.single_pass_overheads`), and the cold factor
multiplies the sum: a pass after a long pause then takes the cold time measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from simulator.costs import OPTIMIZER_BYTES_PER_PARAM
from simulator.workload import Layer


@dataclass(frozen=True)
class ColdStart:
    """The profile's `cold_start` section (see `simulator.profile_format`)."""

    gap_s: float
    decay_s: float
    batch_size: int
    forward_factors: tuple[float, ...]
    backward_factors: tuple[float, ...]
    optimizer_factor: float
    topk_factor: float = 1.0
    """The top-k selection with error feedback, its residual cold and its gradient fresh (1: not measured)."""
    forward_single_pass_s: tuple[float, ...] | None = None
    """Per layer, what one forward right after itself takes over a back-to-back iteration (None: not measured)."""
    backward_single_pass_s: tuple[float, ...] | None = None
    """The same for the backward."""

    def single_pass_s(self, phase: str, layer_index: int) -> float:
        """Seconds added to layer `layer_index`'s fitted pass (`"F"` or `"B"`) at any batch size, at
        the fits' concurrency (measured at `batch_size` only; taken as constant, see the module)."""
        values = self.forward_single_pass_s if phase == "F" else self.backward_single_pass_s
        return values[layer_index] if values is not None else 0.0

    def coldness(self, age_s: float) -> float:
        """Share of the full cold penalty paid after `age_s` seconds untouched (0 hot .. 1 cold)."""
        if age_s <= 0:
            return 0.0
        return 1.0 - math.exp(-age_s / self.decay_s)

    def layer_factor(self, phase: str, layer_index: int, weight_share: float,
                     weights_age_s: float, activations_age_s: float) -> float:
        """Slowdown of layer `layer_index`'s pass (`"F"` or `"B"`) over its back-to-back time."""
        factors = self.forward_factors if phase == "F" else self.backward_factors
        full = max(1.0, factors[layer_index])
        loss = (weight_share * self.coldness(weights_age_s)
                + (1.0 - weight_share) * self.coldness(activations_age_s))
        return 1.0 + (full - 1.0) * loss

    def update_factor(self, age_s: float, weights_coldness: float | None = None, state_share: float = 1.0) -> float:
        """Slowdown of an update whose optimizer state was last touched `age_s` seconds earlier.

        The update reads the weights and gradients as well, which the backward touched more
        recently: `weights_coldness` (0..1, default: as cold as the state) is their coldness and
        `state_share` the state's share of the bytes the update moves (`update_state_share`)."""
        state = self.coldness(age_s)
        weights = state if weights_coldness is None else weights_coldness
        loss = state_share * state + (1.0 - state_share) * weights
        return 1.0 + (max(1.0, self.optimizer_factor) - 1.0) * loss

    def selection_factor(self, age_s: float) -> float:
        """Slowdown of a top-k selection whose error-feedback residual was last touched `age_s` seconds earlier."""
        return 1.0 + (max(1.0, self.topk_factor) - 1.0) * self.coldness(age_s)


def update_state_share(optimizer: str) -> float:
    """Optimizer state's share of the bytes an update moves: all but the weights' read and write and
    the gradient's read (`simulator.costs.OPTIMIZER_BYTES_PER_PARAM`): SGD 0, momentum 0.4, Adam 0.57."""
    return 1.0 - 3 * 4 / OPTIMIZER_BYTES_PER_PARAM[optimizer]


def weight_share(layer: Layer, phase: str, batch: float) -> float:
    """Weights' share of the elements a pass of `layer` on `batch` samples reads (see the module)."""
    activations = layer.input_elements_per_sample if phase == "F" else (
        layer.saved_elements_per_sample or layer.input_elements_per_sample)
    total = layer.num_params + batch * activations
    return layer.num_params / total if total > 0 else 0.0


def parse_cold_start(read, document: Mapping, num_layers: int) -> ColdStart | None:
    """The optional `cold_start` section of a profile document (`read`: the profile's reader,
    which names the field of any error); None when absent."""
    section = read.mapping(document, "cold_start", "cold_start", optional=True)
    if not section:
        return None
    where = "cold_start"
    factors = {}
    for phase in ("forward", "backward"):
        values = section.get(f"{phase}_factors")
        if not isinstance(values, list) or len(values) != num_layers:
            raise read.fail(f"{where}.{phase}_factors",
                            f"expected a list of {num_layers} factors (one per layer), got {values!r}")
        factors[phase] = tuple(read.number({"value": value}, "value", f"{where}.{phase}_factors[{i}]", positive=True)
                               for i, value in enumerate(values))
    single_pass = {}
    for phase in ("forward", "backward"):
        values = section.get(f"{phase}_single_pass_s")
        if values is None:
            single_pass[phase] = None
            continue
        if not isinstance(values, list) or len(values) != num_layers:
            raise read.fail(f"{where}.{phase}_single_pass_s",
                            f"expected a list of {num_layers} seconds (one per layer), got {values!r}")
        single_pass[phase] = tuple(read.number({"value": value}, "value", f"{where}.{phase}_single_pass_s[{i}]",
                                               minimum=0) for i, value in enumerate(values))
    return ColdStart(
        forward_single_pass_s=single_pass["forward"], backward_single_pass_s=single_pass["backward"],
        gap_s=read.number(section, "gap_s", f"{where}.gap_s", positive=True),
        decay_s=read.number(section, "decay_s", f"{where}.decay_s", positive=True),
        batch_size=read.integer(section, "batch_size", f"{where}.batch_size", minimum=1),
        forward_factors=factors["forward"], backward_factors=factors["backward"],
        optimizer_factor=read.number(section, "optimizer_factor", f"{where}.optimizer_factor", positive=True),
        topk_factor=(read.number(section, "topk_factor", f"{where}.topk_factor", positive=True)
                     if "topk_factor" in section else 1.0))
