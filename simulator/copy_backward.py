"""What an asynchronous stage's backward costs on a weight copy over the same backward through the
modules (the profile's `copy_backward` section).

The engine charges a stage's backward from the calibration's per-layer backward
(`ProfileCosts.compute_s`), timed through the modules: each pass's weight gradients are added
onto the gradients already there (a read, an add and a write of every gradient). The
asynchronous pipeline runtime (`validator.pipeline_runtime`: pipedream, spectrain,
delayed_gradient) runs the backward on a copy of the weights (stashed, predicted or an alias),
whose leaves are fresh: its weight gradients are written once, and the `accumulate` pass, which
the engine charges on its own, adds them onto the live ones afterwards.

The calibration times both inside the weight passes' micro-batch cycle, on the same layers, in the
same cycle (`validator.weight_pass_bench`): `module_backward_s` and `copy_backward_s` per layer set.
`factor` is the median over the sets of copy / module. Measured 2026-11-24 on the Intel Xeon host
at a micro-batch of 16, one rank: the validation MLP (1024-wide linear layers) 0.55-0.90, median
0.71; ResNet-20 and the small transformer 0.96-1.02, median 0.99 (their backwards are dominated by
the activations' gradients, not the weights').

Timed in every calibration since the twenty-seventh session. The engine multiplies the backward
of asynchronous plans by `factor` (`ProfileCosts.asynchronous_backward_factor`; 1 for profiles
without the section), on every host. Kept after a fresh run on the Intel Xeon host under a rule
fixed before it: MAPE 8.8 -> 7.9 %, worst 46.1 -> 36.8 % (`reports/diagnostics/copy_backward/`).

**The copy's age** (twenty-ninth session, `reports/diagnostics/copy_age/`). A pipeline stage keeps
micro-batches in flight (stage s of p in asynchronous 1F1B: p - s), so the copy a backward reads was
made, and its forward run, some forwards earlier, with other passes between: its weights and saved
activations have left the caches. Calibrations since then also time the backward on a copy `age`
forwards old, for ages 1 to the world size - 1 (`validator.weight_pass_bench`), and keep
`age_factors`: the factor at age 0, then the median over the sets of each age's backward over the
modules'. The engine charges each asynchronous backward the factor at its copy's age
(`copy_ages`: the forwards its rank ran between the micro-batch's forward and this backward), the
last factor beyond the ages timed; profiles without `age_factors` play `factor` at every age.
Measured on the Intel Xeon host, one process, the MLP's first 2-stage stage (layers 0-2) with the
heap held (no fresh pages per pass): 1.81-1.85 ms fresh, 2.27-2.51 one forward back, 2.70-2.75 two
back, 2.85-3.00 three back; the runtime's first stage, one forward back, measured 2.51 ms.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from simulator.plan import BACKWARD, FORWARD

RATIO_RANGE = (0.1, 10.0)
"""A plausible copy / module ratio; anything outside names a broken timing."""


@dataclass(frozen=True)
class CopyBackward:
    """The profile's `copy_backward` section."""

    factor: float
    """Median over the calibration's layer sets of copy_backward_s / module_backward_s."""
    ratios: tuple[float, ...] = ()
    """Each set's ratio, in the calibration's order (informational)."""
    age_factors: tuple[float, ...] = ()
    """The factor on a copy 0, 1, ... forwards old (the first is `factor`); empty before the
    twenty-ninth session."""

    def at_age(self, age: int) -> float:
        """The factor for a backward on a copy `age` forwards old (the oldest timed beyond them)."""
        if not self.age_factors:
            return self.factor
        return self.age_factors[min(age, len(self.age_factors) - 1)]


def copy_backward_section(items: Sequence[Mapping] | None) -> dict | None:
    """The section from the weight passes' per-set timings (`validator.weight_pass_bench`), or None
    when they did not time both backwards (older benches) or a module backward took no time."""
    if not items or any(item.get("module_backward_s") is None or item.get("copy_backward_s") is None
                        for item in items):
        return None
    if any(item["module_backward_s"] <= 0 for item in items):
        return None
    ratios = [item["copy_backward_s"] / item["module_backward_s"] for item in items]
    section = {"factor": statistics.median(ratios), "ratios": ratios}
    aged = [item.get("aged_copy_backward_s") for item in items]
    if aged[0] and all(a is not None and len(a) == len(aged[0]) for a in aged):
        section["age_ratios"] = [[a / item["module_backward_s"] for a in ages] for item, ages in zip(items, aged)]
        section["age_factors"] = [section["factor"], *(statistics.median(column)
                                                       for column in zip(*section["age_ratios"]))]
    return section


def copy_ages(actions: Sequence) -> dict[int, int]:
    """Each backward's copy age on one rank: the forwards the rank ran between the micro-batch's
    forward of the same layers and this backward (`actions`: the rank's plan actions, in order;
    anything without a `phase` is skipped)."""
    forwards_run, forward_index, ages = 0, {}, {}
    for action in actions:
        phase = getattr(action, "phase", None)
        if phase == FORWARD:
            forward_index[(action.microbatch, action.layer_start)] = forwards_run
            forwards_run += 1
        elif phase == BACKWARD:
            index = forward_index.get((action.microbatch, action.layer_start))
            ages[action.id] = 0 if index is None else forwards_run - 1 - index
    return ages


def parse_copy_backward(read, document: Mapping) -> CopyBackward | None:
    """The optional `copy_backward` section (`read`: the profile's reader, which names the field of
    any error); None when absent."""
    section = read.mapping(document, "copy_backward", "copy_backward", optional=True)
    if not section:
        return None
    low, high = RATIO_RANGE
    factor = read.number(section, "factor", "copy_backward.factor", positive=True)
    if not low <= factor <= high:
        raise read.fail("copy_backward.factor", f"expected a ratio between {low} and {high}, got {factor!r}")
    age_factors = read.number_list(section, "age_factors", "copy_backward.age_factors", positive=True,
                                   optional=True)
    for index, value in enumerate(age_factors):
        if not low <= value <= high:
            raise read.fail(f"copy_backward.age_factors[{index}]",
                            f"expected a ratio between {low} and {high}, got {value!r}")
    return CopyBackward(factor=factor, ratios=read.number_list(section, "ratios", "copy_backward.ratios",
                                                               positive=True, optional=True),
                        age_factors=age_factors)
