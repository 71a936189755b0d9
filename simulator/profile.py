"""Calibration profiles: measured per-layer compute, optimizer and communication costs.

The validator (`validator/calibrate.py`) measures a model on real hardware with torch and writes a
*profile*, a JSON document; this module reads it back (`load_profile`) and turns it into a cost
model (`ProfileCosts`) that implements the `simulator.costs.CostModel` protocol, plus the
alpha-beta communication times the engine uses when a profile is present. Nothing here imports
torch. The format is documented in `PROFILE_FORMAT` (below, markdown).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.cold_start import ColdStart, parse_cold_start
from simulator.costs import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_PASS_WORDS
from simulator.errors import ScenarioError
from simulator.host_sharing import COMM_CLASSES, Interference
from simulator.profile_format import PROFILE_FORMAT  # re-exported: the documented format
from simulator.document_reader import DocumentReader as _Reader
from simulator.document_reader import show_value as _show
from simulator.workload import Workload

FORMAT = "ghpsim-profile/1"

__doc__ = f"{__doc__}\n{PROFILE_FORMAT}"  # the format is part of the module's documentation


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class LinearFit:
    """`intercept_s + per_unit_s x amount`, with the R^2 of the fit (None when not recorded)."""

    intercept_s: float
    per_unit_s: float
    r2: float | None = None

    def at(self, amount: float) -> float:
        return self.intercept_s + self.per_unit_s * amount


@dataclass(frozen=True)
class LayerProfile:
    index: int
    name: str
    forward: LinearFit
    backward: LinearFit
    batch_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Handoff:
    """Mean delay of a `size_bytes` message to a waiting receiver on a busy shared host."""

    size_bytes: float
    mean_delay_s: float


@dataclass(frozen=True)
class AlphaBeta:
    """Hockney's model: `latency_s + size / bandwidth_bytes_per_s`."""

    latency_s: float
    bandwidth_bytes_per_s: float
    sizes_bytes: tuple[int, ...] = ()

    def time_s(self, size_bytes: float) -> float:
        if size_bytes <= 0:
            return 0.0
        return self.latency_s + size_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class SelectionFit:
    """Top-k selection time vs elements (`TOPK_FIT` in `PROFILE_FORMAT`): piecewise-linear through
    the measured (elements, median) points inside their range, the linear fit outside."""

    fit: LinearFit
    points: tuple[tuple[float, float], ...] = ()

    def at(self, num_elements: float) -> float:
        points = self.points
        if len(points) < 2 or not points[0][0] <= num_elements <= points[-1][0]:
            return self.fit.at(num_elements)
        index = max(1, bisect.bisect_left([n for n, _ in points], num_elements))
        (n0, t0), (n1, t1) = points[index - 1], points[index]
        return t0 + (t1 - t0) * (num_elements - n0) / (n1 - n0)


@dataclass(frozen=True)
class AllreduceStream:
    """`overlap.collective`: `num_messages` asynchronous allreduces of `size_bytes` among all ranks,
    issued back to back with no compute, took `stream_s` in all."""

    size_bytes: float
    num_messages: int
    stream_s: float


@dataclass(frozen=True)
class Profile:
    """A loaded calibration profile (see `PROFILE_FORMAT`)."""

    source: str
    created_utc: str
    device_kind: str
    device_name: str
    num_threads: int
    torch_version: str
    backend: str
    world_size: int
    model_name: str
    model_params: Mapping[str, Any]
    layers: tuple[LayerProfile, ...]
    optimizer_name: str
    optimizer: LinearFit
    p2p: AlphaBeta | None
    allreduce: Mapping[int, AlphaBeta]
    compute_slowdown: Mapping[int, float]
    allgather: Mapping[int, AlphaBeta] = field(default_factory=dict)
    topk: Mapping[float, SelectionFit] = field(default_factory=dict)
    overlap: Interference | None = None
    allreduce_stream: AllreduceStream | None = None
    """The overlap microbenchmark's stream of asynchronous allreduces, alone; None in older profiles."""
    handoff: Handoff | None = None
    weight_passes: Mapping[str, LinearFit] = field(default_factory=dict)
    """stash / predict / accumulate fits vs parameters (`PASS_FIT`); empty in older profiles."""
    cold_start: ColdStart | None = None
    """Slowdown of passes over operands untouched for a while (`simulator.cold_start`); None in older profiles."""
    model_layer_names: tuple[str, ...] | None = None
    model_num_params: int | None = None
    model_forward_flops_per_sample: float | None = None
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)


# ----------------------------------------------------------------------------- loading


def load_profile(path: str | Path) -> Profile:
    """Read and validate a calibration profile; ScenarioError (one line, naming the file and the
    field) for a missing, unreadable, malformed or foreign file."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ScenarioError(f"{source}: calibration profile not found")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{source}: cannot read the calibration profile: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ScenarioError(f"{source}: not a JSON calibration profile (line {error.lineno}, "
                            f"column {error.colno}: {error.msg})") from None
    return profile_from_dict(document, source)


def profile_from_dict(document: Any, source: str = "<profile>") -> Profile:
    """Validate a profile document already parsed from JSON (see `load_profile`)."""
    read = _Reader(source)
    if not isinstance(document, Mapping):
        raise read.fail("format", f"expected a JSON object with format {FORMAT!r}, got {_show(document)}")
    found = document.get("format")
    if found != FORMAT:
        raise read.fail("format", f"expected {FORMAT!r}, got {_show(found)} (not a ghpsim calibration profile)")

    device = read.mapping(document, "device", "device")
    device_kind = read.string(device, "kind", "device.kind", choices=("cpu", "cuda"))
    device_name = read.string(device, "name", "device.name")
    num_threads = read.integer(device, "num_threads", "device.num_threads", minimum=1)
    world_size = read.integer(document, "world_size", "world_size", minimum=1)

    model = read.mapping(document, "model", "model")
    model_name = read.string(model, "name", "model.name")
    model_params = read.mapping(model, "params", "model.params", optional=True) or {}
    num_layers = read.integer(model, "num_layers", "model.num_layers", minimum=1)
    layer_names = read.get(model, "layer_names", "model.layer_names", optional=True)
    if layer_names is not None and (not isinstance(layer_names, list)
                                    or not all(isinstance(n, str) for n in layer_names)):
        raise read.fail("model.layer_names", f"expected a list of strings, got {_show(layer_names)}")
    model_num_params = None
    if read.get(model, "num_params", "model.num_params", optional=True) is not None:
        model_num_params = read.integer(model, "num_params", "model.num_params", minimum=0)
    model_flops = read.optional_number(model, "forward_flops_per_sample", "model.forward_flops_per_sample")

    raw_layers = read.get(document, "layers", "layers")
    if not isinstance(raw_layers, list):
        raise read.fail("layers", f"expected a list of layers, got {_show(raw_layers)}")
    if len(raw_layers) != num_layers:
        raise read.fail("layers", f"{len(raw_layers)} entries but model.num_layers is {num_layers}")
    layers = tuple(_layer(read, entry, position) for position, entry in enumerate(raw_layers))

    optimizer = read.mapping(document, "optimizer", "optimizer")
    optimizer_name = read.string(optimizer, "name", "optimizer.name", choices=("sgd", "momentum", "adam"))
    optimizer_fit = LinearFit(read.number(optimizer, "intercept_s", "optimizer.intercept_s", minimum=0),
                              read.number(optimizer, "per_param_s", "optimizer.per_param_s", minimum=0))

    raw_p2p = read.get(document, "p2p", "p2p", optional=True)
    if raw_p2p is None:
        if world_size > 1:
            raise read.fail("p2p", f"missing field (required when world_size is {world_size} > 1)")
        p2p = None
    else:
        p2p = _alpha_beta(read, raw_p2p, "p2p")

    raw_allreduce = read.mapping(document, "allreduce", "allreduce")
    allreduce = {}
    for key, entry in raw_allreduce.items():
        where = f"allreduce.{key}"
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 2):
            raise read.fail(where, f"expected a group size (an integer >= 2) as key, got {key!r}")
        allreduce[int(key)] = _alpha_beta(read, entry, where)
    if world_size > 1 and not allreduce:
        raise read.fail("allreduce", f"no group size profiled (world_size is {world_size})")

    allgather = _group_fits(read, document, "allgather")
    topk = {}
    for key, entry in (read.mapping(document, "topk", "topk", optional=True) or {}).items():
        where = f"topk.{key}"
        density = _density_key(key)
        if density is None:
            raise read.fail(where, f"expected a density in (0, 1] as key, got {key!r}")
        if not isinstance(entry, Mapping):
            raise read.fail(where, f"expected an object, got {_show(entry)}")
        topk[density] = _selection_fit(read, entry, where)

    overlap = _overlap(read, document)
    allreduce_stream = _allreduce_stream(read, document)
    handoff = None
    raw_handoff = read.mapping(document, "handoff", "handoff", optional=True)
    if raw_handoff:
        handoff = Handoff(read.number(raw_handoff, "size_bytes", "handoff.size_bytes", positive=True),
                          read.number(raw_handoff, "mean_delay_s", "handoff.mean_delay_s", minimum=0))
    weight_passes = {}
    for name, entry in (read.mapping(document, "weight_passes", "weight_passes", optional=True) or {}).items():
        where = f"weight_passes.{name}"
        if name not in WEIGHT_PASS_WORDS:
            raise read.fail(where, f"unknown pass {name!r} (expected one of {', '.join(WEIGHT_PASS_WORDS)})")
        if not isinstance(entry, Mapping):
            raise read.fail(where, f"expected an object, got {_show(entry)}")
        weight_passes[name] = LinearFit(read.number(entry, "intercept_s", f"{where}.intercept_s", minimum=0),
                                        read.number(entry, "per_param_s", f"{where}.per_param_s", minimum=0))
    slowdown = {1: 1.0}
    raw_slowdown = read.mapping(document, "compute_slowdown", "compute_slowdown", optional=True) or {}
    for key in raw_slowdown:
        where = f"compute_slowdown.{key}"
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise read.fail(where, f"expected a number of ranks (an integer >= 1) as key, got {key!r}")
        slowdown[int(key)] = read.number(raw_slowdown, key, where, positive=True)

    return Profile(
        source=source,
        created_utc=str(document.get("created_utc", "")),
        device_kind=device_kind, device_name=device_name, num_threads=num_threads,
        torch_version=str(document.get("torch_version", "")),
        backend=str(document.get("backend", "")),
        world_size=world_size,
        model_name=model_name, model_params=dict(model_params),
        layers=layers,
        optimizer_name=optimizer_name, optimizer=optimizer_fit,
        p2p=p2p, allreduce=dict(sorted(allreduce.items())),
        compute_slowdown=dict(sorted(slowdown.items())),
        allgather=dict(sorted(allgather.items())), topk=dict(sorted(topk.items())), overlap=overlap,
        allreduce_stream=allreduce_stream,
        handoff=handoff, weight_passes=weight_passes,
        cold_start=parse_cold_start(read, document, len(layers)),
        model_layer_names=tuple(layer_names) if layer_names is not None else None,
        model_num_params=model_num_params, model_forward_flops_per_sample=model_flops,
        document=document,
    )


def _overlap(read: _Reader, document) -> Interference | None:
    """The optional `overlap` section as `simulator.host_sharing.Interference`."""
    section = read.mapping(document, "overlap", "overlap", optional=True)
    if not section:
        return None
    world = read.integer(section, "world_size", "overlap.world_size", minimum=1)
    compute, comm = {}, {}
    for kind in COMM_CLASSES:
        entry = read.mapping(section, kind, f"overlap.{kind}", optional=True)
        if entry:
            compute[kind] = read.number(entry, "compute_slowdown", f"overlap.{kind}.compute_slowdown", positive=True)
            comm[kind] = read.number(entry, "comm_slowdown", f"overlap.{kind}.comm_slowdown", positive=True)
    return Interference(world, compute, comm)


def _allreduce_stream(read: _Reader, document) -> AllreduceStream | None:
    """`overlap.collective`'s stream alone (`size_bytes`, `num_messages`, `stream_s`), if recorded."""
    section = read.mapping(document, "overlap", "overlap", optional=True) or {}
    entry = read.mapping(section, "collective", "overlap.collective", optional=True) or {}
    if not all(key in entry for key in ("size_bytes", "num_messages", "stream_s")):
        return None
    return AllreduceStream(read.number(entry, "size_bytes", "overlap.collective.size_bytes", positive=True),
                           read.integer(entry, "num_messages", "overlap.collective.num_messages", minimum=1),
                           read.number(entry, "stream_s", "overlap.collective.stream_s", positive=True))


def _group_fits(read: _Reader, document, name: str) -> dict[int, AlphaBeta]:
    """An optional `{"<group size>": ALPHA_BETA}` section (allgather)."""
    fits = {}
    for key, entry in (read.mapping(document, name, name, optional=True) or {}).items():
        where = f"{name}.{key}"
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 2):
            raise read.fail(where, f"expected a group size (an integer >= 2) as key, got {key!r}")
        fits[int(key)] = _alpha_beta(read, entry, where)
    return fits


def _selection_fit(read: _Reader, entry: Mapping, where: str) -> SelectionFit:
    fit = LinearFit(read.number(entry, "intercept_s", f"{where}.intercept_s", minimum=0),
                    read.number(entry, "per_element_s", f"{where}.per_element_s", minimum=0))
    elements = read.int_list(entry, "elements", f"{where}.elements", optional=True)
    medians = read.get(entry, "medians_s", f"{where}.medians_s", optional=True)
    if medians is None:
        return SelectionFit(fit)
    if (not isinstance(medians, list) or len(medians) != len(elements)
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in medians)):
        raise read.fail(f"{where}.medians_s", f"expected {len(elements)} non-negative seconds (one per "
                                              f"element count), got {_show(medians)}")
    points = sorted(dict(zip(elements, map(float, medians))).items())
    return SelectionFit(fit, tuple(points))


def _density_key(key) -> float | None:
    try:
        density = float(key)
    except (TypeError, ValueError):
        return None
    return density if 0 < density <= 1 else None


def _layer(read: _Reader, entry, position: int) -> LayerProfile:
    where = f"layers[{position}]"
    if not isinstance(entry, Mapping):
        raise read.fail(where, f"expected an object, got {_show(entry)}")
    index = read.integer(entry, "index", f"{where}.index")
    if index != position:
        raise read.fail(f"{where}.index", f"expected {position} (layers in order), got {index}")
    name = read.string(entry, "name", f"{where}.name")
    fits = {}
    for phase in ("forward", "backward"):
        node = read.mapping(entry, phase, f"{where}.{phase}")
        fits[phase] = LinearFit(
            read.number(node, "intercept_s", f"{where}.{phase}.intercept_s", minimum=0),
            read.number(node, "per_sample_s", f"{where}.{phase}.per_sample_s", minimum=0),
            read.optional_number(entry, f"r2_{phase}", f"{where}.r2_{phase}"))
    batch_sizes = read.int_list(entry, "batch_sizes", f"{where}.batch_sizes", optional=True)
    return LayerProfile(index, name, fits["forward"], fits["backward"], batch_sizes)


def _alpha_beta(read: _Reader, node, where: str) -> AlphaBeta:
    if not isinstance(node, Mapping):
        raise read.fail(where, f"expected an object, got {_show(node)}")
    return AlphaBeta(read.number(node, "latency_s", f"{where}.latency_s", minimum=0),
                     read.number(node, "bandwidth_bytes_per_s", f"{where}.bandwidth_bytes_per_s", positive=True),
                     read.int_list(node, "sizes_bytes", f"{where}.sizes_bytes", optional=True))


# ----------------------------------------------------------------------------- cost model


def profile_costs(path, workload: Workload, optimizer: str | None = None) -> "ProfileCosts":
    """The cost model of the calibration profile at `path` for `workload` (a CPU profile plays
    its ranks on the host's shared cores); `optimizer`, when given, must be the one profiled."""
    profile = load_profile(path)
    return ProfileCosts(profile, workload, optimizer=optimizer, shared_host=profile.device_kind == "cpu")


def streamed_allreduce_factor(profile: Profile) -> float:
    """Time per allreduce in the overlap microbenchmark's asynchronous stream over the alpha-beta
    fit of one at a time (same size, all ranks), at most 1; 1 without the stream or the fit.
    Both are the profile's own microbenchmarks: a stream's allreduces overlap their latencies."""
    stream, fit = profile.allreduce_stream, profile.allreduce.get(profile.world_size)
    if stream is None or fit is None:
        return 1.0
    return min(1.0, stream.stream_s / stream.num_messages / fit.time_s(stream.size_bytes))


class ProfileCosts:
    """The `CostModel` of a calibration profile, for the workload it was calibrated on.

    compute_s = intercept + per_sample x batch of that layer and phase; optimizer_s = intercept +
    per_param x num_params. The fits hold with `profile.world_size` ranks computing at once; pass
    `concurrent_ranks=k` to rescale them to k ranks computing at once (needs
    `compute_slowdown[k]`). `optimizer` (optional) must match the profile's optimizer.
    """

    def __init__(self, profile: Profile, workload: Workload, *, optimizer: str | None = None,
                 concurrent_ranks: int | None = None, shared_host: bool = False):
        self.profile = profile
        self.workload = workload
        self.host_parallelism = None
        self.interference = None
        self.handoff_s = 0.0
        self.streamed_allreduce_factor = 1.0
        """An allreduce queued behind another on its rank takes its fit times this (shared hosts)."""
        """Added to every point-to-point arrival (the `handoff` section; shared hosts only)."""
        if shared_host:
            # Ranks share the host's cores: the engine plays every compute and communication job
            # on a processor-sharing pool of parallelism P = W / slowdown(W) (W ranks computing at
            # once each ran slowdown(W) times slower than alone); compute fits become alone times.
            concurrent_ranks = 1
            world = profile.world_size
            self.host_parallelism = world / self.slowdown(world) if world > 1 else 1.0
            self.interference = profile.overlap
            self.streamed_allreduce_factor = streamed_allreduce_factor(profile)
            if profile.handoff is not None and profile.p2p is not None:
                idle_s = profile.p2p.time_s(profile.handoff.size_bytes)
                self.handoff_s = max(0.0, profile.handoff.mean_delay_s - idle_s)
        _check_model(profile, workload)
        if optimizer is not None and optimizer != profile.optimizer_name:
            raise ScenarioError(
                f"{profile.source}: optimizer.name: the profile timed {profile.optimizer_name!r} but the "
                f"scenario trains with {optimizer!r}; recalibrate with optimizer={optimizer!r}")
        self.scale = 1.0
        if concurrent_ranks is not None:
            self.scale = self.slowdown(concurrent_ranks) / self.slowdown(profile.world_size)
        self._forward = [layer.forward for layer in profile.layers]
        self._backward = [layer.backward for layer in profile.layers]
        self.cold_start = profile.cold_start
        """Read by the engine, which knows how long each pass's operands sat untouched."""

    def slowdown(self, num_ranks: int) -> float:
        """compute_slowdown[num_ranks] of the profile; ScenarioError naming the levels measured."""
        table = self.profile.compute_slowdown
        if num_ranks not in table:
            raise ScenarioError(
                f"{self.profile.source}: compute_slowdown: no factor for {num_ranks} ranks computing at once; "
                f"measured: {', '.join(str(k) for k in table)}")
        return table[num_ranks]

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        if phase == "F":
            fit = self._forward[layer_index]
        elif phase == "B":
            fit = self._backward[layer_index]
        else:
            raise ValueError(f"unknown phase {phase!r} (expected 'F' or 'B')")
        return self.scale * fit.at(batch)

    def optimizer_s(self, num_params: int) -> float:
        if num_params <= 0:
            return 0.0
        return self.profile.optimizer.at(num_params)

    def weight_pass_s(self, name: str, num_params: int) -> float:
        """A stash / predict / accumulate pass over `num_params` weights: the profile's
        `weight_passes` fit; older profiles: scaled from the update by the fp32 words moved,
        intercept_s + per_param_s x num_params x 4 WEIGHT_PASS_WORDS[name] / OPTIMIZER_BYTES_PER_PARAM."""
        if num_params <= 0:
            return 0.0
        fit = self.profile.weight_passes.get(name)
        if fit is not None:
            return fit.at(num_params)
        update = self.profile.optimizer
        update_bytes_per_param = OPTIMIZER_BYTES_PER_PARAM[self.profile.optimizer_name]
        return update.intercept_s + update.per_unit_s * num_params * 4 * WEIGHT_PASS_WORDS[name] / update_bytes_per_param

    def p2p_s(self, size_bytes: float) -> float:
        """One-way point-to-point time of `size_bytes` (alpha + S / beta)."""
        if size_bytes <= 0:
            return 0.0
        if self.profile.p2p is None:
            raise ScenarioError(f"{self.profile.source}: p2p: not profiled (world_size 1); "
                                "recalibrate with world_size >= 2")
        return self.profile.p2p.time_s(size_bytes)

    def allreduce_s(self, size_bytes: float, num_ranks: int) -> float:
        """Allreduce of a `size_bytes` buffer among `num_ranks` ranks, from the fit for that group size."""
        if num_ranks <= 1 or size_bytes <= 0:
            return 0.0
        fit = self.profile.allreduce.get(num_ranks)
        if fit is None:
            sizes = ", ".join(str(g) for g in self.profile.allreduce) or "none"
            raise ScenarioError(
                f"{self.profile.source}: allreduce: no fit for a group of {num_ranks} ranks; "
                f"profiled group sizes: {sizes}")
        return fit.time_s(size_bytes)


    def allgather_s(self, size_bytes: float, num_ranks: int) -> float:
        """Allgather among `num_ranks` ranks, each contributing `size_bytes` (alpha + S / beta of the
        fit for that group size); ScenarioError if the profile has none (older profiles)."""
        if num_ranks <= 1 or size_bytes <= 0:
            return 0.0
        fit = self.profile.allgather.get(num_ranks)
        if fit is None:
            sizes = ", ".join(str(g) for g in self.profile.allgather) or "none (calibrated before top-k support)"
            raise ScenarioError(
                f"{self.profile.source}: allgather: no fit for a group of {num_ranks} ranks (top-k compression "
                f"needs one); profiled group sizes: {sizes}; recalibrate with `ghpsim calibrate`")
        return fit.time_s(size_bytes)

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        """Top-k selection over `num_elements` at `density`, from the profile's fit at that density
        (rescaled like the layer fits); ScenarioError naming the densities profiled if none."""
        if num_elements <= 0:
            return 0.0
        fits = self.profile.topk
        fit = next((f for d, f in fits.items() if density is None or math.isclose(d, density, rel_tol=1e-9)), None)
        if fit is None:
            measured = ", ".join(f"{d:g}" for d in fits) or "none (calibrated before top-k support)"
            raise ScenarioError(
                f"{self.profile.source}: topk: no top-k selection fit at strategy.compression_density "
                f"{density}; profiled densities: {measured}; recalibrate with that density")
        return self.scale * fit.at(num_elements)


def _check_model(profile: Profile, workload: Workload) -> None:
    """Same name, layer count and layer names; same parameter count and forward FLOPs if recorded."""
    names = tuple(layer.name for layer in workload.layers)
    profiled = tuple(layer.name for layer in profile.layers)
    differences = []
    if profile.model_name.lower() != workload.name.lower():
        differences.append("model names differ")
    if profile.num_layers != workload.num_layers:
        differences.append("layer counts differ")
    elif profiled != names:
        differences.append("layer names differ")
    if profile.model_num_params is not None and profile.model_num_params != workload.num_params:
        differences.append(f"{profile.model_num_params} vs {workload.num_params} parameters")
    flops = profile.model_forward_flops_per_sample
    if flops is not None and not math.isclose(flops, workload.forward_flops_per_sample, rel_tol=1e-6):
        differences.append(f"{flops:.6g} vs {workload.forward_flops_per_sample:.6g} forward FLOPs per sample")
    if differences:
        params = f" {dict(profile.model_params)}" if profile.model_params else ""
        raise ScenarioError(
            f"{profile.source}: model: the profile was calibrated for {profile.model_name!r}{params} with "
            f"{profile.num_layers} layers, but the workload is {workload.name!r} with {workload.num_layers} "
            f"layers ({'; '.join(differences)})")
