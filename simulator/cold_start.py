"""Cold passes: a layer's pass that runs after the rank spent a while on something else (waiting
for a message, other layers, other ranks on its core) runs slower than the same pass repeated back
to back, which is what the layer and optimizer microbenchmarks time.

Measured on this project's CPU machine (`validator.cold_bench`): MLP layers' backward +30-60 % and
the update +70 % after a 50 ms pause, most of it within ~15 ms. Which pause counts was measured with
`benchmarks/bench_cold_gap.py` (a stage's three backwards after its three forwards, micro-batch 8):
after a 10 ms sleep, 10 ms of streaming a 64 MB buffer, or even 10 ms of a spin loop that touches
no memory, the *first* backward was slower (ResNet stage 1.13-1.19x, MLP 1.29-1.34x, transformer
1.06-1.08x) and the next ones, whose saved activations were just as old, ran within a few per cent
of their back-to-back time. So the penalty follows the time since the rank last ran the layer at
all, not the age of the pass's operands. The model is empirical (the mechanism is the core's caches
and predictors, data and instruction side; Williams et al., "Roofline", CACM 2009 for the data side):

    factor(age) = 1 + (F - 1) x (1 - exp(-age / decay_s))

where `age` is the wall time since any pass or update of the layer on this rank ended (the previous
step's update is taken to end at the step's start), F >= 1 the calibrated ratio of the pass after a
pause of `gap_s` to the pass back to back (per layer and phase, at one batch size; values below 1
are noise and count as 1), and `decay_s` the time constant fitted to pauses shorter than `gap_s`.
A pass over several layers pays the largest of its layers' excesses, once
(`simulator.layer_ages`, which supplies the ages). (Before 2026-11-23 a pass mixed the age
of the layer's weights with that of its saved activations, by their bytes; that charged every
backward of a GPipe step the full penalty and put a 2-stage ResNet GPipe step 43 % over the
measured.) The update mixes two ages: its optimizer state (momentum, Adam's moments) was last
touched by the previous update, its weights and gradients by the layers' last backward (the
calibration times it with all three cold), each by its share of the bytes the update moves; traced
on this machine, a ResNet's SGD update right after the data-parallel allreduce took 0.84 ms, its
back-to-back time, not the 3x of an update on state untouched for a step. The top-k selection
(`simulator.sparse`) is slowed by the age of its error-feedback residual, last touched by the
previous step's selection.

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

    def layer_factor(self, phase: str, layer_index: int, age_s: float) -> float:
        """Slowdown of layer `layer_index`'s pass (`"F"` or `"B"`) over its back-to-back time when
        the rank last ran the layer `age_s` seconds earlier."""
        factors = self.forward_factors if phase == "F" else self.backward_factors
        return 1.0 + (max(1.0, factors[layer_index]) - 1.0) * self.coldness(age_s)

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
