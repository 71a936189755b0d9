"""Per-device memory over one training step, from the plan and the simulated span table.

Every buffer is an allocation event (time, bytes, category) on its rank; the memory in use is the
running sum, the peak its maximum (frees at an instant are applied before allocations). Nothing
depends on the strategy kind: the actions of the plan and the times of their spans decide
everything, so pipeline schedules get their memory from their own order of forwards/backwards.

Persistent for the whole step (P = the rank's parameters, e = bytes of the training dtype):
- weights P e; master_weights 4P when the dtype is fp16/bf16 (mixed precision keeps fp32 master
  weights, Micikevicius et al., ICLR 2018); optimizer_state 4P x (sgd 0, momentum 1, adam 2 copies,
  fp32, Kingma & Ba 2015); weight_gradients P e;
- stashed_weights P e x (`stashed_weight_versions` + `extra_weight_copies` of the stage in
  plan.meta: PipeDream's weight stash, SpecTrain's predicted copy; absent = 0);
- residual P e for top-k compression (error feedback, Stich et al. 2018; PAPERS.md 3).
Per micro-batch (the batch of the action). A compute span is shared among its layers in proportion
to their FLOPs (forward in layer order, backward in reverse), so buffers appear and go layer by layer:
- activations: each layer's `saved_elements_per_sample` appear when its forward runs (the last
  layer adds the loss's logits and log-softmax, 2 x its output) and go when its backward ends; under
  memory_policy none the layer's input feature map (min(input, kept) elements) stays until the
  rank's last backward of that micro-batch ends (no inter-layer release, as a framework without
  reuse and as the validator's runtime do); under reuse/laysa it goes too (Layrub/LaySA). The plan's
  order decides the rest: GPipe holds m micro-batches, 1F1B at most p - k on stage k.
- stage boundary, sender: the output of a layer whose output goes to the next stage stays after
  the send (the root of the stage's backward, kept by its final ReLU; the receiver's copy is the
  next layer's input, counted there): from its forward until its backward ends (reuse/laysa) or
  until the micro-batch's backward on the rank ends (none). Megatron's output deallocation is
  not modelled.
- recompute selective: attention layers keep only their input; full: only the input of each
  backward segment's first layer (a checkpoint per gradient bucket, the stage input when one
  bucket); the rest is rematerialised by the recompute forward (or, if the plan has none, at the
  start of the backward segment) and freed with the layer's activations. A plan whose
  `meta["recompute_granularity"]` is "layer" (Megatron's `--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1`, what the megatron kind plans; Korthikanti
  et al. 2022, sec. 5: full recompute keeps each layer's input) keeps every layer's input under
  full, and rematerialises a layer only when its own backward starts.
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

from simulator.hardware import LINKS
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan
from simulator.workload import Workload, dtype_bytes

CATEGORIES = ("weights", "master_weights", "optimizer_state", "weight_gradients", "residual",
              "stashed_weights", "activations", "gradient_maps", "comm_buffers", "workspace")
OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}
RESIDUAL_KINDS = ("basic_block", "bottleneck_block", "transformer_block")
"""`Layer.spec` kinds with a residual add inside the layer (simulator/zoo/README.md)."""
BLOCKED_CONV_LAYOUT_DEVICES = ("cpu",)
"""Devices whose convolutions run in oneDNN's blocked layouts (x86 CPUs under PyTorch)."""
MASTER_WEIGHT_DTYPES = ("fp16", "bf16")
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


def memory_config(scenario) -> MemoryConfig:
    training, host_bandwidth = scenario.training, scenario.costs.host_bandwidth_bytes_per_s
    return MemoryConfig(training.dtype, training.optimizer, training.memory_policy, training.recompute,
                        training.offload_activations, scenario.cluster.gpu.memory_bytes,
                        blocked_conv_layout=scenario.cluster.gpu.name in BLOCKED_CONV_LAYOUT_DEVICES,
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
        current = dict.fromkeys(CATEGORIES, 0.0)
        best, at_best = -1.0, dict(current)
        events = sorted(self.events, key=lambda event: (event[0], event[1] > 0))
        for index, (time_s, delta, category) in enumerate(events):
            current[category] += delta
            if index + 1 < len(events) and events[index + 1][0] == time_s:
                continue
            total = sum(current.values())
            if total > best:
                best, at_best = total, dict(current)
        return max(best, 0.0), at_best


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


def _persistent(plan: Plan, workload: Workload, rank: int, config: MemoryConfig) -> dict[str, float]:
    stage_index = plan.grid_position(rank)[1]
    stage = plan.stages[stage_index]
    params, element = stage.num_params, dtype_bytes(config.dtype)
    ranges = getattr(stage, "chunks", ()) or ((stage.layer_start, stage.layer_end),)
    largest = max((workload.layers[i].num_params for a, b in ranges for i in range(a, b)), default=0)
    copies = sum(plan.meta.get(key, [0] * (stage_index + 1))[stage_index]
                 for key in ("stashed_weight_versions", "extra_weight_copies"))
    return {
        "weights": params * element,
        "master_weights": params * 4 if config.dtype in MASTER_WEIGHT_DTYPES else 0,
        "optimizer_state": params * 4 * OPTIMIZER_STATE_COPIES[config.optimizer],
        "weight_gradients": (largest if config.memory_policy == "laysa" else params) * element,
        "residual": params * element if plan.meta.get("topk") else 0,
        "stashed_weights": copies * params * element,
    }


class _RankWalk:
    """Allocation events of one rank's actions (see the module docstring)."""

    def __init__(self, plan, workload, rank, config, compute_spans, comm_spans):
        self.plan, self.layers, self.rank, self.config = plan, workload.layers, rank, config
        self.element = dtype_bytes(config.dtype)
        self.events: list[tuple[float, float, str]] = []
        self.live = defaultdict(float)      # (microbatch, layer) -> activation bytes on device
        self.host = {}                      # (microbatch, layer) -> activation bytes on host
        self.remat = set()
        self.per_layer = plan.meta.get("recompute_granularity") == "layer"
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
        self.last_layer = len(workload.layers) - 1
        stage = plan.stages[plan.grid_position(rank)[1]]
        ranges = getattr(stage, "chunks", ()) or ((stage.layer_start, stage.layer_end),)
        self.sent = {end - 1 for _, end in ranges if end - 1 != self.last_layer}  # output goes to the next stage
        self.held = defaultdict(float)      # (microbatch, layer) -> sent output kept until its backward (reuse)

    def add(self, time_s, delta, category):
        if delta:
            self.events.append((time_s, delta, category))

    def kept_elements(self, microbatch: int, layer: int) -> int:
        spec = self.layers[layer]
        mode = self.config.recompute
        if mode == "selective" and spec.kind == "attention":
            return min(spec.input_elements_per_sample, spec.saved_elements_per_sample)
        if mode == "full":
            if self.per_layer:
                return spec.input_elements_per_sample
            starts = {start for start, _ in self.segments[microbatch]}
            return spec.input_elements_per_sample if layer in starts else 0
        return spec.saved_elements_per_sample

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
        weights = [flops(self.layers[layer]) for layer in layers]
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
        mb, scale = action.microbatch, action.batch * self.element
        recompute = action.id in self.recomputes
        offload = self.config.offload_activations and not recompute
        if not recompute:
            self.phase_s["F"] += end - start
        layers = range(action.layer_start, action.layer_end)
        for layer, at, until in self._intervals(layers, start, end, lambda spec: spec.forward_flops_per_sample):
            spec = self.layers[layer]
            kept = self.kept_elements(mb, layer)
            if recompute:
                # per-layer granularity: the layer's own backward rematerialises it (backward())
                size = 0.0 if self.per_layer else max(spec.saved_elements_per_sample - kept, 0) * scale
                self.remat.add((mb, layer))
            else:
                size = kept * scale
                if layer == self.last_layer:  # the loss keeps the logits and their log-softmax
                    size += 2 * spec.output_elements_per_sample * scale
            self.add(at, size, "activations")
            if offload:
                self.host[(mb, layer)] = size
                self.add(until, -size, "activations")
                self.transfers.append((size, "out"))
            else:
                self.live[(mb, layer)] += size
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
        mb, scale = action.microbatch, action.batch * self.element
        self.phase_s["B"] += end - start
        layers = range(action.layer_start, action.layer_end)
        arriving = 0.0
        remat = {}
        for layer in layers:
            if self.config.recompute != "none" and (self.per_layer or (mb, layer) not in self.remat):
                spec = self.layers[layer]
                remat[layer] = max(spec.saved_elements_per_sample - self.kept_elements(mb, layer), 0) * scale
                self.live[(mb, layer)] += remat[layer]
                arriving += remat[layer]
        if not self.per_layer:
            self.add(start, arriving, "activations")
        no_reuse = self.config.memory_policy == "none"
        if not no_reuse:
            incoming = self.layers[action.layer_end - 1].output_elements_per_sample * scale
            self.add(start, incoming, "gradient_maps")
            self.add(end, -incoming, "gradient_maps")
        for layer, at, until in self._intervals(reversed(layers), start, end,
                                                lambda spec: spec.backward_flops_per_sample):
            spec = self.layers[layer]
            if self.per_layer:
                self.add(at, remat.get(layer, 0.0), "activations")
            fetched = self.host.pop((mb, layer), 0.0)  # offloaded: back from the host as its backward starts
            if fetched:
                self.transfers.append((fetched, "in"))
                self.live[(mb, layer)] += fetched
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
            live = self.live.pop((mb, layer), 0.0)
            feature_map = min(spec.input_elements_per_sample, self.kept_elements(mb, layer)) * scale
            boundary = min(live, feature_map) if no_reuse else 0.0
            self.boundary[mb] += boundary
            self.add(until, boundary - live - self.held.pop((mb, layer), 0.0), "activations")
        if no_reuse and self.last_backward[mb] == (action.layer_start, action.layer_end):
            self.add(end, -(self._release(mb, None) + self.boundary.pop(mb, 0.0)), "activations")
            self.add(end, -self.grad_maps.pop(mb, 0.0), "gradient_maps")

    def _release(self, mb, layers) -> float:
        keys = [key for key in self.live if key[0] == mb and (layers is None or key[1] in layers)]
        return sum(self.live.pop(key) for key in keys)

    def offload_times(self) -> tuple[float, float]:
        """(host transfer seconds, exposed seconds): transfers out overlap the rank's forward
        compute, transfers in its backward compute; what exceeds that is exposed."""
        bandwidth = self.config.host_bandwidth_bytes_per_s
        out_s = sum(size for size, direction in self.transfers if direction == "out") / bandwidth
        in_s = sum(size for size, direction in self.transfers if direction == "in") / bandwidth
        exposed = max(out_s - self.phase_s["F"], 0.0) + max(in_s - self.phase_s["B"], 0.0)
        return out_s + in_s, exposed


def rank_memory(plan: Plan, workload: Workload, spans, config: MemoryConfig) -> list[RankMemory]:
    """Allocation events of every rank (spans: the engine's span tuples or the span table)."""
    by_rank = _spans_by_rank(spans)
    result = []
    for rank in range(plan.num_ranks):
        walk = _RankWalk(plan, workload, rank, config, by_rank[rank]["compute"], by_rank[rank]["comm"])
        for category, size in _persistent(plan, workload, rank, config).items():
            walk.add(0.0, size, category)
        walk.run()
        total, exposed = walk.offload_times()
        result.append(RankMemory(rank, walk.events, total, exposed))
    return result


def memory_report(plan: Plan, workload: Workload, spans, config: MemoryConfig) -> dict:
    """Per device peak, breakdown at the peak and fit; overall peak, fit and offload time."""
    devices = []
    ranks = rank_memory(plan, workload, spans, config)
    for memory in ranks:
        peak, breakdown = memory.peak()
        devices.append({"rank": memory.rank, "peak_memory_bytes": peak, "memory_breakdown_bytes": breakdown,
                        "fits_in_memory": peak <= config.capacity_bytes})
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
