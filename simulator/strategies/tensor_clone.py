"""A full megatron plan's ranks relabelled from their stage's first rank instead of built one by one.

In a dense model without expert or context parallelism or ZeRO-3, every rank of pipeline stage j
runs what rank j of pipeline 0 runs, action for action (the same ids, dependencies, computes and
sizes); only the names of its partners differ:

- a TP collective: its group (`_TensorRank.tp_ranks`) and the data-parallel index in its key;
- a data-parallel collective (gradient buckets, ZeRO-1/2's reduce-scatters and allgather): its
  group (`dp_ranks`) and the (stage, TP index) in its key (`dp_key`);
- a pipeline send or receive: its partner, g p further for pipeline g, and g in its key.

So a plan of 1,024 ranks builds 8 and relabels the others, sharing their `Compute` objects (frozen).
`tests/test_tensor_clone.py` checks relabelled plans equal built ones.
"""

from __future__ import annotations

from simulator.plan import Collective, Compute, Recv, Send, action_from_fields
from simulator.strategies.experts import is_moe


def relabelled_ranks_alike(config, workload) -> bool:
    """Whether a rank's actions are its stage's first rank's, relabelled (module docstring)."""
    return (config.ep == 1 and config.cp == 1 and config.zero_stage != 3
            and not any(is_moe(layer) for layer in workload.layers))


def relabelled_actions(prototype: tuple, recomputed: list[int], rank, shared: dict) -> tuple:
    """`rank.build()` (a `tensor._TensorRank` of pipeline g >= 1) from `prototype` and `recomputed`,
    the actions and recompute ids of rank `rank.stage_index` of pipeline 0; `rank.recomputed` set
    as building would set it. `shared` (one dict per plan) keeps each relabelled collective for the
    other ranks of its group, whose action it is too (frozen, like the computes)."""
    g, offset = rank.pipeline, rank.pipeline * rank.config.pp
    tp_ranks, dp_ranks, dp_key, dp_index = rank.tp_ranks, rank.dp_ranks, rank.dp_key, rank.dp_index
    actions = []
    for action in prototype:
        kind = type(action)
        if kind is Compute:
            actions.append(action)
            continue
        key = action.key
        if kind is Collective:
            group = (id(action), dp_index if key[0] == "tp" else dp_key)
            known = shared.get(group)
            if known is not None:
                actions.append(known)
                continue
            values = dict(action.__dict__)
            if key[0] == "tp":
                values["ranks"], values["key"] = tp_ranks, ("tp", dp_index, *key[2:])
            else:
                values["ranks"], values["key"] = dp_ranks, (key[0], *dp_key, *key[3:])
            shared[group] = action_from_fields(kind, values)
            actions.append(shared[group])
            continue
        values = dict(action.__dict__)
        if kind is Send:
            values["dst"], values["key"] = action.dst + offset, (key[0], g, *key[2:])
        elif kind is Recv:
            values["src"], values["key"] = action.src + offset, (key[0], g, *key[2:])
        else:
            raise TypeError(f"relabelled_actions: unexpected action {action!r}")
        actions.append(action_from_fields(kind, values))
    rank.recomputed = list(recomputed)
    return tuple(actions)
