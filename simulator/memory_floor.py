"""A floor under a candidate layout's peak memory per device, cheap (no plan, no engine).

The persistent state of each rank (weights, fp32 master weights, optimizer state, weight gradients
in the bytes the plan keeps them, `simulator.strategies.zero.gradient_element_bytes`:
`simulator.memory`, with ZeRO's sharding as in the megatron summary,
`simulator.strategies.zero.shard_memory`: optimizer state and master weights / d from stage 1,
gradients / d from stage 2, weights / d at stage 3; hybrid sharding divides by fewer replicas, so /
d stays a floor) plus the most activations its schedule holds (`held_bytes`: 1F1B, min(m, p - k)
micro-batches at its first backward; GPipe, m; interleaved, walked over its order): each forward keeps each layer's kept bytes
(`simulator.memory_activations.kept_bytes`, the memory model's own rule, with the candidate's TP
degree, sequence parallelism and flash attention; full recompute: every layer's input for the
megatron kind, whose plans checkpoint each layer, else only each chunk's first input, a floor of the
per-segment checkpoints) until that layer's backward, and each held chunk's output sent to the next
stage (the sender keeps it until its backward). ZeRO-3 adds its smallest gathered unit (its
transients are timed in the memory walk, `simulator.strategies.zero.unit_transient_events`);
SHARD_GRAD_OP, whose gathered units are the whole weights until their backward, keeps its weights
unsharded here. With expert parallelism (ZeRO-1 only) the expert weights' states are sharded over
the d / e copies only, as `simulator.strategies.zero.state_divisor`. With context parallelism c a
rank holds the activations of b / c of each micro-batch (`simulator.strategies.context`) and ZeRO-1
shards over the d c ranks that reduce a gradient (`simulator.strategies.zero.shard_degree`). Under
full recompute the first backward re-runs its chunk's forward: the chunk's last layer then holds its
whole saved activations for one micro-batch (`simulator.memory_activations.saved_bytes`) where the
checkpoint stood (the least such chunk of the rank counts). Asynchronous pipelines add the extra
weight copies each stage keeps for the whole step, as `simulator.memory_buffers.persistent` counts
them: PipeDream's stashed versions (with weight stashing) and SpecTrain's predicted copy
(`simulator.schedules.analysis.stage_metrics`). A rank whose floor exceeds the device memory cannot
fit; the exact figure is the memory model's (`simulator.layout_search.exact_peak_memory_bytes`).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate

from simulator.memory import MASTER_WEIGHT_DTYPES, OPTIMIZER_STATE_COPIES
from simulator.memory_activations import Sharding, kept_bytes, saved_bytes
from simulator.schedules import build_schedule
from simulator.schedules.analysis import stage_metrics
from simulator.schedules.ir import ASYNCHRONOUS_KINDS
from simulator.strategies.zero import gradient_element_bytes

MEGATRON = "megatron"


def memory_floor_bytes(model, c) -> float:
    """Largest per-rank floor (module docstring) over candidate `c`'s ranks; `model` is the
    scenario's `simulator.step_bound.BoundModel` (geometry, recompute, ZeRO stage of `c`)."""
    geo, e = model.geometry(c), model.element
    training, p, v = model.scenario.training, c.workers_per_group, c.num_virtual_stages
    b, rc = model.microbatch_size(c), model.recompute(c)
    layers = geo.workload.layers
    t = c.tp_degree if c.kind == MEGATRON else 1
    sharding = Sharding(t, t > 1 and model.sp(c), model.scenario.costs.flash_attention)
    per_layer = c.kind == MEGATRON  # its plans checkpoint every layer's input under full recompute
    sums = _layer_sums(model, geo.workload, rc, e, sharding, per_layer)
    per_chunk, remat = [], []
    last = len(layers) - 1
    for start, end in geo.ranges:
        checkpoint = end - 1 if per_layer else start  # the input the first rematerialised layer replaces
        remat.append(0.0 if rc != "full" or training.offload_activations else
                     max(0.0, sums.saved(end - 1) - layers[checkpoint].input_elements_per_sample * e) * b)
        sent = (layers[end - 1].output_elements_per_sample * e  # kept by the sender until its backward
                if end - 1 != last and training.memory_policy == "none" else 0.0)
        per_chunk.append(0.0 if training.offload_activations else (sums.chunk_kept(start, end) + sent) * b)
    master = 4 if training.dtype in MASTER_WEIGHT_DTYPES else 0
    state = (master + 4 * OPTIMIZER_STATE_COPIES[training.optimizer])
    d = model.dp_ranks(c)  # ZeRO shards over the d c ranks of a stage (context parallelism: x c)
    stage = model.zero(c) if c.kind == MEGATRON and d > 1 else 0
    grads = 0 if training.memory_policy == "laysa" else (
        gradient_element_bytes(training.dtype, model.zero(c), model.scenario.strategy.fsdp_reduce_dtype)
        if c.kind == MEGATRON else e)
    weights = e
    state, grads, weights = state / (d if stage >= 1 else 1), grads / (d if stage >= 2 else 1), \
        weights / (d if stage == 3 else 1)
    copies = weight_copies(c.kind, p, c.num_microbatches, model.scenario.strategy.weight_stashing) \
        if c.kind in ASYNCHRONOUS_KINDS else (0,) * p
    worst = 0.0
    for k in range(p):
        own = [geo.ranges[j] for j in range(k, p * v, p)]
        params = sum(sums.params(a, z) for a, z in own)
        held = held_bytes(c, k, per_chunk) + min(remat[j] for j in range(k, p * v, p))
        experts = model.experts(c, own) / e if stage >= 1 else 0.0  # expert states over d / e copies
        worst = max(worst, params * (weights + grads + state + copies[k] * e) + experts * state * (model.ep(c) - 1)
                    + held + _sharding_transients(model, c, stage, sums, own))
    return worst


def _sharding_transients(model, c, stage: int, sums, own) -> float:
    """ZeRO-3's per-unit transients of rank k's units, timed in the walk
    (`simulator.strategies.zero.unit_transient_events`): its smallest gathered unit, which the unit
    computing at the activation peak holds at least; none under hybrid sharding (whose shard group
    may be one rank). SHARD_GRAD_OP's gathered units are the whole weights, counted unsharded here."""
    strategy = model.scenario.strategy
    if stage != 3 or strategy.fsdp_sharding == "hybrid_shard":
        return 0.0
    units = [count for a, z in own for count in (sums.params(i, i + 1) for i in range(a, z)) if count > 0]
    return model.element * min(units, default=0)


class _LayerSums:
    """Prefix sums over the layers of what a chunk keeps per sample (the first layer of a chunk
    keeps its checkpoint under full recompute) and of parameters: a chunk's figures in O(1)."""

    def __init__(self, layers, rc: str, e: int, sharding: Sharding, per_layer: bool = False):
        self.layers, self.e, self.sharding = layers, e, sharding
        last = len(layers) - 1
        self.plain, self.first = [], []
        for index, layer in enumerate(layers):
            extra = 2 * layer.output_elements_per_sample * e if index == last else 0.0
            self.plain.append(kept_bytes(layer, rc, e, sharding, checkpoint=per_layer) + extra)
            self.first.append(kept_bytes(layer, rc, e, sharding, checkpoint=True) + extra)
        self.kept_prefix = list(accumulate(self.plain, initial=0.0))
        self.params_prefix = list(accumulate((layer.num_params for layer in layers), initial=0))
        self._saved: dict[int, float] = {}

    def chunk_kept(self, start: int, end: int) -> float:
        return self.kept_prefix[end] - self.kept_prefix[start] - self.plain[start] + self.first[start]

    def params(self, start: int, end: int) -> int:
        return self.params_prefix[end] - self.params_prefix[start]

    def saved(self, index: int) -> float:
        if index not in self._saved:
            self._saved[index] = saved_bytes(self.layers[index], self.e, self.sharding)
        return self._saved[index]


def _layer_sums(model, workload, rc: str, e: int, sharding: Sharding, per_layer: bool) -> _LayerSums:
    """The model's `_LayerSums` for one recompute mode, sharding and checkpoint rule (built once
    per search)."""
    cache = model.floor_layer_sums
    key = (id(workload), rc, e, sharding, per_layer)
    if key not in cache:
        cache[key] = _LayerSums(workload.layers, rc, e, sharding, per_layer)
    return cache[key]


@lru_cache(maxsize=256)
def weight_copies(kind: str, num_stages: int, num_microbatches: int, weight_stashing: bool) -> tuple[int, ...]:
    """Per stage, the weight copies an asynchronous schedule keeps besides the weights: stashed
    versions (PipeDream with stashing) + SpecTrain's predicted copy (module docstring)."""
    metrics = stage_metrics(build_schedule(kind, num_stages, num_microbatches),
                            kind == "pipedream" and weight_stashing)
    return tuple(a + b for a, b in zip(metrics["stashed_weight_versions"], metrics["extra_weight_copies"]))


def held_bytes(c, k: int, per_chunk: list[float]) -> float:
    """The most bytes of saved activations rank k holds over its order, per_chunk[j] a micro-batch
    of chunk j (`simulator.schedules.build`): one batch for dp / mp / ghp; with one chunk a rank,
    what it holds when its first backward starts (GPipe: m micro-batches; 1F1B: min(m, p - k));
    interleaved, the micro-batches of each of its chunks in flight after each of its forwards
    (`chunk_counts`): its chunks can differ in size, so a steady step that runs a larger chunk's
    forward and frees a smaller one's can raise the peak past the first backward."""
    p, v, m = c.workers_per_group, c.num_virtual_stages, c.num_microbatches
    if c.kind in ("dp", "mp", "ghp"):
        return per_chunk[k]
    if c.kind == "gpipe":
        return m * per_chunk[k]
    if v == 1:
        return min(m, p - k) * per_chunk[k]
    return max(sum(count * per_chunk[j * p + k] for j, count in enumerate(counts))
               for counts in chunk_counts(p, m if m < 3 * p else 3 * p + (m - 3 * p) % p, v)[k])


@lru_cache(maxsize=256)
def chunk_counts(p: int, m: int, v: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per rank k of an interleaved 1F1B schedule: after each of its forwards, the micro-batches of
    each of its v chunks whose backward has not run, keeping the counts no other count exceeds in
    every chunk (with bytes >= 0 only those can hold the most). From m = 3p on, each further round
    of p micro-batches replays the steady state: the counts are those of m = 3p (+ m mod p), which
    `held_bytes` plays instead of a long step."""
    found = []
    for ops in build_schedule("interleaved_1f1b", p, m, v).ranks:
        counts, seen = [0] * v, set()
        for op in ops:
            if op.phase in ("F", "B"):
                counts[op.chunk // p] += 1 if op.phase == "F" else -1
                if op.phase == "F":
                    seen.add(tuple(counts))
        found.append(tuple(counts for counts in seen
                           if not any(other != counts and all(a >= b for a, b in zip(other, counts)) for other in seen)))
    return tuple(found)
