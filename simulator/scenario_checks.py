"""Checks of the scenario schema (`simulator.scenario`) kept apart from it: the names of
`strategy.placement`, printable `name` / `description` text, and cost settings that the cost model
in use would ignore (`kernel_catalogue.kernel_model_chosen` picks the model)."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator

from simulator.kernel_catalogue import kernel_model_chosen

PLACEMENT_NAMES = ("group_per_node", "stage_per_node", "tp_dp_pp")


def placement_name(value: Any) -> Any:
    """strategy.placement: a known order's name, or a device list (any other text: one error naming all)."""
    if value not in PLACEMENT_NAMES if isinstance(value, str) else not isinstance(value, (list, tuple)):
        raise ValueError("should be 'group_per_node', 'stage_per_node', 'tp_dp_pp' (kind megatron) or a list of "
                         "the device of each rank")
    return value


UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories a name or description may not hold: controls (ESC, newline, tab, DEL, C1),
format characters (bidi overrides such as U+202E, zero-width characters), surrogates and the line
and paragraph separators; each would reach the terminal and report.md as it is."""


def printable_text(text: str) -> str:
    """`name` / `description`: one line of printable text (ValueError naming the first bad character,
    escaped, and its position)."""
    for position, char in enumerate(text):
        if unicodedata.category(char) in UNPRINTABLE_CATEGORIES:
            hint = " (YAML's `>-` folds lines with no newline left)" if char in "\n\r" else ""
            raise ValueError(f"character {ascii(char)} (U+{ord(char):04X}) at position {position}: one line of "
                             f"printable text, no control or format characters{hint}")
    return text


DisplayText = Annotated[str, AfterValidator(printable_text)]
"""A scenario's `name` and `description`, printed to the terminal and into reports."""


def check_cost_settings(scenario) -> None:
    """ValueError for a cost setting the model in use ignores: `costs.efficiency` (the analytic
    roofline's) when the kernel model prices the cluster's GPU, `costs.host_overhead_s` (the kernel
    model's) when the analytic one does. `efficiency: {}` and `host_overhead_s: null` set nothing."""
    costs, gpu = scenario.costs, scenario.cluster.gpu
    chosen = "" if costs.model != "auto" else f": {gpu.name!r} of family {(gpu.architecture or 'none').lower()}"
    if kernel_model_chosen(costs.model, gpu):
        if costs.efficiency:
            raise ValueError(f"costs.efficiency: {dict(costs.efficiency)} is used by the analytic cost model only; "
                             f"this scenario is priced by the kernel model (costs.model {costs.model}{chosen}): "
                             "set costs.model analytic or drop costs.efficiency")
    elif costs.host_overhead_s is not None:
        raise ValueError(f"costs.host_overhead_s: {costs.host_overhead_s:g} is used by the kernel cost model only; "
                         f"this scenario is priced by the analytic model (costs.model {costs.model}{chosen}): "
                         "set costs.model kernel or drop costs.host_overhead_s")


def check_fp8(scenario) -> None:
    """ValueError for `training.fp8_recipe` where FP8 training cannot run: Transformer Engine's FP8
    keeps a 16-bit training dtype around its FP8 GEMMs, needs FP8 tensor cores (Ada, Hopper and
    later: a GPU whose sheet lists an fp8 peak), and only the kernel model expands its GEMMs."""
    recipe, training, gpu = scenario.training.fp8_recipe, scenario.training, scenario.cluster.gpu
    if recipe is None:
        return
    if training.dtype not in ("bf16", "fp16"):
        raise ValueError(f"training.fp8_recipe: {recipe!r} needs training.dtype bf16 or fp16 around its FP8 GEMMs "
                         f"(got {training.dtype})")
    for name, node_gpu in (("cluster.gpu", gpu), *((f"cluster.node_gpus (node {node})", other)
                                                   for node, other in sorted(scenario.cluster.node_gpus.items()))):
        if "fp8" not in node_gpu.peak_flops_per_s:
            raise ValueError(f"training.fp8_recipe: {recipe!r} needs FP8 tensor cores; {name} {node_gpu.name!r} "
                             "lists no fp8 peak (Ada, Hopper and later have them)")
    if not kernel_model_chosen(scenario.costs.model, gpu):
        raise ValueError(f"training.fp8_recipe: {recipe!r} is priced by the kernel cost model only; "
                         f"costs.model {scenario.costs.model} prices {gpu.name!r} analytically")
