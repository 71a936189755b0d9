"""Per-device memory over one training step, from the plan and the simulated span table.

Every buffer is an allocation event (time, bytes, category) on its rank; the memory in use is the
running sum, the peak its maximum (frees at an instant are applied before allocations). Nothing
depends on the strategy kind: the actions of the plan and the times of their spans decide
everything, so pipeline schedules get their memory from their own order of forwards/backwards.

Persistent for the whole step: weights, fp32 master weights, optimizer state, gradients, stashed
weight copies, the top-k residual (`simulator.memory_buffers`).
Per micro-batch (the batch of the action). A compute span is shared among its layers in proportion
to their FLOPs (forward in layer order, backward in reverse), so buffers appear and go layer by layer:
- activations: what each layer keeps under `training.recompute` (`simulator.memory_activations`:
  transformer blocks per Korthikanti et al. 2023 with the plan's `meta["tensor"]` TP degree and
  sequence parallelism, and `costs.flash_attention`) appears when its forward runs (the last layer
  adds the loss's logits and log-softmax, 2 x its output) and goes when its backward ends; under
  memory_policy none the layer's input feature map (min(input, kept)) stays until the rank's last
  backward of that micro-batch ends (no inter-layer release, as a framework without reuse and as
  the validator's runtime do); under reuse/laysa it goes too (Layrub/LaySA). Recomputed tensors
  come back by the plan's recompute forward or when the layer's (selective: its attention core,
  per-layer plans: the layer) or its segment's backward starts. The plan's order decides the
  rest: GPipe holds m micro-batches, 1F1B at most p - k on stage k.
- stage boundary, sender: the output of a layer whose output goes to the next stage stays after
  the send (the root of the stage's backward, kept by its final ReLU; the receiver's copy is the
  next layer's input, counted there): from its forward until its backward ends (reuse/laysa) or
  until the micro-batch's backward on the rank ends (none). Megatron's output deallocation is
  not modelled.
- gradient_maps (dL/dX): none: each layer's input gradient appears when its backward starts and
  stays until the micro-batch's backward on the rank ends (model layer 0 has none: the data needs
  no gradient), and so does the output gradient received from the next stage; reuse/laysa:
  written into the freed activation buffers, only the incoming output gradient of the segment is
  extra (transient). While a layer's backward runs, also: a residual layer (`RESIDUAL_KINDS`) the
  gradient at its add, held for the shortcut while the branch's backward runs, and the last layer
  the loss's NLL gradient of the log-probabilities, alive with dL/dlogits while log-softmax's
  backward runs (one output map each).
- offload_activations: a layer's activations leave for host memory when its forward ends and come
  back when its backward starts, over `host_bandwidth_bytes_per_s` (the scenario's
  `costs.host_bandwidth_bytes_per_s`, default PCIe 3.0 x16); the transfers out overlap the rank's
  forward compute, those in its backward compute, and what exceeds them is exposed
  (`offload_exposed_s`, added to the step time by the summary).
- workspace: while a layer computes, its output (F) or its output gradient plus its fresh weight
  gradient before accumulation into .grad (B): a documented stand-in for kernel scratch. On a
  device whose convolutions run in oneDNN's blocked layouts (`BLOCKED_CONV_LAYOUT_DEVICES`: x86
  CPUs; the primitive picks its own format, plain NCHW tensors are reordered in and out, oneDNN
  "Memory Format Propagation"), a conv layer's backward also holds blocked copies of dL/dY and
  dL/dX: + (input + output) elements. Measured alone (torch 2.13 CPU, 16-64 channels): dL/dX +
  2 maps + dW; channels below 16 are also padded to 16, which is not modelled.
- comm_buffers: a top-k allgather's buffer (the gathered p k values + indices) from the start of
  its span until the next optimizer update has consumed it. A dense allreduce needs none: the
  gradients are views into their flat bucket, which is reduced in place (PyTorch DDP's
  `gradient_as_bucket_view=True`, what the validator's runtime does).
memory_policy laysa also applies the mirror weight update: each layer's weight gradient is folded
into its residual right after that layer's backward, so only one layer's gradient buffer exists.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter

from simulator.hardware import LINKS
from simulator.memory_activations import Sharding, kept_bytes, saved_bytes, selective_recomputes_core
from simulator.memory_buffers import MASTER_WEIGHT_DTYPES, OPTIMIZER_STATE_COPIES, persistent, usable_memory_bytes
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan
from simulator.workload import Workload, dtype_bytes

__all__ = ["MASTER_WEIGHT_DTYPES", "OPTIMIZER_STATE_COPIES", "MemoryConfig", "memory_config", "memory_report", "rank_memory"]

CATEGORIES = ("weights", "master_weights", "optimizer_state", "weight_gradients", "residual",
              "stashed_weights", "activations", "gradient_maps", "comm_buffers", "workspace")
RESIDUAL_KINDS = ("basic_block", "bottleneck_block", "transformer_block")
"""`Layer.spec` kinds with a residual add inside the layer (simulator/zoo/README.md)."""
BLOCKED_CONV_LAYOUT_DEVICES = ("cpu",)
"""Devices whose convolutions run in oneDNN's blocked layouts (x86 CPUs under PyTorch)."""
HOST_LINK = "pcie3"


@dataclass(frozen=True)
class MemoryConfig:
    dtype: str = "fp32"
    optimizer: str = "sgd"
    memory_policy: str = "none"
    recompute: str = "none"
    offload_activations: bool = False
    capacity_bytes: float = math.inf
    host_bandwidth_bytes_per_s: float = LINKS[HOST_LINK].bandwidth_bytes_per_s
    blocked_conv_layout: bool = False
    """The device's convolution library computes in its own blocked layout (module docstring)."""
    flash_attention: bool = False
    """The attention core runs as flash attention (`costs.flash_attention`)."""
    fp8_recipe: str | None = None  # `training.fp8_recipe`: FP8 weight copies and saved linear inputs


def memory_config(scenario) -> MemoryConfig:
    training, host_bandwidth = scenario.training, scenario.costs.host_bandwidth_bytes_per_s
    return MemoryConfig(training.dtype, training.optimizer, training.memory_policy, training.recompute,
                        training.offload_activations, usable_memory_bytes(scenario),
                        blocked_conv_layout=scenario.cluster.gpu.name in BLOCKED_CONV_LAYOUT_DEVICES,
                        flash_attention=scenario.costs.flash_attention, fp8_recipe=training.fp8_recipe,
                        **({} if host_bandwidth is None else {"host_bandwidth_bytes_per_s": host_bandwidth}))


@dataclass
class RankMemory:
    rank: int
    events: list[tuple[float, float, str]]
    """(time_s, delta_bytes, category)."""
    offload_s: float = 0.0
    offload_exposed_s: float = 0.0

    def peak(self) -> tuple[float, dict[str, float]]:
        """Peak bytes in use and the bytes of each category at that instant."""
        events = sorted(self.events, key=lambda event: (event[0], event[1] > 0))
        best, best_index, total = -1.0, -1, 0.0
        for index, (time_s, delta, _category) in enumerate(events):
            total += delta
            if index + 1 < len(events) and events[index + 1][0] == time_s:
                continue
            if total > best:
                best, best_index = total, index
        at_best = dict.fromkeys(CATEGORIES, 0.0)
        for _time_s, delta, category in events[:best_index + 1]:
            at_best[category] += delta
        return max(best, 0.0), at_best


_forward_flops, _backward_flops = attrgetter("forward_flops_per_sample"), attrgetter("backward_flops_per_sample")


def _spans_by_rank(spans) -> dict[int, dict[str, list]]:
    """Compute and comm spans of each rank, in time order: {rank: {"compute": [...], "comm": [...]}}."""
    rows = spans.itertuples(index=False, name=None) if hasattr(spans, "itertuples") else spans
    table: dict[int, dict[str, list]] = defaultdict(lambda: {"compute": [], "comm": []})
    for rank, stream, _name, _kind, start, end, *_rest in rows:
        if stream in ("compute", "comm"):
            table[rank][stream].append((start, end))
    for streams in table.values():
        for stream in streams.values():
            stream.sort()
    return table


class _RankWalk:
    """Allocation events of one rank's actions (see the module docstring)."""

    def __init__(self, plan, workload, rank, config, compute_spans, comm_spans):
        self.plan, self.layers, self.rank, self.config = plan, workload.layers, rank, config
        self.element = dtype_bytes(config.dtype)
        self.events: list[tuple[float, float, str]] = []
        self.live = defaultdict(lambda: defaultdict(float))  # microbatch -> layer -> bytes on device
        self.host = {}                      # (microbatch, layer) -> activation bytes on host
        self.remat = set()
        self.per_layer = plan.meta.get("recompute_granularity") == "layer"
        tensor = plan.meta.get("tensor", {})
        self.sharding = Sharding(tensor.get("tp_degree", 1), tensor.get("sequence_parallel", False),
                                 config.flash_attention, config.fp8_recipe is not None)
        self.grad_maps = defaultdict(float)  # microbatch -> gradient-map bytes kept (policy none)
        self.transfers = []                 # (bytes, "out"|"in")
        self.phase_s = defaultdict(float)   # compute seconds of forwards ("F") and backwards ("B")
        self.boundary = defaultdict(float)  # microbatch -> input feature maps kept (policy none)
        self.compute_spans, self.comm_spans = compute_spans, comm_spans
        actions = plan.actions[rank]
        computes = [a for a in actions if isinstance(a, Compute)]
        if len(computes) != len(compute_spans):
            raise ValueError(f"rank {rank}: {len(computes)} compute actions but {len(compute_spans)} compute spans")
        self.recomputes = set(plan.meta.get("recompute_actions", {}).get(rank, ()))
        self.selections = set(plan.meta.get("selection_actions", {}).get(rank, ()))
        self.segments = defaultdict(list)
        for action in computes:
            if action.phase == BACKWARD:
                self.segments[action.microbatch].append((action.layer_start, action.layer_end))
        self.last_backward = {mb: segs[-1] for mb, segs in self.segments.items()}
        self.segment_starts = {mb: {start for start, _ in segs} for mb, segs in self.segments.items()}
        self._kept_cache: dict[tuple[int, bool], float] = {}
        self._saved_cache: dict[int, float] = {}
        self._weights_cache: dict[tuple, list] = {}
        self.last_layer = len(workload.layers) - 1
        stage = plan.stages[plan.grid_position(rank)[1]]
        ranges = getattr(stage, "chunks", ()) or ((stage.layer_start, stage.layer_end),)
        self.sent = {end - 1 for _, end in ranges if end - 1 != self.last_layer}  # output goes to the next stage
        self.held = defaultdict(float)      # (microbatch, layer) -> sent output kept until its backward (reuse)

    def add(self, time_s, delta, category):
        if delta:
            self.events.append((time_s, delta, category))

    def kept(self, microbatch: int, layer: int) -> float:
        """Bytes per sample `layer` keeps after its forward (`simulator.memory_activations`)."""
        checkpoint = self.per_layer or (self.config.recompute == "full"
                                        and layer in self.segment_starts.get(microbatch, ()))
        key = (layer, checkpoint)
        if key not in self._kept_cache:  # the same for every micro-batch: the rank's sharding and dtype
            self._kept_cache[key] = kept_bytes(self.layers[layer], self.config.recompute, self.element,
                                               self.sharding, checkpoint)
        return self._kept_cache[key]

    def saved(self, layer: int) -> float:
        if layer not in self._saved_cache:
            self._saved_cache[layer] = saved_bytes(self.layers[layer], self.element, self.sharding)
        return self._saved_cache[layer]

    def own_remat(self, layer: int) -> bool:
        """Rematerialised when its own backward starts (not at its segment's): per-layer plans, and
        the attention core of selective recompute."""
        return self.per_layer or (self.config.recompute == "selective"
                                  and selective_recomputes_core(self.layers[layer], self.sharding))

    def run(self) -> None:
        compute_index = comm_index = 0
        consumers = []  # (start_s, end_s) of optimizer updates
        buffers = []    # (alloc_s, end_s, bytes)
        for action in self.plan.actions[self.rank]:
            if isinstance(action, Collective):
                start, end = self.comm_spans[comm_index]
                comm_index += 1
                if action.op == "allgather":  # dense allreduces reduce the gradients in place
                    buffers.append((start, end, action.size_bytes * len(action.ranks)))
            elif isinstance(action, Compute):
                start, end = self.compute_spans[compute_index]
                if action.phase == FORWARD:
                    self.forward(action, start, end, compute_index)
                elif action.phase == BACKWARD:
                    self.backward(action, start, end, compute_index)
                elif action.phase == OPTIMIZER and action.id not in self.selections:
                    consumers.append((start, end))
                compute_index += 1
        for start, end, size in buffers:
            free = min((e for s, e in consumers if s >= end - 1e-15), default=end)
            self.add(start, size, "comm_buffers")
            self.add(free, -size, "comm_buffers")

    def _intervals(self, layers, start, end, flops):
        """(layer, from, to): the span shared among `layers` (in execution order) by their FLOPs."""
        layers = list(layers)
        key = (layers[0], layers[-1], flops) if layers else None  # a span's split is the same every micro-batch
        weights = self._weights_cache.get(key)
        if weights is None:
            weights = self._weights_cache[key] = [flops(self.layers[layer]) for layer in layers]
        if sum(weights) <= 0:
            weights = [1.0] * len(weights)
        at, done, total = start, 0.0, sum(weights)
        for layer, weight in zip(layers, weights):
            done += weight
            until = end if done >= total else start + (end - start) * done / total
            yield layer, at, until
            at = until

    def forward(self, action, start, end, index):
        """Each layer of the span over its share (by forward FLOPs): its activations appear when it
        runs; offloaded ones leave for the host when it ends."""
        mb, scale, batch = action.microbatch, action.batch * self.element, action.batch
        recompute = action.id in self.recomputes
        offload = self.config.offload_activations and not recompute
        if not recompute:
            self.phase_s["F"] += end - start
        layers = range(action.layer_start, action.layer_end)
        for layer, at, until in self._intervals(layers, start, end, _forward_flops):
            spec = self.layers[layer]
            kept = self.kept(mb, layer)
            if recompute:
                # per-layer granularity: the layer's own backward rematerialises it (backward())
                size = 0.0 if self.per_layer else max(self.saved(layer) - kept, 0) * batch
                self.remat.add((mb, layer))
            else:
                size = kept * batch
                if layer == self.last_layer:  # the loss keeps the logits and their log-softmax
                    size += 2 * spec.output_elements_per_sample * scale
            self.add(at, size, "activations")
            if offload:
                self.host[(mb, layer)] = size
                self.add(until, -size, "activations")
                self.transfers.append((size, "out"))
            else:
                self.live[mb][layer] += size
            workspace = spec.output_elements_per_sample * scale
            self.add(at, workspace, "workspace")
            self.add(until, -workspace, "workspace")
            if layer in self.sent and not recompute:
                self._hold_sent_output(mb, layer, spec.output_elements_per_sample * scale, until)

    def _hold_sent_output(self, mb, layer, size, at) -> None:
        """A stage's output stays on the sender after the send: it is the root of the stage's backward
        (and its final ReLU saves it); the receiver's copy is counted there as the next layer's input."""
        self.add(at, size, "activations")
        if self.config.memory_policy == "none":
            self.boundary[mb] += size
        else:
            self.held[(mb, layer)] += size

    def _backward_transients(self, layer, scale) -> float:
        """Gradient maps that exist only while `layer`'s backward runs, besides its output and input
        gradients: a residual layer holds the gradient at its add for the shortcut while the branch's
        backward runs (one output map); the loss's backward (last layer) holds the NLL gradient of the
        log-probabilities while log-softmax's backward forms dL/dlogits (one output map)."""
        spec = self.layers[layer]
        maps = int((spec.spec or {}).get("kind") in RESIDUAL_KINDS) + int(layer == self.last_layer)
        return maps * spec.output_elements_per_sample * scale

    def backward(self, action, start, end, index):
        """Rematerialise the segment at its start, then walk its layers last to first (by backward
        FLOPs), each fetched from the host (offload) as it starts. none: a layer's internal tensors go when its backward ends, its input
        feature map and input gradient stay until the micro-batch's backward on the rank ends;
        reuse/laysa: everything goes, the gradient map living in the freed buffers."""
        mb, scale, batch = action.microbatch, action.batch * self.element, action.batch
        self.phase_s["B"] += end - start
        layers = range(action.layer_start, action.layer_end)
        arriving = 0.0
        remat = {}
        for layer in layers:
            if self.config.recompute != "none" and (self.per_layer or (mb, layer) not in self.remat):
                remat[layer] = max(self.saved(layer) - self.kept(mb, layer), 0) * batch
                self.live[mb][layer] += remat[layer]
                arriving += 0.0 if self.own_remat(layer) else remat[layer]
        self.add(start, arriving, "activations")
        no_reuse = self.config.memory_policy == "none"
        if not no_reuse:
            incoming = self.layers[action.layer_end - 1].output_elements_per_sample * scale
            self.add(start, incoming, "gradient_maps")
            self.add(end, -incoming, "gradient_maps")
        for layer, at, until in self._intervals(reversed(layers), start, end, _backward_flops):
            spec = self.layers[layer]
            if self.own_remat(layer):
                self.add(at, remat.get(layer, 0.0), "activations")
            fetched = self.host.pop((mb, layer), 0.0)  # offloaded: back from the host as its backward starts
            if fetched:
                self.transfers.append((fetched, "in"))
                self.live[mb][layer] += fetched
                self.add(at, fetched, "activations")
            if no_reuse:
                grads = spec.input_elements_per_sample * scale if layer > 0 else 0.0  # the data has none
                if layer in self.sent:  # the received output gradient, kept like the gradient maps
                    grads += spec.output_elements_per_sample * scale
                self.add(at, grads, "gradient_maps")
                self.grad_maps[mb] += grads
            transient = self._backward_transients(layer, scale)
            self.add(at, transient, "gradient_maps")
            self.add(until, -transient, "gradient_maps")
            workspace = spec.output_elements_per_sample * scale + spec.num_params * self.element
            if self.config.blocked_conv_layout and spec.kind == "conv":
                workspace += (spec.input_elements_per_sample + spec.output_elements_per_sample) * scale
            self.add(at, workspace, "workspace")
            self.add(until, -workspace, "workspace")
            live = self.live[mb].pop(layer, 0.0)
            feature_map = min(spec.input_elements_per_sample * self.element, self.kept(mb, layer)) * batch
            boundary = min(live, feature_map) if no_reuse else 0.0
            self.boundary[mb] += boundary
            self.add(until, boundary - live - self.held.pop((mb, layer), 0.0), "activations")
        if no_reuse and self.last_backward[mb] == (action.layer_start, action.layer_end):
            released = sum(self.live.pop(mb, {}).values())
            self.add(end, -(released + self.boundary.pop(mb, 0.0)), "activations")
            self.add(end, -self.grad_maps.pop(mb, 0.0), "gradient_maps")

    def offload_times(self) -> tuple[float, float]:
        """(host transfer seconds, exposed seconds): transfers out overlap the rank's forward
        compute, transfers in its backward compute; what exceeds that is exposed."""
        bandwidth = self.config.host_bandwidth_bytes_per_s
        out_s = sum(size for size, direction in self.transfers if direction == "out") / bandwidth
        in_s = sum(size for size, direction in self.transfers if direction == "in") / bandwidth
        exposed = max(out_s - self.phase_s["F"], 0.0) + max(in_s - self.phase_s["B"], 0.0)
        return out_s + in_s, exposed


def rank_memory(plan: Plan, workload: Workload, spans, config: MemoryConfig, ranks=None, extra=None) -> list[RankMemory]:
    """Allocation events of every rank, or of `ranks` (spans: the engine's span tuples or the span table),
    with `extra` (per rank, events a strategy times: `simulator.strategies.zero.unit_transient_events`)."""
    by_rank = _spans_by_rank(spans)
    result = []
    for rank in range(plan.num_ranks) if ranks is None else ranks:
        walk = _RankWalk(plan, workload, rank, config, by_rank[rank]["compute"], by_rank[rank]["comm"])
        for category, size in persistent(plan, workload, rank, config).items():
            walk.add(0.0, size, category)
        walk.events += (extra or {}).get(rank, [])
        walk.run()
        total, exposed = walk.offload_times()
        result.append(RankMemory(rank, walk.events, total, exposed))
    return result


def memory_report(plan: Plan, workload: Workload, spans, config: MemoryConfig, same_as=None, extra=None) -> dict:
    """Per device peak, breakdown at the peak and fit; overall peak, fit and offload time. With
    `same_as` (per rank, the rank whose walk equals its own) each distinct walk is made once."""
    ranks = rank_memory(plan, workload, spans, config, None if same_as is None else sorted(set(same_as)), extra)
    walked = {memory.rank: memory.peak() for memory in ranks}
    peaks = [walked[rank if same_as is None else same_as[rank]] for rank in range(plan.num_ranks)]
    devices = [{"rank": rank, "peak_memory_bytes": peak, "memory_breakdown_bytes": breakdown,
                "fits_in_memory": peak <= config.capacity_bytes} for rank, (peak, breakdown) in enumerate(peaks)]
    return {
        "capacity_bytes": config.capacity_bytes,
        "policy": config.memory_policy,
        "recompute": config.recompute,
        "offload_activations": config.offload_activations,
        "peak_memory_bytes": max((d["peak_memory_bytes"] for d in devices), default=0.0),
        "fits_in_memory": all(d["fits_in_memory"] for d in devices),
        "offload_s": max((m.offload_s for m in ranks), default=0.0),
        "offload_exposed_s": max((m.offload_exposed_s for m in ranks), default=0.0),
        "devices": devices,
    }
