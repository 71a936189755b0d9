"""Megatron summaries: the memory model's view of a TP rank, ZeRO memory, symmetric expansion.

Called by `simulator.simulate` for plans of kind megatron (`simulator.strategies.tensor`).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.plan import Collective, Plan
from simulator.strategies.zero import GATHER_KEY, GATHER_LABEL, shard_memory
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
    model already counts, not gradient buckets held until the optimizer. Ranks whose actions and
    span times equal those of the same stage in pipeline 0 (every rank of a homogeneous full run)
    are walked once and copied: the memory model is a function of exactly those.
    """
    view, workload, kept = memory_view(plan, None, spans)
    return alike_memory_report(view, workload, kept, config)


def alike_memory_report(plan: Plan, workload: Workload, spans: list[tuple], config) -> dict:
    """`simulator.memory.memory_report`, walking only pipeline 0's ranks when every rank's actions
    (as many, the same recomputed and selection ids) and compute / comm span times equal those of
    its stage's rank in pipeline 0 (every replica of a homogeneous run, data parallelism included):
    the memory model is a function of exactly those, so the others are copies."""
    from simulator.memory import memory_report
    p = plan.workers_per_group
    if plan.num_groups == 1 or not _actions_alike(plan) or not _alike_per_stage(spans, plan.num_ranks, p):
        return memory_report(plan, workload, spans, config)
    head = replace(plan, num_groups=1, actions=plan.actions[:p], rank_to_device=plan.rank_to_device[:p])
    report = memory_report(head, workload, [span for span in spans if span[0] < p], config)
    report["devices"] = [dict(report["devices"][rank % p], rank=rank) for rank in range(plan.num_ranks)]
    return report


def _actions_alike(plan: Plan) -> bool:
    p = plan.workers_per_group
    per_rank = [plan.meta.get(key, {}) for key in ("recompute_actions", "selection_actions")]
    return all(len(plan.actions[rank]) == len(plan.actions[rank % p])
               and all(ids.get(rank) == ids.get(rank % p) for ids in per_rank)
               for rank in range(p, plan.num_ranks))


def _alike_per_stage(spans: list[tuple], num_ranks: int, num_stages: int) -> bool:
    """True when every rank's compute and comm spans equal those of rank (its stage) of pipeline 0."""
    timelines: list[list] = [[] for _ in range(num_ranks)]
    for rank, stream, _name, _kind, start, end, *_rest in spans:
        if stream in ("compute", "comm"):
            timelines[rank].append((stream, start, end))
    for timeline in timelines:
        timeline.sort()
    return all(timelines[rank] == timelines[rank % num_stages] for rank in range(num_stages, num_ranks))


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
