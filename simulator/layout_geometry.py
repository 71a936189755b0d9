"""Pieces of a layout the search and its bounds share: the device of each megatron position under
the two searched orders, a chain's partition and TP floors shared by chains alike, the floors of a
context-parallel rank's ring transfers, and a cost model that remembers the times it was asked for."""

from __future__ import annotations

from dataclasses import replace

from simulator.costs import compute_parts


def megatron_device(order: str, t: int, p: int, d: int, c: int = 1):
    """(dp', pp, tp) -> device, dp' = replica x c + cp one of the d c ranks that reduce a gradient:
    Megatron's order (tp fastest, then cp, then pp, then dp: `simulator.strategies.tensor.TensorConfig.
    device_of`) or "tp_dp_pp" (tp fastest, then cp, then the replicas, then the stages)."""
    if order == "tp_dp_pp":  # a stage's d c ranks side by side
        return lambda dp, pp, tp: pp * d * c * t + dp * t + tp
    return lambda dp, pp, tp: ((dp // c * p + pp) * c + dp % c) * t + tp


def megatron_placement(order: str, t: int, p: int, d: int, c: int = 1) -> str | tuple[int, ...]:
    """strategy.placement of a megatron layout: Megatron's order (tp, cp, pp, dp) or, for "tp_dp_pp",
    the explicit device of each (replica, pp, cp, tp) position (`simulator.strategies.tensor.device_of`)."""
    if order != "tp_dp_pp":
        return "group_per_node"
    device = megatron_device(order, t, p, d, c)
    return tuple(device(e * c + k, pp, tp) for e in range(d) for pp in range(p) for k in range(c) for tp in range(t))


MEGATRON_ORDER_NAMES = ("group_per_node", "tp_dp_pp")
"""The named megatron rank orders (`strategy.placement`): Megatron's, and "tp_dp_pp"."""


def resolved_placement(placement: str | tuple[int, ...], t: int, p: int, d: int, c: int = 1) -> str | tuple[int, ...]:
    """A megatron scenario's strategy.placement as its plan takes it: a named order of the planner
    (`MEGATRON_ORDER_NAMES`) as `megatron_placement` gives it (the device list `ghpsim rank`
    simulates), anything else unchanged."""
    return megatron_placement(placement, t, p, d, c) if placement in MEGATRON_ORDER_NAMES else placement


def megatron_grid(model, c, shard, partition, device, d: int):
    """The `strategies.ghp.GridConfig` of a megatron candidate `c`'s pipeline chain, as its plan builds it
    (`strategies.tensor.compile_tensor_plan`): its split memory and its d data-parallel copies' rings
    (`device(dp', pp, tp)`)."""
    from simulator import memory_floor
    from simulator.strategies.chain_reduction import chain_reduction
    from simulator.strategies.ghp import GridConfig
    from simulator.strategies.pass_tails import chain_tails_s, chunk_ep_groups, chunk_tp_groups
    scenario, strategy, p, v = model.scenario, model.scenario.strategy, c.workers_per_group, c.num_virtual_stages
    reduction = chain_reduction(device, c.tp_degree, p, d, dtype=scenario.training.dtype, zero_stage=model.zero(c),
                                zero1_gradient_reduce=strategy.zero1_gradient_reduce, collective=strategy.collective,
                                ep=model.ep(c))
    tails = None if partition != "balanced" or p * v == 1 else chain_tails_s(  # only a balanced split weighs them
        model.workload, model.topology, model._measured, chunk_tp_groups(device, c.tp_degree, p, v),
        sequence_parallel=model.sp(c), recompute=model.recompute(c), microbatch_size=model.microbatch_size(c),
        element_bytes=model.element, memo=model._cache,
        ep_groups=chunk_ep_groups(device, c.tp_degree, p, v, model.ep(c)),
        signature=lambda group: model._signature((group,)))
    return GridConfig("megatron", 1, p * v, scenario.training.global_batch_size, scenario.training.dtype,
                      partition=partition, num_microbatches=c.num_microbatches, num_virtual_stages=v,
                      split_memory=memory_floor.candidate_split_memory(model, c, shard),
                      overlap_backward=strategy.overlap_backward, chain_reduction=reduction, pass_tails=tails)


def chain_partition(model, grid, shard, costs, chunk_devices: tuple[int, ...], b: float):
    """`strategies.stage_partition.grid_partition` of one megatron pipeline chain, remembered in `model._cache` (a
    `simulator.step_bound.BoundModel`). A balanced partition sees the chunk devices only through
    their cost models, the routes (latency, bottleneck bandwidth) between neighbours and the prices
    of their data-parallel rings (`chain_reduction.ring_prices`), so chains alike there share it.
    Where that split is over the device (`grid.split_memory`), the one the plan takes instead
    (`grid_partition`: not remembered)."""
    from simulator.strategies.stage_partition import grid_partition
    topology = model.topology
    if grid.partition != "balanced":
        return grid_partition(grid, shard, topology, costs, chunk_devices, b)
    memory, grid = grid.split_memory, replace(grid, split_memory=None)
    found = _plain_chain_partition(model, grid, shard, costs, chunk_devices, b)
    if memory is not None and memory.excess_bytes(found) > 0 and memory.least_bytes() <= memory.capacity_bytes:
        return grid_partition(replace(grid, split_memory=memory), shard, topology, costs, chunk_devices, b)  # rare
    return found


def _plain_chain_partition(model, grid, shard, costs, chunk_devices: tuple[int, ...], b: float):
    """The balanced split without a memory check, remembered (`chain_partition`)."""
    from simulator.heterogeneity import DeviceCosts
    from simulator.strategies.chain_reduction import ring_prices
    from simulator.strategies.stage_partition import boundary_hop, grid_partition
    topology, reduction, chunks = model.topology, grid.chain_reduction, len(chunk_devices)
    models = DeviceCosts(costs, topology)
    senders = reduction.tp_chains(chunks) if reduction else chunk_devices
    links = tuple(boundary_hop(topology, senders, chunks, k, k + step) for k in range(chunks) for step in (1, -1)
                  if 0 <= k + step < chunks)
    tails = grid.pass_tails and tuple(values.tobytes() for values in (
        grid.pass_tails.forward_s, grid.pass_tails.backward_s, grid.pass_tails.recomputed))  # alike: one split
    key = ("partition", id(shard), id(costs), tails, chunks, b, grid.num_microbatches, grid.num_virtual_stages, links,
           reduction is not None and reduction.reduces and ring_prices(reduction, topology), grid.overlap_backward,
           None if models.uniform else tuple(id(models.model_of(device)) for device in chunk_devices))
    found = model._cache.get(key)
    if found is None:
        found = model._cache[key] = grid_partition(grid, shard, topology, costs, chunk_devices, b)
    return found


def tp_floors(model, group: tuple[int, ...], sequence_parallel: bool, b: float) -> tuple[list, list]:
    """Per layer of the whole model: the floor of the TP collectives after its forward and after its
    backward pass in `group` (t = its size), remembered in `model._cache` (a `BoundModel`) for
    every candidate whose group times alike (`BoundModel._signature`)."""
    from simulator.strategies.pass_tails import layer_tails_s
    key = ("tp floors", model._signature((group,)), sequence_parallel, b)
    found = model._cache.get(key)
    if found is None:
        forward, backward = layer_tails_s(model.workload, sequence_parallel, b, model.element, len(group),
                                          lambda op, size, repeat: model.collective_floor_s((group,), op, size, "ring",
                                                                                            repeat))
        found = model._cache[key] = (forward.tolist(), backward.tolist())
    return found


def expert_floors_s(model, c, geo, b: float) -> dict[int, float]:
    """Per MoE layer: the floor of the expert-parallel collectives one pass plays after its compute
    (`simulator.strategies.experts.expert_alltoalls`, forward and backward alike): the dispatch and
    combine all-to-alls over the e replicas of its chunk's stage, the t TP ranks' groups together
    (each TP rank exchanges with its peers in the other replicas, all at once after the pass's TP
    collectives, on shared links, as the data-parallel floors count them), and with TP the routed
    tokens' allgather and reduce-scatter over its TP group; empty without expert parallelism."""
    from simulator.strategies.experts import is_moe
    from simulator.strategies.pass_tails import expert_layer_s
    t, e, sp, p = c.tp_degree, model.ep(c), model.sp(c), len(geo.chain)
    if e == 1:
        return {}
    device = megatron_device(c.placement, t, p, model.dp_ranks(c), c.cp_degree or 1)
    floors: dict[int, float] = {}
    for chunk, (start, end) in enumerate(geo.ranges):
        groups = tuple(tuple(device(replica, chunk % p, tp_rank) for replica in range(e)) for tp_rank in range(t))
        tp_group = geo.tp_groups[chunk % p]
        for index in (i for i in range(start, end) if is_moe(model.workload.layers[i])):
            floors[index] = expert_layer_s(
                model.workload.layers[index].spec, t, sp, b, model.element,
                lambda size: model.collective_floor_s(groups, "alltoall", size, "pairwise", 2),
                lambda op, size: model.collective_floor_s((tp_group,), op, size, "ring"))
    return floors


def ring_floors_s(model, c, geo, b: float, redo: list[list[int]]) -> tuple[list[float], list[float]]:
    """Per chunk: floors of one CP rank's ring K/V sends (`simulator.strategies.context`) in a forward
    pass and in a backward pass with its recomputed forwards `redo[chunk]`, from dp' 0 to the next CP
    rank dp' 1 of the chunk's stage: the bytes of all its attention layers in one transfer (one
    latency, a floor of the per-segment sends); zeros without context parallelism."""
    from simulator.plan import BACKWARD, FORWARD
    from simulator.strategies.context import ring_bytes_per_layer
    cp = c.cp_degree or 1
    if cp == 1:
        return [0.0] * len(geo.ranges), [0.0] * len(geo.ranges)
    layers, p = model.workload.layers, len(geo.rings)  # the whole model's specs, as the plan's ring

    def floor_s(chunk, indices, phase):
        specs = [layers[i].spec for i in indices if layers[i].spec.get("num_heads") and layers[i].spec.get("seq_len")]
        size = sum(ring_bytes_per_layer(spec, b * cp, c.tp_degree, cp, model.element, phase) for spec in specs)
        return model.p2p_floor_s(geo.rings[chunk % p][0], geo.rings[chunk % p][1], size) if size else 0.0

    forward = [floor_s(j, range(a, z), FORWARD) for j, (a, z) in enumerate(geo.ranges)]
    backward = [floor_s(j, range(a, z), BACKWARD) + floor_s(j, redo[j], FORWARD) for j, (a, z) in enumerate(geo.ranges)]
    return forward, backward


class RememberedCosts:
    """A cost model whose compute, update and weight-pass times are remembered (the same values)."""

    def __init__(self, model):
        self._model, self._seen = model, {}

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _remember(self, key, compute):
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = compute()
        return found

    def compute_s(self, layer_index, phase, batch):
        return self._remember((layer_index, phase, batch), lambda: self._model.compute_s(layer_index, phase, batch))

    def compute_parts(self, layer_index, phase, batch):
        return self._remember(("parts", layer_index, phase, batch),
                              lambda: compute_parts(self._model, layer_index, phase, batch))

    def optimizer_s(self, num_params, layers=None):
        return self._remember(("U", num_params, layers), lambda: self._model.optimizer_s(num_params, layers=layers))

    def weight_pass_s(self, name, num_params, layers=None):
        return self._remember((name, num_params, layers),
                              lambda: self._model.weight_pass_s(name, num_params, layers=layers))
