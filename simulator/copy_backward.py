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
made, and its forward run, some forwards earlier, with other passes between. Calibrations since then
also time, in aged cycles (`validator.weight_pass_bench._aged_cycle`), the backward on a copy `age`
forwards old, for ages 0 to the world size - 1, and the same backward through the modules with `age`
micro-batches before it in flight.
- `age_factors`: the aged copy over the fresh modules' backward. Charging it was the session's first
  candidate, scored on a fresh run under a rule fixed before it and not kept: MAPE 7.4 -> 7.6 %,
  worst 16.7 -> 18.1 %. It helped the MLP's 4-stage asynchronous cases (-11.9 -> -8.4 %) and hurt
  the transformer's (+6.1 -> +12.3 %): the transformer's backward through the modules ages as much
  as its copy's (its activations, not its weights, leave the caches), and synchronous plans, whose
  stages keep as many micro-batches in flight, are charged the fresh modules' backward.
  Informational; the what-if `copy_age` plays it.
- `copy_age_factors`: `factor` times the copy's growth with age over the modules' growth with as many
  in flight, the median over the sets. Measured in one process (`reports/diagnostics/copy_age/
  growth_probe.log`), ages 1-3: the MLP 1.02-1.04, 1.04-1.12, 1.06-1.12; ResNet-20 and the
  transformer within 1.00-1.03. The engine charges each asynchronous backward the factor at its
  copy's age (`copy_ages`: the forwards its rank ran between the micro-batch's forward and this
  backward; `CopyBackward.at_age`, the oldest timed beyond); profiles without it play `factor`.
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
    """The backward on a copy 0, 1, ... forwards old over the fresh modules' (the first is
    `factor`); informational (its candidate was not kept); empty before the twenty-ninth session."""
    copy_age_factors: tuple[float, ...] = ()
    """`factor` times the copy's growth with age over the modules' (the first is `factor`), what
    the engine charges; empty before the twenty-ninth session's second candidate."""

    def at_age(self, age: int) -> float:
        """The factor charged for a backward on a copy `age` forwards old (`copy_age_factors`, the
        oldest timed beyond them; `factor` where none were timed)."""
        if not self.copy_age_factors:
            return self.factor
        return self.copy_age_factors[min(age, len(self.copy_age_factors) - 1)]


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
        growth = [_copy_growth(item) for item in items]
        if all(g is not None and len(g) == len(aged[0]) for g in growth):
            section["copy_age_growth"] = growth
            section["copy_age_factors"] = [section["factor"], *(section["factor"] * statistics.median(column)
                                                                for column in zip(*growth))]
    return section


def _copy_growth(item: Mapping) -> list[float] | None:
    """One set's growth of the copy backward with its age over the modules' backward's with the
    same micro-batches in flight, ages 1 ..: (copy[a] / copy[0]) / (module[a] / module[0])."""
    copies = [item.get("copy_cycle_fresh_s"), *item["aged_copy_backward_s"]]
    modules = item.get("aged_module_backward_s")
    if None in copies or not modules or len(modules) != len(copies) or min(copies + list(modules)) <= 0:
        return None
    return [(copies[a] / copies[0]) / (modules[a] / modules[0]) for a in range(1, len(copies))]


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
    by_age = {}
    for key in ("age_factors", "copy_age_factors"):
        by_age[key] = read.number_list(section, key, f"copy_backward.{key}", positive=True, optional=True)
        for index, value in enumerate(by_age[key]):
            if not low <= value <= high:
                raise read.fail(f"copy_backward.{key}[{index}]",
                                f"expected a ratio between {low} and {high}, got {value!r}")
    return CopyBackward(factor=factor, ratios=read.number_list(section, "ratios", "copy_backward.ratios",
                                                               positive=True, optional=True), **by_age)
