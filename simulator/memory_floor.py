"""A floor under a candidate layout's peak memory per device, cheap (no plan, no engine).

The persistent state of each rank (weights, fp32 master weights, optimizer state, weight gradients
in the bytes the plan keeps them, `simulator.zero_config.gradient_element_bytes`:
`simulator.memory`, with ZeRO's sharding as in the megatron summary,
`simulator.strategies.zero.shard_memory`: optimizer state and master weights / d from stage 1,
gradients / d from stage 2, weights / d at stage 3; hybrid sharding divides by fewer replicas, so /
d stays a floor) plus the most activations its schedule holds (`held_bytes`: 1F1B, min(m, p - k)
micro-batches at its first backward; GPipe, m; interleaved, walked over its order): each forward
keeps each layer's kept bytes (`simulator.memory_activations.kept_bytes`, the memory model's own
rule, with the candidate's TP
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
With one chunk a rank (no TP, memory_policy none), the rank may hold more while its first
micro-batch's backward walks its layers: the other micro-batches, and of that one the layers not yet
done, the input maps and gradients of those done, and the workspace (`SplitMemory._backward_peaks`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import accumulate

from simulator.memory import MASTER_WEIGHT_DTYPES, OPTIMIZER_STATE_COPIES
from simulator.memory_activations import Sharding, kept_bytes, saved_bytes
from simulator.partition import least_max_chain, searched_partition
from simulator.schedules import build_schedule
from simulator.schedules.analysis import stage_metrics
from simulator.schedules.ir import ASYNCHRONOUS_KINDS
from simulator.zero_config import gradient_element_bytes, reduce_dtype_of
from simulator.workload import dtype_bytes

MEGATRON = "megatron"


def memory_floor_bytes(model, c) -> float:
    """Largest per-rank floor (module docstring) over candidate `c`'s ranks; `model` is the
    scenario's `simulator.step_bound.BoundModel` (geometry, recompute, ZeRO stage of `c`). Where the
    layers of a synchronous kind (asynchronous floors add weight copies by rank) are split by the
    balanced partition and no split can fit (`SplitMemory.least_fullest_bytes` over the capacity),
    that figure, a floor under every split's, without partitioning."""
    chunks = c.workers_per_group * c.num_virtual_stages
    if searched_partition(model.scenario.strategy.partition, chunks) == "balanced" and c.kind not in ASYNCHRONOUS_KINDS:
        split = candidate_split_memory(model, c, model.rank_model(c)[0])
        if split.least_fullest_bytes() > split.capacity_bytes:
            return split.least_fullest_bytes()
    geo, e, p, v = model.geometry(c), model.element, c.workers_per_group, c.num_virtual_stages
    split = candidate_split_memory(model, c, geo.workload)
    copies = weight_copies(c.kind, p, c.num_microbatches, model.scenario.strategy.weight_stashing) \
        if c.kind in ASYNCHRONOUS_KINDS else (0,) * p
    worst = 0.0
    for k, core in enumerate(split.rank_bytes(geo.ranges)):
        own = [geo.ranges[j] for j in range(k, p * v, p)]
        params = sum(split.sums.params(a, z) for a, z in own)
        experts = model.experts(c, own) / e if split.zero_stage >= 1 else 0.0  # expert states over d / e copies
        worst = max(worst, core + params * copies[k] * e + experts * split.state_bytes * (model.ep(c) - 1)
                    + _sharding_transients(model, c, split.zero_stage, split.sums, own))
    return worst


def fp8_training(scenario) -> bool:
    """Whether the linear layers' saved inputs are FP8 (`training.fp8_recipe`, `Sharding.fp8`)."""
    return scenario.training.fp8_recipe is not None


def candidate_split_memory(model, c, workload) -> SplitMemory:
    """`SplitMemory` of candidate `c` of a `simulator.step_bound.BoundModel` on `workload` (its rank's),
    remembered in `model._cache` for the geometry's partition and the floor alike."""
    t = c.tp_degree if c.kind == MEGATRON else 1
    scenario = model.scenario
    sharding = Sharding(t, t > 1 and model.sp(c), scenario.costs.flash_attention, fp8_training(scenario))
    shape = PipelineShape(c.kind, c.workers_per_group, c.num_virtual_stages, c.num_microbatches)
    key = ("split memory", id(workload), shape, model.microbatch_size(c), model.recompute(c), sharding,
           model.dp_ranks(c), model.zero(c))
    if key not in model._cache:
        model._cache[key] = split_memory(workload, shape, scenario, microbatch=key[3], recompute=key[4],
                                         sharding=sharding, dp_ranks=key[6], zero_stage=key[7],
                                         sums_cache=model.floor_layer_sums)
    return model._cache[key]


def tensor_split_memory(scenario, config, workload) -> SplitMemory:
    """`SplitMemory` of a megatron plan (`strategies.tensor.TensorConfig`) on its TP rank's `workload`."""
    sharding = Sharding(config.tp, config.tp > 1 and config.sequence_parallel, scenario.costs.flash_attention,
                        fp8_training(scenario))
    shape = PipelineShape(MEGATRON, config.pp, config.num_virtual_stages, config.num_microbatches)
    return split_memory(workload, shape, scenario, microbatch=config.microbatch_size, recompute=config.recompute,
                        sharding=sharding, dp_ranks=config.dp, zero_stage=config.zero_stage)


def pipeline_split_memory(scenario, config, workload) -> SplitMemory:
    """`SplitMemory` of a pipeline kind's plan (`strategies.pipeline.PipelineConfig`): no TP, no ZeRO."""
    shape = PipelineShape(config.kind, config.num_stages, config.num_virtual_stages, config.num_microbatches)
    return split_memory(workload, shape, scenario, microbatch=config.microbatch_size,
                        recompute=scenario.training.recompute,
                        sharding=Sharding(1, False, scenario.costs.flash_attention, fp8_training(scenario)),
                        dp_ranks=config.num_groups, zero_stage=scenario.strategy.zero_stage)


@dataclass(frozen=True)
class PipelineShape:
    """What `held_bytes` reads of a layout (a `planner.Candidate` has the same fields)."""

    kind: str
    workers_per_group: int
    num_virtual_stages: int
    num_microbatches: int


def split_memory(workload, shape: PipelineShape, scenario, *, microbatch: float, recompute: str, sharding: Sharding,
                 dp_ranks: int, zero_stage: int, sums_cache: dict | None = None) -> SplitMemory:
    """The floor's per-split part for a layout of `scenario` (module docstring): state bytes a
    parameter (ZeRO-sharded over the `dp_ranks` reducing a gradient, megatron only) and each layer's
    kept bytes; megatron's plans checkpoint every layer's input under full recompute."""
    from simulator.memory_buffers import usable_memory_bytes
    training, e = scenario.training, dtype_bytes(scenario.training.dtype)
    megatron = shape.kind == MEGATRON
    key = (id(workload), recompute, e, sharding, megatron)
    cache = {} if sums_cache is None else sums_cache
    if key not in cache:
        cache[key] = _LayerSums(workload.layers, recompute, e, sharding, megatron)
    stage = zero_stage if megatron and dp_ranks > 1 else 0
    state = (4 if training.dtype in MASTER_WEIGHT_DTYPES else 0) + 4 * OPTIMIZER_STATE_COPIES[training.optimizer]
    grads = 0 if training.memory_policy == "laysa" else (
        gradient_element_bytes(training.dtype, zero_stage, reduce_dtype_of(scenario.strategy)) if megatron else e)
    state, grads, weights = state / (dp_ranks if stage >= 1 else 1), grads / (dp_ranks if stage >= 2 else 1), \
        e / (dp_ranks if stage == 3 else 1)
    return SplitMemory(shape, workload.layers, cache[key], microbatch, recompute, training.offload_activations,
                       training.memory_policy == "none", e, weights + grads + state, state, stage,
                       usable_memory_bytes(scenario))


@dataclass(frozen=True)
class SplitMemory:
    """What a layer split changes in the floor: per rank, its layers' parameters at `param_bytes`
    each (weights, gradients, optimizer state, sharded), the activations its schedule holds
    (`held_bytes`, each chunk's kept bytes a micro-batch plus the output it sends) and the least
    rematerialisation of its chunks under full recompute. The flushed partition keeps to splits
    under `capacity_bytes` where its first choice is over (`strategies.stage_partition`)."""

    shape: PipelineShape
    layers: tuple
    sums: _LayerSums
    microbatch: float
    recompute: str
    offload: bool
    keeps_sent: bool
    element: int
    param_bytes: float
    state_bytes: float
    zero_stage: int
    capacity_bytes: float

    def rank_bytes(self, ranges) -> list[float]:
        chunk, remat, backward = self._range_terms
        p, sums = self.shape.workers_per_group, self.sums
        per_chunk = [float(chunk[a, z - 1]) for a, z in ranges]
        found = []
        for k in range(p):
            held = held_bytes(self.shape, k, per_chunk)
            core = held + min(float(remat[a, z - 1]) for a, z in ranges[k::p])
            if backward is not None and self.shape.num_virtual_stages == 1:
                (a, z), = ranges[k::p]
                core = max(core, held - per_chunk[k] + float(backward[a, z - 1]))
            found.append(sum(sums.params(a, z) for a, z in ranges[k::p]) * self.param_bytes + core)
        return found

    @cached_property
    def _range_terms(self):
        """(L, L) arrays over layer ranges [start, end] (inclusive) of one micro-batch of a chunk: its
        kept bytes and the output it sends; the rematerialisation of its backward under full recompute
        (megatron's plans checkpoint every layer's input, the others the chunk's first); and what it
        holds while its backward walks its layers (`_backward_peaks`; None where not counted)."""
        import numpy as np
        layers, e, b, sums, count = self.layers, self.element, self.microbatch, self.sums, len(self.layers)
        starts, ends = np.arange(count)[:, None], np.arange(count)[None, :]
        kept, first, plain = np.array(sums.kept_prefix), np.array(sums.first), np.array(sums.plain)
        sent = np.array([layer.output_elements_per_sample * e if i != count - 1 and self.keeps_sent else 0.0
                         for i, layer in enumerate(layers)])
        chunk = np.zeros((count, count)) if self.offload else \
            (kept[ends + 1] - kept[starts] - plain[starts] + first[starts] + sent[ends]) * b
        remat = np.zeros((count, count))
        if self.recompute == "full" and not self.offload:
            saved = np.array([sums.saved(i) for i in range(count)])
            inputs = np.array([layer.input_elements_per_sample * e for layer in layers])
            replaced = inputs[ends] if self.shape.kind == MEGATRON else inputs[starts]  # the checkpoint's input
            remat = np.broadcast_to(np.maximum(0.0, saved[ends] - replaced) * b, (count, count))
        backward = None
        if self._backward_peaks is not None:
            peaks, after, received = self._backward_peaks
            largest = np.maximum.accumulate(np.where(ends >= starts, peaks[ends], -np.inf), axis=1)
            backward = largest + after[ends + 1] + received[ends] - (kept[starts] + plain[starts] - first[starts]) * b
        return chunk, remat, backward

    @cached_property
    def _backward_peaks(self):
        """What one micro-batch of a chunk [a, e] holds when the backward of its layer j starts, as
        peaks[j] + after[e + 1] + received[e] less the chunk's kept bytes before a (`_range_terms`):
        the kept bytes of layers a..j; of each later layer its input gradient and its input map (at
        most its kept bytes), which the memory model keeps until the micro-batch's backward on the
        rank ends; j's input gradient, the output gradient received from the next stage, and j's
        workspace (its output map and its weights: `simulator.memory`, memory_policy none). None
        where the walk keeps other maps (reuse, offload) or TP shards them."""
        import numpy as np
        if not self.keeps_sent or self.offload or self.sums.sharding.tp_degree > 1:
            return None
        e, b, kept, layers = self.element, self.microbatch, self.sums.kept_prefix, self.layers
        after = np.concatenate(([0.0], np.cumsum([((layer.input_elements_per_sample if j else 0) * e
                                                   + min(layer.input_elements_per_sample * e, plain)) * b
                                                  for j, (layer, plain) in enumerate(zip(layers, self.sums.plain))])))
        peaks = np.array([kept[j + 1] * b - after[j + 1] + (layer.input_elements_per_sample if j else 0) * e * b
                          + layer.output_elements_per_sample * e * b + layer.num_params * e
                          for j, layer in enumerate(layers)])
        received = np.array([layer.output_elements_per_sample * e * b if j != len(layers) - 1 else 0.0
                             for j, layer in enumerate(layers)])
        return peaks, after, received

    def least_bytes(self) -> float:
        """Under what any split's fullest rank holds: the mean over the p ranks of every parameter's
        state and one micro-batch of every layer's kept bytes (each rank holds at least one of each
        of its chunks when its first backward starts)."""
        sums, count = self.sums, len(self.layers)
        kept = 0.0 if self.offload else sum(min(plain, first) for plain, first in zip(sums.plain, sums.first))
        return (sums.params(0, count) * self.param_bytes + kept * self.microbatch) / self.shape.workers_per_group

    def stage_fits(self) -> list | None:
        """With one chunk a rank, per rank k the (L, L) mask of layer ranges [start, end] (inclusive)
        it can hold under the capacity: every split of fitting ranges fits. None with interleaved
        chunks, whose ranks add several ranges."""
        import numpy as np
        ranges = self._one_range_bytes
        return None if ranges is None else [np.isfinite(held) & (held <= self.capacity_bytes) for held in ranges]

    @cached_property
    def _one_range_bytes(self) -> list | None:
        """With one chunk a rank, per rank k the (L, L) array of `rank_bytes` of each layer range
        [start, end] (inclusive), vectorised; inf where start > end. None with interleaved chunks."""
        import numpy as np
        if self.shape.num_virtual_stages > 1:
            return None
        chunk, remat, backward = self._range_terms
        count = len(self.layers)
        starts, ends = np.arange(count)[:, None], np.arange(count)[None, :]
        params = np.array(self.sums.params_prefix, dtype=float)
        state = (params[ends + 1] - params[starts]) * self.param_bytes
        found = []
        for k in range(self.shape.workers_per_group):
            held = held_microbatches(self.shape, k)
            most = held * chunk + remat if backward is None else \
                np.maximum(held * chunk + remat, (held - 1) * chunk + backward)
            found.append(np.where(starts <= ends, state + most, np.inf))
        return found

    @cached_property
    def _least_fullest_bytes(self) -> float:
        ranges = self._one_range_bytes
        return self.least_bytes() if ranges is None else least_max_chain(ranges)

    def least_fullest_bytes(self) -> float:
        """Under what the fullest rank of any split holds: with one chunk a rank, the least over splits
        of the fullest rank's `rank_bytes` (the min-max chain of `_one_range_bytes`), else `least_bytes`."""
        return self._least_fullest_bytes

    def excess_bytes(self, ranges) -> float:
        """How far its fullest rank is over the capacity (0 where every rank fits)."""
        return max(0.0, max(self.rank_bytes(ranges)) - self.capacity_bytes)


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
    if v == 1:
        return held_microbatches(c, k) * per_chunk[k]
    return max(sum(count * per_chunk[j * p + k] for j, count in enumerate(counts))
               for counts in chunk_counts(p, m if m < 3 * p else 3 * p + (m - 3 * p) % p, v)[k])


def held_microbatches(c, k: int) -> int:
    """With one chunk a rank, the micro-batches rank k holds when its first backward starts: one
    batch for dp / mp / ghp, GPipe m, 1F1B (and the asynchronous kinds) min(m, p - k)."""
    if c.kind in ("dp", "mp", "ghp"):
        return 1
    return c.num_microbatches if c.kind == "gpipe" else min(c.num_microbatches, c.workers_per_group - k)


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
                           if not any(other != counts and all(a >= b for a, b in zip(other, counts))
                                      for other in seen)))
    return tuple(found)
