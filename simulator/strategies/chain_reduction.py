"""What a megatron chain's stage partition weighs besides compute. Between stages, each TP rank
sends its 1 / t of a boundary on its own route (`ChainReduction.tp_chains`). What closes a stage's
step: each of its t TP ranks reduces its gradients among its d c copies (Megatron's DDP: an
allreduce, or with ZeRO-1 a reduce-scatter, in buckets during the chunk's last backward), then the
optimizer step of its layers (ZeRO-1: its 1 / (d c) shard, then an allgather of the updated shard;
Rajbhandari et al., "ZeRO", SC'20, sec. 5.1). The t rings of a stage run at once and share
whatever links they cross (`collectives.collective_phases` of all of them, each phase at its
bottleneck: `link_floors.isolated_time_s`); the rings of other stages that cross one of the same
links share it while their reductions overlap (`stage_partition._closings_s`). Expert parallelism
(e): each expert weight's gradient is reduced among the d c / e copies holding that expert, the e
such rings of each TP rank at once (`experts.expert_gradients`), none where d c = e, and ZeRO-1
updates 1 / (d c / e) of the expert weights, then allgathers them among those copies."""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np

PROBE_BYTES = float(2**30)
"""The buffer a ring's time is taken at: its rate per byte is the slope above its latencies."""


@dataclass(frozen=True)
class ChainReduction:
    """The data-parallel rings of a megatron layout, per pipeline stage (`chain_reduction`)."""

    rings: tuple[tuple[tuple[int, ...], ...], ...]
    """Per pipeline stage j, its t rings (one per TP rank) of the d c devices that reduce a gradient."""
    reduce_op: str
    """"allreduce", or "reduce_scatter" under ZeRO-1 (`zero_config.gradient_reduce_op`)."""
    gradient_element_bytes: int
    """Bytes of a gradient as the reduction moves it (`zero_config.gradient_element_bytes`)."""
    gathered_element_bytes: int
    """ZeRO-1: bytes of a parameter its updated shard is allgathered in; 0 without ZeRO."""
    collective: str = "auto"
    ep: int = 1
    """Expert-parallel degree: the d c copies of an expert weight are every e-th of a ring."""

    @property
    def reduces(self) -> bool:
        """Whether there are copies to reduce among (d c > 1)."""
        return len(self.rings[0][0]) > 1

    def tp_chains(self, num_chunks: int) -> tuple[int, ...]:
        """Replica 0's device of each of `num_chunks` chunks (chunk k on stage k mod p), TP rank 0's
        chain first, then TP rank 1's, ...: the t chains that each send 1 / t of a boundary
        (Megatron's scatter-gather of the activations between stages, Narayanan et al., SC'21, sec. 4.1)."""
        p = len(self.rings)
        return tuple(self.rings[k % p][i][0] for i in range(len(self.rings[0])) for k in range(num_chunks))


def chain_reduction(device_of, t: int, p: int, d: int, *, dtype: str, zero_stage: int, zero1_gradient_reduce: str,
                    collective: str, ep: int = 1) -> ChainReduction | None:
    """The rings of a layout whose `device_of(dp', pp, tp)` places its d c = `d` copies (one device
    each where d = 1: nothing to reduce, `reduces`); None where parameters are gathered per layer
    (ZeRO-2/3: no pipeline)."""
    from simulator.zero_config import gradient_element_bytes
    from simulator.workload import dtype_bytes
    if zero_stage >= 2:
        return None
    allreduce = zero_stage == 0 or zero1_gradient_reduce == "allreduce"
    rings = tuple(tuple(tuple(device_of(e, j, i) for e in range(d)) for i in range(t)) for j in range(p))
    return ChainReduction(rings, "allreduce" if allreduce else "reduce_scatter",
                          gradient_element_bytes(dtype, zero_stage), dtype_bytes(dtype) if zero_stage else 0,
                          collective, ep)


@dataclass(frozen=True)
class RingPrices:
    """What a chain's rings cost, per pipeline stage (`ring_prices`): all a partition needs of them."""

    constant_s: tuple[float, ...]
    """The latencies of a stage's reduction."""
    per_byte_s: tuple[float, ...]
    """Its seconds a gradient byte, its t rings at once, times `shared_by`."""
    shared_by: tuple[float, ...]
    """How much slower the stage's rings run beside those of the other stages of its class."""
    classes: tuple[int, ...]
    """Stages whose rings cross a common link share a class; -1: none does."""
    gather_per_byte_s: float
    """ZeRO-1: seconds a parameter byte of the updated shard's allgather, at the slowest stage; else 0."""
    gradient_element_bytes: int
    gathered_element_bytes: int
    copies: int
    expert_constant_s: tuple[float, ...] = ()
    """Expert parallelism with d c > e: the latencies of a stage's expert reduction; () without."""
    expert_per_byte_s: tuple[float, ...] = ()
    """Its seconds an expert gradient byte, the e t rings at once, times `shared_by`."""
    expert_gather_per_byte_s: float = 0.0
    ep: int = 1
    tp: int = 1


def ring_prices(reduction: ChainReduction, topology) -> RingPrices:
    """The `RingPrices` of a chain's rings on `topology` (remembered: the planner prices the same
    rings for many layouts, and chains priced alike share their partition)."""
    seen = _RING_TIMES.setdefault(topology, {})
    found = seen.get(reduction)
    if found is not None:
        return found
    p = len(reduction.rings)
    own = [_ring_time(topology, reduction, rings) for rings in reduction.rings]
    from simulator.stage_costs import joined_classes
    joined = joined_classes([set().union(*(dict(phase.usage) for phase in phases)) for _, _, phases in own])
    classes = [c if joined.count(c) > 1 else -1 for c in joined]  # a stage alone reduces its chunks in turn
    shared_by = []
    for j in range(p):
        together = [q for q in range(p) if classes[q] == classes[j]] if classes[j] != -1 else [j]
        shared_s = own[j][1] if len(together) == 1 else \
            _ring_time(topology, reduction, tuple(ring for q in together for ring in reduction.rings[q]))[1]
        shared_by.append(max(shared_s / own[j][1], 1.0) if own[j][1] > 0 else 1.0)
    gather_s = max(_ring_time(topology, reduction, rings, "allgather")[1] for rings in reduction.rings) \
        if reduction.gathered_element_bytes else 0.0

    def per_byte_s(priced) -> tuple[float, ...]:  # each stage's rate, its rings beside the others of its class
        return tuple(by * alone / PROBE_BYTES for by, (_, alone, _) in zip(shared_by, priced))

    experts = {}
    if reduction.ep > 1 and len(reduction.rings[0][0]) > reduction.ep:  # each expert's d c / e copies reduce it
        ep = reduction.ep
        expert_rings = [tuple(ring[k::ep] for ring in rings for k in range(ep)) for rings in reduction.rings]
        priced = [_ring_time(topology, reduction, rings) for rings in expert_rings]
        experts = dict(expert_constant_s=tuple(constant for constant, _, _ in priced),
                       expert_per_byte_s=per_byte_s(priced),
                       expert_gather_per_byte_s=max(_ring_time(topology, reduction, rings, "allgather")[1]
                                                    for rings in expert_rings) / PROBE_BYTES
                       if reduction.gathered_element_bytes else 0.0)
    found = seen[reduction] = RingPrices(
        tuple(constant for constant, _, _ in own), per_byte_s(own), tuple(shared_by), tuple(classes),
        gather_s / PROBE_BYTES, reduction.gradient_element_bytes, reduction.gathered_element_bytes,
        len(reduction.rings[0][0]), **experts, ep=reduction.ep, tp=len(reduction.rings[0]))
    return found


def chain_update(prices: RingPrices, workload, topology, costs, chunk_devices: tuple[int, ...], batch: float,
                 num_microbatches: int, overlapped: bool):
    """(`stage_costs.StageUpdate` of the chain's chunks, the ring class of each pipeline rank): chunk k
    reduces on stage k mod p's rings (`prices`), its gradient bytes those of the rank's shard of its
    layers; its optimizer step (ZeRO-1: on the shard, then the allgather) once a step of
    `num_microbatches`. Ranks of one class have rings that cross a common link
    (`stage_partition._closings_s` shares it while they overlap); -1: none."""
    from simulator.costs import BACKWARD
    from simulator.heterogeneity import stage_compute_s
    from simulator.stage_costs import StageUpdate
    p, num_chunks = len(prices.classes), len(chunk_devices)
    stage = np.arange(num_chunks) % p
    from simulator.strategies.experts import expert_params, is_moe
    layers = workload.layers
    params = np.array([layer.num_params for layer in layers], dtype=float)
    experts = np.array([expert_params(layer.spec) / (prices.tp * prices.ep) if prices.ep > 1 and is_moe(layer)
                        else 0.0 for layer in layers])  # the rank's share of each MoE layer's routed experts
    dense, expert_copies = params - experts, prices.copies // prices.ep
    sharded = prices.gathered_element_bytes > 0
    optimizer_s = np.array([costs.optimizer_s(n / prices.copies + x / expert_copies if sharded else n + x, (i, i + 1))
                            for i, (n, x) in enumerate(zip(dense, experts))])
    optimizer_s = optimizer_s + prices.gathered_element_bytes * (dense * prices.gather_per_byte_s
                                                                 + experts * prices.expert_gather_per_byte_s)
    backward_s = stage_compute_s(costs, topology, chunk_devices, 1, num_chunks, len(layers), batch, (BACKWARD,))
    reduced = experts if prices.expert_per_byte_s else None  # none where each expert has one copy (d c = e)
    update = StageUpdate(np.array(prices.per_byte_s)[stage], np.array(prices.constant_s)[stage],
                         dense * prices.gradient_element_bytes, backward_s, optimizer_s, 1.0 / num_microbatches,
                         overlapped, shared_by=np.array(prices.shared_by)[stage],
                         expert_bytes=None if reduced is None else reduced * prices.gradient_element_bytes,
                         expert_per_byte_s=None if reduced is None else np.array(prices.expert_per_byte_s)[stage],
                         expert_constant_s=None if reduced is None else np.array(prices.expert_constant_s)[stage])
    return update, list(prices.classes)


_RING_TIMES: WeakKeyDictionary = WeakKeyDictionary()
"""topology -> {(rings, op, collective): `_ring_time`, reduction: `ring_prices`}."""


def _ring_time(topology, reduction: ChainReduction, rings, op: str | None = None):
    """(latencies, seconds above them for `PROBE_BYTES`, phases) of `rings` reducing at once."""
    op = op or reduction.reduce_op
    seen = _RING_TIMES.setdefault(topology, {})
    key = (rings, op, reduction.collective)
    found = seen.get(key)
    if found is None:
        found = seen[key] = _priced_rings(topology, rings, op, reduction.collective)
    return found


def _priced_rings(topology, rings, op: str, collective: str):
    from simulator.collectives import choose_algorithm, collective_phases
    from simulator.link_floors import isolated_time_s
    if op == "allreduce":
        algorithm = choose_algorithm(topology, rings[0], collective)
        phases = collective_phases(topology, rings, op, PROBE_BYTES, algorithm)
    else:  # ring reduce-scatter of the buffer; allgather of each rank's 1/d of it
        size = PROBE_BYTES / len(rings[0]) if op == "allgather" else PROBE_BYTES
        phases = collective_phases(topology, rings, op, size, "ring")
    constant_s = sum(phase.latency_s for phase in phases)
    return constant_s, isolated_time_s(topology, phases) - constant_s, phases


def for_config(config) -> ChainReduction | None:
    """`chain_reduction` of a `strategies.tensor.TensorConfig`."""
    return chain_reduction(config.device_of, config.tp, config.pp, config.dp, dtype=config.dtype,
                           zero_stage=config.zero_stage, zero1_gradient_reduce=config.zero1_gradient_reduce,
                           collective=config.collective, ep=config.ep)
