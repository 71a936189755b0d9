"""Placement of a G x M grid's ranks on devices (`strategy.placement`), shared by the GHP-family
plans (`simulator.strategies`) and the cost estimates that precede them (`simulator.heuristics`,
`simulator.pipedream_costs`)."""

from __future__ import annotations


def place_ranks(placement: str | tuple[int, ...], groups: int, stages_per_group: int,
                gpus_per_node: int) -> tuple[int, ...]:
    """Device of each rank (rank = group * M + stage).

    group_per_node: a group's workers on consecutive devices (so they share a node when M <=
    GPUs per node); stage_per_node: the G peers of a stage on consecutive devices; a tuple:
    explicit device per rank.
    """
    if isinstance(placement, tuple):
        return placement
    if placement == "group_per_node":
        return tuple(range(groups * stages_per_group))
    return tuple(stage * groups + group for group in range(groups) for stage in range(stages_per_group))
