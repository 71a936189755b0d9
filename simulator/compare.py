"""Compare strategies on one scenario: variants of a scenario by strategy spec, simulated and ranked.

A strategy spec is `dp`, `mp`, `ghp` (the scenario's num_groups if it has one, else the fastest
G over the divisors of N strictly between 1 and N) or `ghp:G`; or a pipeline kind `KIND` (the
scenario's num_microbatches) or `KIND:m` (m micro-batches): the scenario's own kind keeps its
num_groups (G replicas, as `ghpsim simulate` runs it), any other pipeline kind runs G = 1
(`dropped_replicas`); or `megatron`: the scenario's own megatron layout (a scenario of another
kind: its tp_degree x pp_degree as kind megatron). A pipeline spec stays one string ("1f1b:4",
None), so every caller hands it to `with_strategy` unchanged. Two items of one plan ("ghp,ghp:8"
on a G = 8 ghp scenario, "1f1b,1f1b:1" on an m = 1 one) are refused (`resolve_specs`). Results
list the plans that fit in memory first (`ranked`). Without a list (`default_strategies`): dp, mp,
ghp, or a megatron scenario's own layout alone (as `ghpsim report` and `ghpsim validate` do).
"""

from __future__ import annotations

import re

from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.scenario import PIPELINE_KINDS, Scenario, scenario_from_dict
from simulator.simulate import SimulationResult, naming_source, simulate
from simulator.zero_config import without_zero

MEGATRON = "megatron"
MEGATRON_ONLY_DEGREES = {"ep_degree": 1, "cp_degree": 1}
"""Expert and context parallelism, kind megatron's only, as the other kinds run them (off); ZeRO
goes with its FSDP keys (`zero_config.without_zero`)."""


def with_strategy(scenario: Scenario, kind: str, num_groups: int | None = None) -> Scenario:
    """A copy of `scenario` with another strategy kind (and G; `KIND:m` also sets m), re-validated.
    The scenario's `num_virtual_stages` is kept for interleaved_1f1b and reset to 1 for every other
    kind (it only means something there), so one scenario can compare 1f1b with interleaved_1f1b; a
    ZeRO stage and expert and context parallelism (`megatron_only_settings`) are dropped for every
    kind but megatron; `megatron`: `megatron_layout`."""
    if kind == MEGATRON:
        return megatron_layout(scenario)
    raw = scenario.model_dump(mode="python")
    kind, _, microbatches = kind.partition(":")
    strategy = {**without_zero(raw["strategy"]), "kind": kind, "num_groups": num_groups, **MEGATRON_ONLY_DEGREES}
    if kind != "interleaved_1f1b":
        strategy["num_virtual_stages"] = 1
    if microbatches:
        strategy["num_microbatches"] = int(microbatches)
    workers = {"dp": 1, "mp": scenario.num_gpus}.get(kind, scenario.num_gpus // (num_groups or 1))
    partition = strategy["partition"]
    if not isinstance(partition, str) and len(partition) != workers * strategy["num_virtual_stages"]:
        strategy["partition"] = "balanced"  # an explicit partition fits only its own number of chunks
    if strategy["placement"] == "tp_dp_pp":  # a megatron rank order only
        strategy["placement"] = "group_per_node"
    raw["strategy"] = strategy
    return scenario_from_dict(raw, origin=scenario.source, base_dir=scenario.base_dir)


def megatron_only_settings(scenario: Scenario) -> list[str]:
    """The scenario's settings that only kind megatron plays ("strategy.zero_stage 1", ...): the
    other kinds of a comparison run without them (`with_strategy`)."""
    strategy = scenario.strategy
    return [f"strategy.{key} {getattr(strategy, key)}" for key, off in {"zero_stage": 0, **MEGATRON_ONLY_DEGREES}.items()
            if getattr(strategy, key) != off]


def megatron_layout(scenario: Scenario) -> Scenario:
    """The `megatron` spec: a megatron scenario as written; another kind's scenario as kind megatron
    with its tp_degree and pp_degree (one of them > 1) and allreduce for its gradients, else a
    one-line ScenarioError."""
    strategy = scenario.strategy
    if strategy.kind == MEGATRON:
        return scenario
    if strategy.tp_degree == strategy.pp_degree == 1:
        raise ScenarioError(f"--strategies: megatron: {scenario.source} is kind {strategy.kind}, not megatron, and sets "
                            "no strategy.tp_degree or pp_degree to use (add --set strategy.tp_degree=T)")
    raw = scenario.model_dump(mode="python")
    chunks = strategy.num_virtual_stages if strategy.kind == "interleaved_1f1b" else 1
    partition = strategy.partition
    if not isinstance(partition, str) and len(partition) != strategy.pp_degree * chunks:
        partition = "balanced"
    raw["strategy"] = {**raw["strategy"], "kind": MEGATRON, "num_groups": None, "num_virtual_stages": chunks,
                       "partition": partition, "dp_sync": "allreduce", "num_parameter_servers": 1,  # megatron: allreduce
                       "gradient_compression": "none",  # of dense gradients, each kept until the update (no laysa)
                       "placement": "group_per_node" if strategy.placement == "stage_per_node" else strategy.placement}
    if raw["training"]["memory_policy"] == "laysa":
        raw["training"] = {**raw["training"], "memory_policy": "reuse"}
    return scenario_from_dict(raw, origin=scenario.source, base_dir=scenario.base_dir)


DEFAULT_STRATEGIES = "dp,mp,ghp"
"""The strategy list `compare`, `report` and `validate` use when --strategies is not given (a
megatron scenario: its own layout instead, `default_strategies`)."""


def default_strategies(scenario: Scenario) -> str:
    """`--strategies` left out: a megatron scenario's own layout, else `DEFAULT_STRATEGIES` (without
    ghp where no grid 1 < G < N exists, as on 2 GPUs)."""
    if scenario.strategy.kind == MEGATRON:
        return MEGATRON
    return DEFAULT_STRATEGIES if ghp_group_counts(scenario.num_gpus) else DEFAULT_STRATEGIES.replace(",ghp", "")


def comma_items(text: str, option: str) -> list[str]:
    """The items of a comma list given to `option`, stripped; ScenarioError naming the option for
    an empty item ("dp,,mp", "4,"), an empty list or an item given twice ("dp,dp")."""
    items = [part.strip() for part in text.split(",")]
    if not any(items):
        raise ScenarioError(f"{option}: {text!r} is an empty list")
    if not all(items):
        raise ScenarioError(f"{option}: {text!r} has an empty item")
    check_distinct(items, text, option)
    return items


def check_distinct(values, text: str, option: str, note: str = "") -> None:
    """ScenarioError naming `option`, its `text` and the first of `values` given twice."""
    seen = set()
    for value in values:
        if value in seen:
            raise ScenarioError(f"{option} {text!r}: {value} is given twice{note}")
        seen.add(value)


def positive_ints(text: str, option: str) -> tuple[int, ...]:
    """A comma list of distinct positive integers given to `option` ("8,32"); ScenarioError naming it."""
    items = comma_items(text, option)  # a ScenarioError of its own (a ValueError) for an empty item
    try:
        values = tuple(int(part) for part in items)
    except ValueError:
        raise ScenarioError(f"{option}: {text!r} is not a comma list of integers") from None
    if min(values) < 1:
        raise ScenarioError(f"{option}: {text!r} needs positive integers")
    check_distinct(values, text, option)  # "8,08"
    return values


def parse_strategy_specs(text: str) -> list[tuple[str, int | None]]:
    specs = []
    for item in comma_items(text, "--strategies"):
        kind, _, groups = item.partition(":")
        if ":" in item and not groups:
            raise ScenarioError(f"--strategies: {item!r} needs a number after ':'")
        if item == MEGATRON:
            specs.append((MEGATRON, None))
            continue
        if (kind == "ghp" or kind in PIPELINE_KINDS) and re.fullmatch(r"[+-]?\d+", groups) and int(groups) < 1:
            counted = "G groups" if kind == "ghp" else "m micro-batches"
            raise ScenarioError(f"--strategies: {item!r}: the number after ':' ({counted}) must be at least 1")
        if kind in PIPELINE_KINDS and (not groups or (groups.isdigit() and int(groups) >= 1)):
            specs.append((f"{kind}:{int(groups)}" if groups else kind, None))
            continue
        if kind not in ("dp", "mp", "ghp") or (groups and (kind != "ghp" or not groups.isdigit() or int(groups) < 1)):
            raise ScenarioError(f"--strategies: {item!r} is not one of dp, mp, ghp, ghp:G, KIND, KIND:m or megatron "
                                f"(KIND one of {', '.join(PIPELINE_KINDS)})")
        specs.append((kind, int(groups) if groups else None))
    check_distinct([kind if groups is None else f"{kind}:{groups}" for kind, groups in specs], text, "--strategies",
                   " (each strategy runs once)")  # "ghp:4,ghp:04"
    return specs


def no_ghp_grid(num_gpus: int) -> str:
    """The error when GHP has no grid on `num_gpus` GPUs, whether or not --strategies asked for it."""
    return (f"ghp: no G with 1 < G < {num_gpus} fits this scenario's {num_gpus} GPUs "
            "(leave ghp out: --strategies dp,mp)")


def ghp_group_counts(num_gpus: int) -> list[int]:
    """Every G with G x M = N, 1 < G < N (the proper GHP grids)."""
    return [g for g in range(2, num_gpus) if num_gpus % g == 0]


def spec_item(kind: str, groups: int | None) -> str:
    """The --strategies item a spec stands for: "ghp:4", "1f1b:8", "dp"."""
    return kind if groups is None else f"{kind}:{groups}"


def _plan_text(scenario: Scenario, kind: str, groups: int | None) -> str | None:
    """The plan a resolved spec runs ("ghp (G=8 x M=2)", "1f1b (G=1 x M=8) m=4"), as the compare table labels
    it, or None where only simulating tells (a ghp without G: the fastest G)."""
    base, _, microbatches = kind.partition(":")
    num_gpus = scenario.num_gpus
    if base in PIPELINE_KINDS:
        groups = groups or 1
        return (f"{base} (G={groups} x M={num_gpus // groups}) "
                f"m={int(microbatches) if microbatches else scenario.strategy.num_microbatches}")
    if base == "ghp":
        return None if groups is None else f"ghp (G={groups} x M={num_gpus // groups})"
    return {"dp": f"dp (G={num_gpus} x M=1)", "mp": f"mp (G=1 x M={num_gpus})"}.get(base, base)


def resolve_specs(scenario: Scenario, specs: list[tuple[str, int | None]]) -> list[tuple[str, str, int | None]]:
    """(item, kind, G) for each spec, with the scenario's own settings filled in: a `ghp` without G on a
    ghp scenario, and a pipeline item of the scenario's own kind, take its num_groups (as `ghpsim
    simulate` runs it). A one-line ScenarioError for two items of one plan ("ghp,ghp:8" on a G = 8 scenario)."""
    resolved, seen = [], {}
    for kind, groups in specs:
        item, base = spec_item(kind, groups), kind.partition(":")[0]
        if groups is None and base == scenario.strategy.kind and (base == "ghp" or base in PIPELINE_KINDS):
            groups = scenario.strategy.num_groups
        _check_same_plan(seen, item, _plan_text(scenario, kind, groups))
        resolved.append((item, kind, groups))
    return resolved


def _check_same_plan(seen: dict[str, str], item: str, plan: str | None, how: str = "") -> None:
    """Record that `item` runs `plan`; a ScenarioError if an earlier item runs it too."""
    if plan is None:
        return
    if plan in seen:
        raise ScenarioError(f"--strategies: {seen[plan]} and {item} resolve to the same plan, {plan}{how}: "
                            "give one of them (each strategy runs once)")
    seen[plan] = item


def dropped_replicas(scenario: Scenario, specs: list[tuple[str, int | None]]) -> list[str]:
    """The pipeline items of another kind than a replicated pipeline or ghp scenario's: they run G = 1,
    without its strategy.num_groups (which only its own kind keeps, `resolve_specs`)."""
    own = scenario.strategy
    if own.kind not in (*PIPELINE_KINDS, "ghp") or (own.num_groups or 1) == 1:
        return []
    return [kind for kind, _ in specs if kind.partition(":")[0] in PIPELINE_KINDS and kind.partition(":")[0] != own.kind]


def ranking_key(summary: dict) -> tuple[bool, float]:
    """A result summary's place in a comparison: by step time, every plan that fits in GPU memory
    before every plan that does not (`ghpsim compare` and `ghpsim report` number only the first)."""
    return not summary["fits_in_memory"], summary["step_time_s"]


def ranked(results: list[SimulationResult]) -> list[SimulationResult]:
    """Results in `ranking_key` order: by step time, the plans that fit in memory first."""
    return sorted(results, key=lambda result: ranking_key(result.summary))


def compare(scenario: Scenario, specs: list[tuple[str, int | None]], costs=None) -> list[SimulationResult]:
    """Simulate each strategy spec (analytic costs unless `costs` is given, `resolve_specs`); results
    `ranked`: by step time, the plans that fit in memory first."""
    with naming_source(scenario):
        workload = resolve_workload(scenario.model, scenario.base_dir)
    resolved = resolve_specs(scenario, specs)
    seen = {plan: item for item, kind, groups in resolved if (plan := _plan_text(scenario, kind, groups))}
    results = []
    for item, kind, groups in resolved:
        if kind == "ghp" and groups is None:
            candidates = [simulate(with_strategy(scenario, "ghp", g), costs=costs, workload=workload)
                          for g in _feasible_groups(scenario, workload.num_layers)]
            if not candidates:
                raise ScenarioError(no_ghp_grid(scenario.num_gpus))
            best = min(candidates, key=lambda result: result.step_time_s)
            _check_same_plan(seen, item, _plan_text(scenario, "ghp", best.summary["num_groups"]),
                             " (ghp: the fastest feasible G)")
            results.append(best)
        else:
            try:
                results.append(simulate(with_strategy(scenario, kind, groups), costs=costs, workload=workload))
            except ScenarioError as error:  # name the list item that asked for the plan, not only its field
                raise ScenarioError(f"{error} (--strategies item {item})") from None
    return ranked(results)


def _feasible_groups(scenario: Scenario, num_layers: int) -> list[int]:
    batch = scenario.training.global_batch_size
    return [g for g in ghp_group_counts(scenario.num_gpus)
            if batch % g == 0 and scenario.num_gpus // g <= num_layers]
