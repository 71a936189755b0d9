"""The what-if `module_age` (thirty-second session): every backward, synchronous plans' too, pays the
modules' own backward's growth with the micro-batches in flight before it, as the calibration's
aged cycles timed it (`validator.weight_pass_bench._aged_cycle`, profiles since the twenty-ninth
session's growth run). Asynchronous backwards keep the copy's factor at their age on top, so that
they pay factor x the copy's growth (the modules' growth times `copy_age_factors`' ratio of the two).

The modules' growth at age a is not stored by itself; per layer set it is recovered from the three
figures the section keeps: age_ratios[a] / ratios x 1 / copy_age_growth[a]
= (copy[a] / module[0]) / (copy / module[0]) x (module[a] / module[0]) / (copy[a] / copy[0])
= module[a] / module[0] x copy[0] / copy (the copy's cycle-fresh over its in-cycle timing, ~1),
then the median over the sets; age 0 is 1, ages beyond the oldest timed play the oldest.
Profiles without `copy_age_growth` play 1 at every age (the current model). Patches this process
only.
"""

from __future__ import annotations

import statistics

import simulator.copy_backward as copy_backward
import simulator.engine as engine
import simulator.profile as simulator_profile


def module_growth(section: dict) -> tuple[float, ...]:
    """(1, growth at age 1, ...) from a profile's `copy_backward` section; (1,) without the data."""
    needed = ("age_ratios", "ratios", "copy_age_growth")
    if not section or any(not section.get(key) for key in needed):
        return (1.0,)
    per_set = [[aged / ratio / growth for aged, growth in zip(ages, growths)]
               for ages, ratio, growths in zip(section["age_ratios"], section["ratios"], section["copy_age_growth"])]
    return (1.0, *(statistics.median(column) for column in zip(*per_set)))


def patch_module_age() -> None:
    original_parse = simulator_profile.parse_copy_backward

    def parse(read, document):
        parsed = original_parse(read, document)
        if parsed is not None:
            object.__setattr__(parsed, "module_growth", module_growth(document.get("copy_backward")))
        return parsed
    simulator_profile.parse_copy_backward = parse

    def factors(plan, section):
        if section is None or getattr(section, "module_growth", (1.0,)) == (1.0,):
            return original_factors(plan, section)
        growth = section.module_growth
        asynchronous = bool(plan.meta.get("asynchronous"))
        return [{action_id: growth[min(age, len(growth) - 1)] * (section.at_age(age) if asynchronous else 1.0)
                 for action_id, age in copy_backward.copy_ages(actions).items()}
                for actions in plan.actions]
    original_factors = engine.Engine._copy_age_factors
    engine.Engine._copy_age_factors = staticmethod(factors)
