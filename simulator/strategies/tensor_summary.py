"""Megatron summaries: the memory model's view of a TP rank, ZeRO memory, symmetric expansion.

Called by `simulator.simulate` for plans of kind megatron (`simulator.strategies.tensor`).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.plan import Collective, Plan
from simulator.strategies.zero import (GATHER_KEY, GATHER_LABEL, shard_memory, sharded_categories, state_divisor,
                                      unit_transient_events)
from simulator.topology import Topology
from simulator.workload import Workload


def memory_view(plan: Plan, workload: Workload, spans: list[tuple]) -> tuple[Plan, Workload, list[tuple]]:
    """(plan, workload, spans) for the memory model (`simulator.memory.rank_memory`): for a megatron
    plan its rank workload, without the TP collectives, the ZeRO-3 parameter gathers (counted by
    `simulator.strategies.zero.shard_memory`) and their spans (see below); else unchanged."""
    if "rank_workload" not in plan.meta:
        return plan, workload, spans
    actions = tuple(tuple(a for a in rank if not (isinstance(a, Collective) and a.key[0] in ("tp", GATHER_KEY)))
                    for rank in plan.actions)
    rows = spans.itertuples(index=False, name=None) if hasattr(spans, "itertuples") else spans
    kept = [span for span in rows if not (span[1] == "comm" and span[2].startswith(("tp ", GATHER_LABEL)))]
    return replace(plan, actions=actions), plan.meta["rank_workload"], kept


def tensor_memory_report(plan: Plan, spans: list[tuple], config) -> dict:
    """`simulator.memory.memory_report` of the ranks' TP shares (`meta["rank_workload"]`).

    The TP collectives are left out: their buffers are the activations and gradients the memory
    model already counts, not gradient buckets held until the optimizer. Ranks that walk alike
    are walked once and copied (`alike_memory_report`).
    """
    view, workload, kept = memory_view(plan, None, spans)
    return alike_memory_report(view, workload, kept, config, unit_transient_events(plan, spans))


def tensor_rank_memory(plan: Plan, spans, config) -> list:
    """`simulator.memory.rank_memory` of a megatron plan's ranks as its summary counts them
    (`tensor_memory_report`, then `simulator.strategies.zero.shard_memory`), for timelines: the
    sharded states divided (constant over the step) and ZeRO-2's transient drawn over the whole
    step (the summary adds it at the peak), so a timeline's peak is the summary's."""
    from simulator.memory import rank_memory
    view, workload, kept = memory_view(plan, None, spans)
    walks = rank_memory(view, workload, kept, config, extra=unit_transient_events(plan, spans))
    zero = plan.meta["zero"]
    if zero["shard_degree"] == 1 or zero["stage"] == 0:
        return walks
    sharded, added = sharded_categories(zero), zero["gradient_transient_bytes"]
    stages = len(zero.get("expert_shares") or [0.0])
    for walk in walks:
        divisor = state_divisor(zero, walk.rank % stages)
        walk.events = [(time_s, delta / divisor if category in sharded else delta, category)
                       for time_s, delta, category in walk.events] + [(0.0, added, "comm_buffers")] * bool(added)
    return walks


def alike_memory_report(plan: Plan, workload: Workload, spans: list[tuple], config, extra=None) -> dict:
    """`simulator.memory.memory_report` with one walk for all the ranks that walk alike: ranks whose
    actions are alike to those of their stage's rank in pipeline 0 (as many, the same recomputed and
    selection ids) and whose compute / comm span times are equal. The memory model is a function of
    exactly those, so the others are copies: every replica of a homogeneous run (data parallelism
    included) copies pipeline 0; with a straggler, the replicas it does not slow copy one another."""
    from simulator.memory import memory_report
    p = plan.workers_per_group
    if plan.num_groups == 1:
        return memory_report(plan, workload, spans, config, extra=extra)
    timelines, alike, first = _timelines(spans, plan.num_ranks), _alike_to_stage(plan), {}
    same_as = [first.setdefault((rank % p, timelines[rank]) if alike[rank] else (rank,), rank)
               for rank in range(plan.num_ranks)]
    return memory_report(plan, workload, spans, config, same_as, extra)


def _alike_to_stage(plan: Plan) -> list[bool]:
    """Per rank: whether its actions are alike to those of rank (its stage) of pipeline 0."""
    p = plan.workers_per_group
    per_rank = [plan.meta.get(key, {}) for key in ("recompute_actions", "selection_actions")]
    return [len(plan.actions[rank]) == len(plan.actions[rank % p])
            and all(ids.get(rank) == ids.get(rank % p) for ids in per_rank) for rank in range(plan.num_ranks)]


def _timelines(spans: list[tuple], num_ranks: int) -> list[tuple]:
    """Per rank, its compute and comm spans as sorted (stream, start, end)."""
    timelines: list[list] = [[] for _ in range(num_ranks)]
    for rank, stream, _name, _kind, start, end, *_rest in spans:
        if stream in ("compute", "comm"):
            timelines[rank].append((stream, start, end))
    return [tuple(sorted(timeline)) for timeline in timelines]


def finish_summary(summary: dict, plan: Plan, topology: Topology) -> None:
    """Megatron figures of a simulate() summary (in place): ZeRO sharding in the memory
    (`simulator.strategies.zero.shard_memory`), expansion of a symmetric run to every device,
    dp/tp index of each device."""
    from simulator.symmetry import expand_summary
    tensor = plan.meta["tensor"]
    shard_memory(summary, plan.meta["zero"])
    if "symmetry" in plan.meta:
        symmetry = plan.meta["symmetry"]
        expand_summary(summary, symmetry.rank_to_device, symmetry.num_stages, topology)
    for row in summary["devices"]:
        row["dp_rank"], row["tp_rank"] = divmod(row["group"], tensor["tp_degree"])
    summary["tensor"] = {**tensor, "symmetry": plan.meta["symmetry_decision"]}
