"""The stage partition of a G x M grid or a pipeline chain: `strategy.partition` resolved to layer
ranges (`simulator.partition`), with what the balanced and serial partitions weigh besides compute:
the transfers between consecutive stages (Hockney's alpha-beta on the route's slowest link), each
stage's allreduce among its replicas and its optimizer step (`stage_costs.StageUpdate`), and each
layer's bytes on its device (the serial partition's memory cap)."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from weakref import WeakKeyDictionary

import numpy as np

from simulator.collective_forms import p2p_time_s
from simulator.costs import BACKWARD, CostModel
from simulator.errors import ScenarioError
from simulator.heterogeneity import stage_compute_s
from simulator.partition import (balanced_partition, explicit_partition, flushed_partition,
                                 polished, serial_partition, uniform_partition)
from simulator.schedules.ir import ASYNCHRONOUS_KINDS
from simulator.strategies.pass_tails import recompute_tails
from simulator.stage_costs import HostIssue, StageUpdate, joined_classes
from simulator.topology import Topology
from simulator.workload import Workload, dtype_bytes

SERIAL_KINDS = ("dp", "mp", "ghp")
"""Kinds whose groups run one batch through their stages (no micro-batches): their balanced
partition is the serial one (`simulator.partition.serial_partition`) where that fits as well."""


_STEP_MICROBATCHES: ContextVar[int | None] = ContextVar("step_microbatches", default=None)
_NOTES: ContextVar[list | None] = ContextVar("partition_notes", default=None)


@contextmanager
def partition_notes():
    """The list of what memory made the partitions compiled inside do (`_note_memory`), one line each."""
    token = _NOTES.set([])
    try:
        yield _NOTES.get()
    finally:
        _NOTES.reset(token)


@contextmanager
def partitioned_as_the_step(num_microbatches: int):
    """Flushed pipelines compiled inside take the balanced partition of a step of `num_microbatches`
    (the same micro-batch size, the global batch scaled with them): a short play of a long pipeline
    (`simulator.steady_extension`) must play the split of the step it stands for, not its own."""
    token = _STEP_MICROBATCHES.set(num_microbatches)
    try:
        yield
    finally:
        _STEP_MICROBATCHES.reset(token)


def grid_partition(config, workload: Workload, topology: Topology, costs: CostModel, rank_to_device,
                   group_batch: float) -> tuple[tuple[int, int], ...]:
    """Stage ranges of `config.partition` (a `strategies.ghp.GridConfig`) for the chunks on
    `rank_to_device` (every replica's, replica-major; a megatron chain: its one replica's); inside
    `partitioned_as_the_step(m)`, a flushed pipeline's as its step of m micro-batches would take. A
    flushed pipeline's balanced split is never one its schedule plays slower than the uniform split."""
    step_m = _STEP_MICROBATCHES.get()
    if step_m and step_m != config.num_microbatches and config.strategy not in (*SERIAL_KINDS, *ASYNCHRONOUS_KINDS):
        memory = config.split_memory and replace(config.split_memory, shape=replace(
            config.split_memory.shape, num_microbatches=step_m))  # the step's in-flight micro-batches
        config = replace(config, num_microbatches=step_m, split_memory=memory,
                         global_batch_size=config.global_batch_size * step_m // config.num_microbatches)
    num_layers, num_stages = workload.num_layers, config.workers_per_group
    if num_stages == 1:  # a list given is still checked: [1, 2] for one stage is a mistake
        return ((0, num_layers),) if isinstance(config.partition, str) else explicit_partition(
            config.partition, num_layers, 1)
    if config.partition == "pipedream":  # PipeDream's DP, every stage replicated G times
        from simulator.pipedream_costs import grid_pipedream_partition
        return grid_pipedream_partition(config, workload, topology, costs, rank_to_device, group_batch)
    if config.partition == "uniform":
        return uniform_partition([layer.kind for layer in workload.layers], num_stages)
    if config.partition != "balanced":
        return explicit_partition(config.partition, num_layers, num_stages)
    reduction = config.chain_reduction  # a megatron chain's: t chains send 1 / t of a boundary each
    senders, sent = (reduction.tp_chains(num_stages), len(reduction.rings[0])) if reduction else (rank_to_device, 1)
    boundary_bytes = np.array([layer.output_elements_per_sample for layer in workload.layers],
                              dtype=float) * group_batch * dtype_bytes(config.dtype) / sent
    input_bytes = np.array([layer.input_elements_per_sample for layer in workload.layers],
                           dtype=float) * group_batch * dtype_bytes(config.dtype) / sent
    forward = np.zeros((num_stages, num_layers))
    backward = np.zeros((num_stages, num_layers))
    for stage in range(num_stages):
        if stage + 1 < num_stages:
            forward[stage] = _boundary_time_s(topology, senders, num_stages, stage, stage + 1, boundary_bytes)
        if stage > 0:
            backward[stage] = _boundary_time_s(topology, senders, num_stages, stage, stage - 1, input_bytes)
    classes = None
    if reduction is not None and reduction.reduces:  # the data-parallel rings of a megatron chain
        from simulator.strategies.chain_reduction import chain_update, ring_prices
        update, classes = chain_update(ring_prices(reduction, topology), workload, topology, costs,
                                       rank_to_device, group_batch, config.num_microbatches, config.overlap_backward)
    else:
        update = _stage_update(config, workload, topology, costs, rank_to_device, group_batch)
    if config.strategy in SERIAL_KINDS or config.strategy in ASYNCHRONOUS_KINDS:  # paced by the slowest stage
        compute = stage_compute_s(costs, topology, rank_to_device, config.num_groups, num_stages, num_layers,
                                  group_batch)
        ranges = balanced_partition(compute, forward, backward, num_stages, update)
    else:  # a flushed pipeline: one micro-batch's fill and drain, then the slowest chunk's pace
        host = _host_issue(stage_compute_s(costs, topology, rank_to_device, config.num_groups, num_stages,
                                           num_layers, group_batch, parts=True),
                           config.pass_tails or recompute_tails(workload, config.recompute))
        ranks = num_stages // config.num_virtual_stages
        played = _played_step(config, host, forward, backward, update,
                              classes or _ring_classes(topology, rank_to_device, num_stages, ranks))
        passes = 2 * config.num_microbatches * num_stages

        def partitioned(played_s, polish_passes: int, allowed=None):
            return flushed_partition(host.device_s, forward, backward, num_stages, update, config.num_microbatches,
                                     config.num_virtual_stages, played_s, polish_passes // passes, host, allowed)
        ranges = partitioned(played, POLISH_WORK)
        even = _uniform_or_none(workload, num_stages)
        if even is not None and played is not None and played(even) < played(ranges):  # the candidates can miss it
            ranges = even
        memory = config.split_memory
        if memory is not None and memory.excess_bytes(ranges) > 0:  # over the device: keep to splits that fit
            first, ranges = ranges, _fitting_partition(memory, ranges, even, partitioned, played, passes)
            _note_memory(memory, first, ranges)
    if config.strategy in SERIAL_KINDS and update is not None:  # one batch through the stages
        layer_bytes, working_bytes = _layer_bytes(workload, config, group_batch)
        device = config.memory_bytes - working_bytes  # the device, less the largest backward's working set
        cap_bytes = max(device, max(layer_bytes[a:b].sum() for a, b in ranges))  # or balanced's largest
        ranges = serial_partition(compute, forward, backward, num_stages, update, layer_bytes, cap_bytes) or ranges
    return ranges


def _host_issue(parts: np.ndarray, tails) -> HostIssue:
    """`HostIssue` of the device and host seconds of each layer's forward, then backward (`parts`),
    with `PassTails`: a recomputed layer's backward runs its forward first, as part of the backward
    where the recompute waits for the gradient (megatron), else as work before it (`HostIssue.redo_s`)."""
    if tails is None:
        return HostIssue(*parts)
    device_forward, host_forward, device_backward, host_backward = parts
    redo_device, redo_host = (np.where(tails.recomputed, values, 0.0) for values in (device_forward, host_forward))
    if not tails.recompute_waits:  # before the backward, as soon as the rank is free
        return HostIssue(*parts, tails.forward_s, tails.backward_s, redo_device, redo_host)
    return HostIssue(device_forward, host_forward, device_backward + redo_device, host_backward + redo_host,
                     tails.forward_s, tails.backward_s)


def _fitting_partition(memory, ranges, even, partitioned, played, passes: int):
    """The flushed partition again (`partitioned(played_s, polish passes, allowed)`), its candidates
    of ranges each rank can hold (one chunk a rank: `SplitMemory.stage_fits`), each split ranked by
    (bytes its fullest rank is over the device, its played step of `passes` passes, played only
    where it fits): the fastest split that fits where one of the candidates or their polish does,
    else the first choice; without a play (a long schedule), the uniform split `even` where that
    fits; nothing where no split can fit (`SplitMemory.least_bytes`)."""
    if memory.least_bytes() > memory.capacity_bytes:  # no split can fit
        return ranges
    if played is None:
        return even if even is not None and memory.excess_bytes(even) == 0 else ranges

    def ranked(split):
        excess = memory.excess_bytes(split)
        return excess, played(split) if excess == 0 else 0.0
    found = partitioned(ranked, 0, memory.stage_fits())
    best = polished(min((split for split in (found, even, ranges) if split is not None), key=ranked), ranked,
                    FITTING_POLISH_WORK // passes)
    return best if memory.excess_bytes(best) == 0 else ranges  # a split over the device anyway: the fastest


def _note_memory(memory, first, kept) -> None:
    """Inside `partition_notes`: why the split kept is not the fastest one the balanced partition
    found, a rank's bytes by the memory floor (`memory_floor.SplitMemory`)."""
    notes = _NOTES.get()
    if notes is None:
        return
    usable_gib = memory.capacity_bytes / 2**30

    def counts(ranges) -> str:
        return "[" + ", ".join(str(end - start) for start, end in ranges) + "]"

    def needed_gib(ranges) -> float:
        return (memory.capacity_bytes + memory.excess_bytes(ranges)) / 2**30
    if memory.excess_bytes(kept) == 0:
        notes.append(f"{counts(kept)} is the fastest split that fits; the fastest, {counts(first)}, needs at least "
                     f"{needed_gib(first):.1f} GiB on a rank, over the {usable_gib:.1f} GiB usable on a device")
    else:
        least_gib = memory.least_bytes() / 2**30
        notes.append(f"{counts(kept)} needs at least {needed_gib(kept):.1f} GiB on a rank, over the {usable_gib:.1f} "
                     f"GiB usable on a device; " + (f"no split can fit (each needs at least {least_gib:.1f} GiB)"
                                                     if least_gib > usable_gib else "none of the splits searched fits"))


def _uniform_or_none(workload: Workload, num_stages: int) -> tuple[tuple[int, int], ...] | None:
    """The uniform split (equal counts of the repeated layer kind), None where there are fewer of them than stages."""
    try:
        return uniform_partition([layer.kind for layer in workload.layers], num_stages)
    except ScenarioError:
        return None


PLAYED_OPS_LIMIT = 4096
"""Most passes (2 m v p) of a schedule the flushed partition plays to rank its candidate splits
(about 1 us a pass); longer ones keep the closed form's choice."""
POLISH_WORK = 2_000
"""Passes the flushed partition may play moving single cuts after ranking (`partition.polished`):
about 2 ms, as the planner partitions every pipeline geometry it bounds."""


FITTING_POLISH_WORK = 200_000
"""Passes the partition may play moving single cuts towards the fastest split that fits, where the
first choice is over the device (rare: about 0.2 s)."""


def _played_step(config, host: HostIssue, forward, backward, update, ring_classes):
    """ranges -> the step its schedule plays with those chunks (`schedules.makespan`): each chunk's
    forward and backward pass (`HostIssue.pass_s`), its sends (`forward`, `backward`: the arrays of
    the closed form) and each rank's closing (`StageUpdate.closing_s`, once a step), the allreduces
    of ranks in one of `ring_classes` sharing their NICs (`_closings_s`); None beyond
    `PLAYED_OPS_LIMIT`."""
    from simulator.schedules import checked_schedule
    from simulator.schedules.makespan import pass_ends_s
    v, m = config.num_virtual_stages, config.num_microbatches
    ranks = config.workers_per_group // v
    if 2 * m * v * ranks > PLAYED_OPS_LIMIT:
        return None
    kind = "gpipe" if config.strategy == "gpipe" else "interleaved_1f1b" if v > 1 else "1f1b"
    schedule = checked_schedule(kind, ranks, m, v)
    alone = None if update is None else update.alone()

    def played_s(ranges) -> float:
        chunks = range(len(ranges))
        ahead, back = zip(*(host.pass_s(k, a, b) for k, (a, b) in zip(chunks, ranges)))
        sends = ([float(forward[k, b - 1]) for k, (a, b) in zip(chunks, ranges)],
                 [float(backward[k, a]) for k, (a, b) in zip(chunks, ranges)])
        early = [host.redo_s(k, a, b) for k, (a, b) in zip(chunks, ranges)]
        ends, chunk_ends = pass_ends_s(schedule, ahead, back, *sends, early if any(early) else None)
        return max(ends) if alone is None else max(_closings_s(alone, ranges, ends, chunk_ends, ring_classes))

    return played_s


def _closings_s(alone: StageUpdate, ranges, ends: list[float], chunk_ends: list[float],
                ring_classes: list[int]) -> list[float]:
    """When each rank is done, its last pass ending at ends[r]. Each chunk's allreduce (at its own
    rate, `alone`) is ready when its last backward ends (chunk_ends) less what that backward hides
    (DDP's buckets); a rank's chunks reduce one after another, in that order; then the optimizer
    step of its layers. Ranks of one class (-1: none) share their nodes' NICs while their
    allreduces overlap, an equal share to each chunk's (processor sharing, Kleinrock 1976, as the
    engine's max-min fair flows split one bottleneck), where the closed form prices every ring
    leaving a node as if all ran at once."""
    ranks = len(ends)
    work, ready, optimizer = [0.0] * len(ranges), [0.0] * len(ranges), [0.0] * ranks
    for k, (a, b) in enumerate(ranges):
        work[k], shown, step_s = alone.closing_parts_s(k, a, b - 1)
        ready[k] = chunk_ends[k] + shown - work[k]
        optimizer[k % ranks] += step_s
    finish = list(ends)
    for rank in (r for r in range(ranks) if ring_classes[r] == -1):
        reduced = -np.inf
        for k in sorted(range(rank, len(ranges), ranks), key=ready.__getitem__):
            reduced = max(reduced, ready[k]) + work[k]
        finish[rank] = max(finish[rank], reduced)
    for group in set(ring_classes) - {-1}:
        jobs = [k for k in range(len(ranges)) if ring_classes[k % ranks] == group]
        for k, done in zip(jobs, processor_shared_finish_s([ready[k] for k in jobs], [work[k] for k in jobs])):
            finish[k % ranks] = max(finish[k % ranks], done)
    return [done + update for done, update in zip(finish, optimizer)]


def processor_shared_finish_s(starts: list[float], works: list[float]) -> list[float]:
    """When each job ends on one server shared equally by the jobs present (processor sharing,
    Kleinrock, Queueing Systems vol. 2, 1976, ch. 4): job i arrives at starts[i] needing works[i]
    seconds alone; while n are present each progresses at 1/n."""
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    finish, left, now, arriving = [0.0] * len(starts), {}, 0.0, 0
    while arriving < len(order) or left:
        if not left:
            now = max(now, starts[order[arriving]])
        while arriving < len(order) and starts[order[arriving]] <= now:
            left[order[arriving]] = works[order[arriving]]
            arriving += 1
        first = min(left, key=left.get)
        done_at = now + left[first] * len(left)
        until = min(done_at, starts[order[arriving]]) if arriving < len(order) else done_at
        progress = (until - now) / len(left)
        now = until
        for job in list(left):
            left[job] -= progress
            if job == first and until == done_at or left[job] <= 1e-15 * max(1.0, now):
                finish[job] = now
                del left[job]
    return finish


def _ring_classes(topology: Topology, rank_to_device, num_chunks: int, ranks: int) -> list[int]:
    """Per rank, a class of the ranks whose stage rings leave a node they share (their allreduces
    share its NICs: `_closings_s`), joined transitively; -1 where its ring stays in a node
    or there is none."""
    groups = len(rank_to_device) // num_chunks
    nodes = [{topology.node_of(rank_to_device[g * num_chunks + r]) for g in range(groups)} for r in range(ranks)]
    return joined_classes([members if len(members) > 1 else None for members in nodes])


def _layer_bytes(workload: Workload, config, batch: float) -> tuple[np.ndarray, float]:
    """Per layer, the bytes a device holds for it through the step: weights, gradients, optimizer
    state, an fp32 master copy under mixed precision, and the activations it saves for its backward
    for the group's batch, as the memory model counts them (`memory_activations.saved_bytes`, no
    recompute; the loss keeps its logits and their log-softmax); and the largest backward's working set besides them: a layer's output gradient, its
    input gradient and one more output map (`simulator.memory`: a residual's shortcut gradient, the
    loss's NLL gradient)."""
    from simulator.heuristics import state_bytes_per_param
    from simulator.memory_activations import Sharding, saved_bytes
    element, per_param = dtype_bytes(config.dtype), state_bytes_per_param(config.dtype, config.optimizer)
    held = np.array([layer.num_params * per_param + saved_bytes(layer, element, Sharding()) * batch
                     for layer in workload.layers], dtype=float)
    held[-1] += 2 * workload.layers[-1].output_elements_per_sample * batch * element  # the loss's logits, log-softmax
    working = max((2 * layer.output_elements_per_sample + layer.input_elements_per_sample) * batch * element
                  for layer in workload.layers)
    return held, working


def _stage_update(config, workload: Workload, topology: Topology, costs: CostModel, rank_to_device,
                  batch: float) -> StageUpdate | None:
    """The partition's view of what closes each stage's step (`stage_costs.StageUpdate`): the
    allreduce among its G replicas, as the engine's collective model decomposes it (algorithm from
    `strategy.collective`, each phase at its bottleneck link: `link_floors.isolated_time_s`; its
    latencies the constant, the rest a rate per byte) with that rate divided among the stage rings
    leaving a node (`heuristics.rings_leaving`), and the optimizer step of its layers; once a step of
    m = B / (G b) micro-batches, or after each micro-batch for the asynchronous kinds (as
    `strategy.partition: pipedream` prices it). None for megatron's chains (their rings:
    `strategies.chain_reduction`)."""
    from simulator.collectives import choose_algorithm, collective_phases
    from simulator.heuristics import rings_leaving
    from simulator.link_floors import isolated_time_s
    groups, num_stages = config.num_groups, config.workers_per_group
    if config.strategy == "megatron" or len(rank_to_device) != groups * num_stages:
        return None
    per_byte_s, constant_s, shared_by = np.zeros(num_stages), np.zeros(num_stages), np.ones(num_stages)
    probe_bytes = float(2**30)
    leaving = rings_leaving(topology, rank_to_device, num_stages)
    for stage in range(num_stages if groups > 1 else 0):
        peers = tuple(rank_to_device[g * num_stages + stage] for g in range(groups))
        phases = collective_phases(topology, (peers,), "allreduce", probe_bytes,
                                   choose_algorithm(topology, peers, config.collective), config.num_parameter_servers)
        constant_s[stage] = sum(phase.latency_s for phase in phases)
        nodes = {topology.node_of(device) for device in peers}
        shared_by[stage] = max(max(leaving[node] for node in nodes) if len(nodes) > 1 else 1, 1)
        per_byte_s[stage] = shared_by[stage] * (isolated_time_s(topology, phases) - constant_s[stage]) / probe_bytes
    layers = workload.layers
    gradient_bytes = np.array([layer.num_params for layer in layers], dtype=float) * dtype_bytes(config.dtype)
    backward = stage_compute_s(costs, topology, rank_to_device, groups, num_stages, len(layers), batch, (BACKWARD,))
    optimizer = np.array([costs.optimizer_s(layer.num_params, (i, i + 1)) for i, layer in enumerate(layers)])
    share = 1.0 if config.strategy in ASYNCHRONOUS_KINDS else groups * batch / config.global_batch_size
    return StageUpdate(per_byte_s, constant_s, gradient_bytes, backward, optimizer, share, config.overlap_backward,
                       shared_by=shared_by)


def _boundary_time_s(topology: Topology, rank_to_device, num_stages: int, stage: int, neighbour: int,
                     size_bytes: np.ndarray) -> np.ndarray:
    """Seconds for stage `stage` to send `size_bytes` to stage `neighbour` (Hockney's alpha-beta,
    `collective_forms.p2p_time_s`) on the slowest replica's route, each link's rate shared by the
    replicas whose same transfer crosses it: lock-step replicas send at once."""
    hop = boundary_hop(topology, rank_to_device, num_stages, stage, neighbour)
    return np.zeros_like(size_bytes) if hop is None else p2p_time_s(size_bytes, *hop)


def boundary_hop(topology: Topology, rank_to_device, num_stages: int, stage: int,
                 neighbour: int) -> tuple[float, float] | None:
    """(latency, bandwidth) of `_boundary_time_s`'s transfer: the slowest replica's route latency and
    the least share of a link it crosses; None where the two stages share a device. Remembered per
    topology and device pairs (a search asks for the same hops for most of its layouts)."""
    replicas = len(rank_to_device) // num_stages
    pairs = tuple((rank_to_device[g * num_stages + stage], rank_to_device[g * num_stages + neighbour])
                  for g in range(replicas))
    known = _HOPS.setdefault(topology, {})
    if pairs not in known:
        known[pairs] = _hop(topology, pairs)
    return known[pairs]


_HOPS: WeakKeyDictionary = WeakKeyDictionary()
"""Topology -> {device pairs: `boundary_hop`}."""


def _hop(topology: Topology, pairs) -> tuple[float, float] | None:
    routes = [topology.route(source, target) for source, target in pairs]
    crossing = Counter(link for route in routes for link in route)
    hops = [(topology.route_latency_s(*pair), min(topology.links[i].bandwidth_bytes_per_s / crossing[i] for i in route))
            for pair, route in zip(pairs, routes) if route]
    return (max(latency for latency, _ in hops), min(bandwidth for _, bandwidth in hops)) if hops else None
