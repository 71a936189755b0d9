"""Calibration profiles: measured per-layer compute, optimizer and communication costs.

The validator (`validator/calibrate.py`) measures a model on real hardware with torch and writes a
*profile*, a JSON document; this module reads and checks it (`load_profile`) into a `Profile`;
`simulator.profile_costs.ProfileCosts` turns that into the cost model (the
`simulator.costs.CostModel` protocol, plus the alpha-beta communication times the engine uses
when a profile is present). Nothing here imports torch. The format is documented in `PROFILE_FORMAT` (below, markdown).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.cold_start import ColdStart, parse_cold_start
from simulator.copy_backward import CopyBackward, parse_copy_backward
from simulator.cycle_compute import CycleCompute, parse_cycle_compute
from simulator.weight_pass_layers import PassSets, parse_pass_sets
from simulator.layer_sweep import LayerSweep, parse_layer_sweep
from simulator.costs import PROFILED_WEIGHT_PASSES
from simulator.errors import ScenarioError
from simulator.host_sharing import COMM_CLASSES, Interference
from simulator.pass_jitter import PassJitter, parse_pass_jitter
from simulator.stage_loop import StageLoop, parse_stage_loops
from simulator.profile_fits import (AllreduceStream, AlphaBeta, CycleHandoff, Handoff, LayerProfile, LinearFit,
                                    SelectionFit)
from simulator.profile_format import PROFILE_FORMAT  # re-exported: the documented format
from simulator.document_reader import DocumentReader as _Reader
from simulator.document_reader import show_value as _show

FORMAT = "ghpsim-profile/1"

__doc__ = f"{__doc__}\n{PROFILE_FORMAT}"  # the format is part of the module's documentation


# ----------------------------------------------------------------------------- data


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
    weight_pass_ranks_at_once: Mapping[str, int] = field(default_factory=dict)
    """How many ranks computed at once while each of `weight_passes` was timed: 1 (rank 0 alone)
    since 2026-11; older profiles timed them with all ranks at once (world_size)."""
    optimizer_in_cycle: LinearFit | None = None
    """The update timed inside a micro-batch cycle (after the stage's forward, backward and weight
    passes, as every runtime runs it), vs parameters; None in older profiles (`optimizer.in_cycle`)."""
    optimizer_in_cycle_ranks_at_once: int = 1
    """How many ranks computed at once while `optimizer_in_cycle` was timed (rank 0 alone)."""
    cold_start: ColdStart | None = None
    """Slowdown of passes on layers their rank has not run for a while (`simulator.cold_start`); None in older profiles."""
    pass_jitter: PassJitter | None = None
    """Whole-model pass times per rank, pass after pass (`simulator.pass_jitter`); None in older profiles."""
    layer_sweep: LayerSweep | None = None
    """A layer's pass inside a sweep over its back-to-back time (`simulator.layer_sweep`); None in
    older profiles and GPU ones."""
    pass_sets: PassSets | None = None
    """The weight passes' and the in-cycle update's medians over the calibration's layer sets, for
    per-layer costs (`simulator.weight_pass_layers`); None in profiles that did not keep them."""
    cycle_compute: CycleCompute | None = None
    """Compute in the asynchronous 1F1B cycle over the processor-sharing expectation
    (`simulator.cycle_compute`); None in older profiles and GPU ones."""
    copy_backward: CopyBackward | None = None
    """An asynchronous stage's backward on a weight copy over the same backward through the modules
    (`simulator.copy_backward`); None in older profiles."""
    stage_loops: Mapping[str, StageLoop] = field(default_factory=dict)
    """Per weight mode, an asynchronous stage's own loop over what the model charges for it
    (`simulator.stage_loop`); empty in older profiles."""
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
    in_cycle = read.mapping(optimizer, "in_cycle", "optimizer.in_cycle", optional=True)
    optimizer_in_cycle, in_cycle_ranks = None, 1
    if in_cycle is not None:
        optimizer_in_cycle = LinearFit(
            read.number(in_cycle, "intercept_s", "optimizer.in_cycle.intercept_s", minimum=0),
            read.number(in_cycle, "per_param_s", "optimizer.in_cycle.per_param_s", minimum=0))
        in_cycle_ranks = read.integer(in_cycle, "ranks_at_once", "optimizer.in_cycle.ranks_at_once", minimum=1)

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
        raw_preposted = read.mapping(raw_handoff, "preposted", "handoff.preposted", optional=True)
        def optional_s(key: str) -> float | None:
            if not raw_preposted or raw_preposted.get(key) is None:
                return None
            return read.number(raw_preposted, key, f"handoff.preposted.{key}", minimum=0)

        handoff = Handoff(read.number(raw_handoff, "size_bytes", "handoff.size_bytes", positive=True),
                          read.number(raw_handoff, "mean_delay_s", "handoff.mean_delay_s", minimum=0),
                          read.number(raw_preposted, "mean_delay_s", "handoff.preposted.mean_delay_s", minimum=0)
                          if raw_preposted else None,
                          optional_s("send_post_s"), optional_s("ready_receive_s"),
                          optional_s("send_post_mean_s"), optional_s("ready_receive_mean_s"),
                          _handoff_section(read, raw_handoff), _handoff_section(read, raw_handoff, "runtime"))
    weight_passes, weight_pass_ranks = {}, {}
    for name, entry in (read.mapping(document, "weight_passes", "weight_passes", optional=True) or {}).items():
        where = f"weight_passes.{name}"
        if name not in PROFILED_WEIGHT_PASSES:
            raise read.fail(where, f"unknown pass {name!r} (expected one of {', '.join(PROFILED_WEIGHT_PASSES)})")
        if not isinstance(entry, Mapping):
            raise read.fail(where, f"expected an object, got {_show(entry)}")
        weight_passes[name] = LinearFit(read.number(entry, "intercept_s", f"{where}.intercept_s", minimum=0),
                                        read.number(entry, "per_param_s", f"{where}.per_param_s", minimum=0))
        weight_pass_ranks[name] = (world_size if entry.get("ranks_at_once") is None else
                                   read.integer(entry, "ranks_at_once", f"{where}.ranks_at_once", minimum=1))
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
        handoff=handoff, weight_passes=weight_passes, weight_pass_ranks_at_once=weight_pass_ranks,
        optimizer_in_cycle=optimizer_in_cycle, optimizer_in_cycle_ranks_at_once=in_cycle_ranks,
        cold_start=parse_cold_start(read, document, len(layers)),
        pass_jitter=parse_pass_jitter(read, document),
        layer_sweep=parse_layer_sweep(read, document, len(layers)),
        cycle_compute=parse_cycle_compute(read, document),
        copy_backward=parse_copy_backward(read, document),
        stage_loops=parse_stage_loops(read, document),
        pass_sets=parse_pass_sets(read, document),
        model_layer_names=tuple(layer_names) if layer_names is not None else None,
        model_num_params=model_num_params, model_forward_flops_per_sample=model_flops,
        document=document,
    )


def _handoff_section(read, raw_handoff, section: str = "cycle") -> CycleHandoff | None:
    """`handoff.<section>` (optional): the pre-posted figures measured in the asynchronous cycle
    (`cycle`) or timed in the pipeline runtime (`runtime`)."""
    raw = read.mapping(raw_handoff, section, f"handoff.{section}", optional=True)
    if not raw:
        return None
    return CycleHandoff(*(read.number(raw, key, f"handoff.{section}.{key}", minimum=0)
                          for key in ("mean_delay_s", "send_post_s", "ready_receive_s", "send_post_mean_s",
                                      "ready_receive_mean_s")))


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
