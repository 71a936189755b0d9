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
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RATIO_RANGE = (0.1, 10.0)
"""A plausible copy / module ratio; anything outside names a broken timing."""


@dataclass(frozen=True)
class CopyBackward:
    """The profile's `copy_backward` section."""

    factor: float
    """Median over the calibration's layer sets of copy_backward_s / module_backward_s."""
    ratios: tuple[float, ...] = ()
    """Each set's ratio, in the calibration's order (informational)."""


def copy_backward_section(items: Sequence[Mapping] | None) -> dict | None:
    """The section from the weight passes' per-set timings (`validator.weight_pass_bench`), or None
    when they did not time both backwards (older benches) or a module backward took no time."""
    if not items or any(item.get("module_backward_s") is None or item.get("copy_backward_s") is None
                        for item in items):
        return None
    if any(item["module_backward_s"] <= 0 for item in items):
        return None
    ratios = [item["copy_backward_s"] / item["module_backward_s"] for item in items]
    return {"factor": statistics.median(ratios), "ratios": ratios}


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
    return CopyBackward(factor=factor, ratios=read.number_list(section, "ratios", "copy_backward.ratios",
                                                               positive=True, optional=True))
