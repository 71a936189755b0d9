"""Calibrate a model on this machine: measure, fit and write a profile the simulator can use.

`calibrate(...)` spawns `world_size` local ranks (gloo on CPU, nccl on CUDA; each rank with
`torch.set_num_threads(1)` by default) and measures, in order:

1. **Layers.** Every layer at every batch size is measured in rounds, back to back (so that a
   change in background load hits every round alike): first **all ranks at once** (a barrier
   before each layer; ranks share cores / devices as in a validated run of this world size),
   then, for every divisor k < world_size (k = 1 always), **k ranks at once** (ranks 0..k-1
   compute, the others wait at the barrier). The profile's layer fits use the all-ranks round:
   per layer, batch size and phase, the **mean over ranks of each rank's median**.
   `compute_slowdown[k]` = (sum over layers, batch sizes and phases of the mean over the k
   computing ranks of their medians) / (the same sum for k = 1, rank 0 alone); so
   `compute_slowdown["1"]` = 1 and `compute_slowdown[world_size]` compares the fits with one
   rank alone. A rank's sample is a block of back-to-back iterations of >= 10 ms
   (`min_block_s`), divided by the iterations: with more ranks than cores, single iterations
   shorter than a scheduler time slice mostly run uninterrupted and their median hides the
   sharing (measured on this 2-core machine: 1.26x instead of 1.83x for 4 ranks).
   The layers are swept `layer_passes` times (default 3) at evenly spaced points of the
   calibration, before, between and after the phases below, and each figure is the median over
   the sweeps, so that a speed spell of a shared host costs one sweep, not the profile
   (`validator.layer_passes`; the sweeps' spread is recorded as `method.layer_passes`).
2. **Optimizer, all ranks at once**: one update (step, then the gradients zeroed, as the runtimes
   do) over the parameters of each layer and of each prefix of layers (the stages a plan can
   have), fitted against the number of parameters; then, on the same sets, the asynchronous
   pipeline runtime's weight passes (stash, predict, accumulate) and the replicas' gradient
   averaging (`validator.weight_pass_bench`).
   **Cold start**, all ranks at once (`validator.cold_bench`): every layer at the middle batch
   size and the update, each timed back to back and after a 50 ms pause, alternately; the ratios
   and the decay over shorter pauses (`simulator.cold_start`); on a CPU host no more ranks at
   once than it has cores.
3. **p2p**: ping-pong between ranks 0 and 1 (one-way = half the round trip).
4. **allreduce**: for every divisor g >= 2 of world_size, the world is cut into world_size / g
   groups of consecutive ranks (`new_group`) that all allreduce at the same time (as the
   concurrent groups of a GHP/DP plan do); each group's median (of the slowest member) is
   averaged over groups.
6. **Overlap** (CPU, world_size >= 2; `validator.overlap_bench`): compute steps (the layers'
   forward + backward at the middle batch size) alone, a stream of asynchronous allreduces (or of
   point-to-point messages between rank pairs) alone, and both at once, all ranks together:
   compute's and communication's slowdowns when they overlap on the shared cores
   (`simulator.host_sharing`). Then **handoff** (`validator.handoff_bench`): messages passed
   along a chain of all ranks computing between hops; the mean delay from send to the end of a
   waiting receiver's `wait()` (`ProfileCosts.handoff_s`).
5. **Top-k** (sparse gradients, `simulator.sparse`): the runtime's selection with error feedback
   (`validator.microbench.time_topk`) on flat gradients of 4096 x 4^j elements up to the model's
   parameter count, all ranks at once, at each density of `topk_densities` (fitted against the
   element count, least squares weighted by 1 / t^2); and **allgather** per group size as the
   allreduce above (sizes = bytes each rank contributes).

Communication times are fitted to alpha + S / beta by least squares weighted by 1 / t^2 (i.e.
relative errors, so the small sizes pin alpha and the large ones beta). Nothing is timed end to
end: no training step enters a fit. The profile format: `simulator.profile.PROFILE_FORMAT`.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from simulator.output import write_json_atomic
from simulator.profile import FORMAT
from simulator.workload import Workload
from validator.launch import LaunchConfig, spawn
from validator.handoff_bench import time_handoffs
from validator.weight_pass_bench import WEIGHT_PASSES, time_weight_passes
from validator.cold_bench import time_cold_start
from validator.overlap_bench import (DEFAULT_OVERLAP_BYTES, DEFAULT_OVERLAP_MESSAGES, OVERLAP_KINDS,
                                     model_steps, time_overlap)
from validator.microbench import (DEFAULT_MIN_BLOCK_S, agree_max, fit_line, load_models_module,
                                  time_allgather, time_allreduce, time_layers, time_optimizer, time_p2p,
                                  time_topk)
from validator.layer_passes import (DEFAULT_LAYER_PASSES, median_over_passes, pass_slots, pass_spread,
                                   pass_totals_s)

DEFAULT_BATCH_SIZES = (4, 16, 64)
"""Batch sizes each layer is timed at (per rank): spans the micro-batches of small validated runs."""
DEFAULT_REPEATS = 7
DEFAULT_WARMUP = 2
DEFAULT_COMM_SIZES = tuple(4096 * 4 ** k for k in range(7))
"""4 KiB, 16 KiB, ..., 16 MiB: log-spaced message / allreduce buffer sizes in bytes."""
DEFAULT_COMM_REPEATS = 10
DEFAULT_TOPK_DENSITIES = (0.001, 0.01, 0.1)
"""Densities of the top-k selection fits (strategy.compression_density; default 0.01)."""


@dataclass(frozen=True)
class _Settings:
    workload: Workload
    batch_sizes: tuple[int, ...]
    repeats: int
    warmup: int
    device: str
    optimizer: str
    comm_sizes: tuple[int, ...]
    comm_repeats: int
    models: str
    seed: int
    verbose: bool
    min_block_s: float
    topk_densities: tuple[float, ...] = DEFAULT_TOPK_DENSITIES
    layer_passes: int = DEFAULT_LAYER_PASSES


def _say(settings: _Settings, message: str) -> None:
    if settings.verbose and dist.get_rank() == 0:
        print(f"[calibrate] {message}", file=sys.stderr, flush=True)


def _divisors(world_size: int, minimum: int = 2) -> list[int]:
    return [g for g in range(minimum, world_size + 1) if world_size % g == 0]


def _parameter_sets(modules) -> list[list[torch.Tensor]]:
    """The parameters of each single layer and of each prefix of layers (distinct, non-empty)."""
    per_layer = [list(module.parameters()) for module in modules]
    sets, seen = [], set()
    for end in range(1, len(per_layer) + 1):
        for candidate in (per_layer[end - 1], [p for layer in per_layer[:end] for p in layer]):
            key = tuple(id(p) for p in candidate)
            if candidate and key not in seen:
                seen.add(key)
                sets.append(candidate)
    return sets


def _topk_sizes(num_params: int) -> list[int]:
    """4096 x 4^j elements below the model's parameter count, then the count itself (>= 2 sizes)."""
    sizes = [4096]
    while sizes[-1] * 4 < num_params:
        sizes.append(sizes[-1] * 4)
    return sizes + [num_params if num_params > sizes[-1] else 2 * sizes[-1]]


def _measure_updates(settings: _Settings, device: str, rank: int) -> dict:
    """Optimizer updates and the asynchronous runtimes' weight passes, all ranks at once."""
    world = dist.get_world_size()
    modules = load_models_module(settings.models).build_modules(settings.workload, seed=settings.seed)
    timing = dict(repeats=settings.repeats, device=device, warmup=settings.warmup, barrier=dist.barrier,
                  agree=agree_max, min_block_s=settings.min_block_s)
    _say(settings, f"optimizer {settings.optimizer}: {world} ranks at once")
    optimizer = time_optimizer(settings.optimizer, _parameter_sets(modules), **timing)
    _say(settings, f"weight passes (stash, predict, accumulate): {world} ranks at once")
    return {"optimizer": optimizer, "weight_passes": time_weight_passes(_parameter_sets(modules), **timing)}


def _measure_cold_and_topk(settings: _Settings, device: str, rank: int) -> dict:
    """Cold start (on a CPU host no more ranks at once than cores) and top-k selection."""
    world = dist.get_world_size()
    cold_batch = settings.batch_sizes[len(settings.batch_sizes) // 2]
    _say(settings, f"cold start: layers at batch {cold_batch} and the update, back to back and after a pause")
    cold_start = time_cold_start(settings.workload, cold_batch, settings.optimizer, pairs=settings.repeats,
                                 device=device, models=settings.models, seed=settings.seed, barrier=dist.barrier,
                                 active=device != "cpu" or rank < (os.cpu_count() or 1))
    topk = {}
    for density in settings.topk_densities:
        _say(settings, f"top-k selection at density {density}: {world} ranks at once")
        topk[density] = time_topk(_topk_sizes(settings.workload.num_params), density, repeats=settings.repeats,
                                  device=device, warmup=settings.warmup, barrier=dist.barrier, agree=agree_max,
                                  min_block_s=settings.min_block_s)
    return {"cold_start": cold_start, "topk": topk}


def _concurrent_groups(settings: _Settings, g: int, timer) -> dict:
    """`timer` run by world / g groups of g consecutive ranks at once; medians averaged over groups."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(start, start + g))) for start in range(0, world, g)]
    mine = None if g == world else groups[rank // g]
    medians = timer(settings.comm_sizes, settings.comm_repeats, group=mine, warmup=settings.warmup)
    group_medians = [None] * world
    dist.all_gather_object(group_medians, medians)
    per_group = [group_medians[start] for start in range(0, world, g)]
    return {"medians_s": [sum(col) / len(col) for col in zip(*per_group)], "concurrent_groups": world // g}


def _measure_comm(settings: _Settings, device: str, rank: int) -> dict:
    """p2p ping-pong between ranks 0 and 1; allreduce and allgather per group size."""
    world = dist.get_world_size()
    p2p = None
    if world >= 2:
        _say(settings, f"p2p ping-pong ranks 0-1, {len(settings.comm_sizes)} sizes")
        p2p = time_p2p(settings.comm_sizes, settings.comm_repeats, settings.warmup)
    allreduce, allgather = {}, {}
    for g in _divisors(world):
        _say(settings, f"allreduce: {world // g} group(s) of {g} at once")
        allreduce[g] = _concurrent_groups(settings, g, time_allreduce)
        _say(settings, f"allgather: {world // g} group(s) of {g} at once")
        allgather[g] = _concurrent_groups(settings, g, time_allgather)
    return {"p2p": p2p, "allreduce": allreduce, "allgather": allgather}


def _measure_overlap(settings: _Settings, device: str, rank: int) -> dict:
    """Shared cores (CPU, >= 2 ranks): how compute and communication slow each other; handoffs."""
    world = dist.get_world_size()
    overlap, handoff = {}, None
    if world >= 2 and device == "cpu":
        steps = model_steps(settings.workload, settings.batch_sizes[len(settings.batch_sizes) // 2],
                            load_models_module(settings.models), seed=settings.seed)
        for kind in OVERLAP_KINDS:
            _say(settings, f"overlap: compute with a {kind} stream, {world} ranks at once")
            overlap[kind] = time_overlap(steps, kind, DEFAULT_OVERLAP_BYTES[kind], DEFAULT_OVERLAP_MESSAGES[kind],
                                         repeats=settings.repeats, warmup=settings.warmup)
        _say(settings, f"handoff: messages along a chain of {world} computing ranks")
        handoff = time_handoffs(steps, repeats=settings.repeats + 3, warmup=settings.warmup)
    return {"overlap": overlap, "handoff": handoff}


_PHASES = (_measure_updates, _measure_cold_and_topk, _measure_comm, _measure_overlap)
"""The calibration's phases after (and between) the layer passes, in order."""


def _rank_main(rank: int, settings: _Settings) -> dict | None:
    world = dist.get_world_size()
    device = settings.device
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    workload = settings.workload
    dist.barrier()
    started = time.perf_counter()
    machine_before, own_before = _machine_cpu(), _own_cpu_s()

    levels = [world] + [k for k in _divisors(world, minimum=1) if k < world]
    slots = pass_slots(settings.layer_passes, len(_PHASES))
    runs, measured = [], {}
    for slot in range(len(_PHASES) + 1):
        for _ in range(slots.count(slot)):
            _say(settings, f"layers, pass {len(runs) + 1} of {len(slots)}: {workload.num_layers} layers x "
                           f"{len(settings.batch_sizes)} batch sizes, with {' / '.join(map(str, levels))} "
                           "rank(s) computing at once")
            runs.append(time_layers(workload, settings.batch_sizes, barrier=dist.barrier,
                                    rounds=[rank < k for k in levels], repeats=settings.repeats,
                                    warmup=settings.warmup, device=device, models=settings.models,
                                    seed=settings.seed, agree=agree_max, min_block_s=settings.min_block_s))
        if slot < len(_PHASES):
            measured.update(_PHASES[slot](settings, device, rank))
    everyone = [None] * world
    dist.all_gather_object(everyone, (median_over_passes(runs), pass_totals_s(runs)))
    layer_medians = {}  # {k: [per active rank: rows with forward_s / backward_s of that level]}
    for position, k in enumerate(levels):
        layer_medians[k] = [[entry["rounds"][position] for entry in rank_rows] for rank_rows, _ in everyone[:k]]
    dist.barrier()
    measure_s = time.perf_counter() - started
    machine_after, own_after = _machine_cpu(), _own_cpu_s()
    cpu_s = [None] * world
    dist.all_gather_object(cpu_s, own_after - own_before)
    if rank != 0:
        return None
    return {"layers": layer_medians, "layer_passes": pass_spread([totals for _, totals in everyone]),
            **measured, "measure_s": measure_s,
            "background_cpu": _background_cpu(machine_before, machine_after, sum(cpu_s), measure_s),
            "num_threads": torch.get_num_threads(),
            "device_name": _device_name(device)}


def _machine_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat; None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _background_cpu(before, after, ranks_cpu_s: float, wall_s: float) -> dict | None:
    """CPU time used during the measurements by anything but the ranks (other processes,
    including the launcher): they share the cores and distort the figures."""
    if before is None or after is None:
        return None
    others = max(0.0, after[0] - before[0] - ranks_cpu_s)
    cpus = os.cpu_count() or 1
    return {"wall_s": wall_s, "num_cpus": cpus, "other_processes_cpu_s": others, "steal_s": after[1] - before[1],
            "share_of_machine": others / (wall_s * cpus) if wall_s > 0 else 0.0}


def _load_average() -> float | None:
    """The host's 1-minute load average (recorded: other processes distort CPU timings)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _fit_entry(xs, ys, notes: list[str], what: str, weights=None):
    fit = fit_line(xs, ys, weights)
    if fit.clamped:
        notes.append(f"{what}: {fit.clamped}")
    return fit


def _alpha_beta(sizes, medians, notes, what) -> dict:
    fit = _fit_entry(sizes, medians, notes, what, weights=[1.0 / t ** 2 for t in medians])
    bandwidth = 1.0 / fit.slope if fit.slope > 0 else math.inf
    if not math.isfinite(bandwidth):
        notes.append(f"{what}: time does not grow with size; bandwidth recorded as 1e30 B/s")
        bandwidth = 1e30
    return {"latency_s": fit.intercept, "bandwidth_bytes_per_s": bandwidth, "sizes_bytes": list(sizes),
            "medians_s": list(medians), "r2": fit.r2}


def _topk_fit(items: list[dict], notes: list[str], what: str) -> dict:
    elements = [item["num_elements"] for item in items]
    medians = [item["median_s"] for item in items]
    fit = _fit_entry(elements, medians, notes, what, weights=[1.0 / t ** 2 for t in medians])
    return {"intercept_s": fit.intercept, "per_element_s": fit.slope, "elements": elements,
            "medians_s": medians, "r2": fit.r2}


def _weight_pass_fits(items: list[dict], notes: list[str]) -> dict:
    counts = [item["num_params"] for item in items]
    fits = {}
    for name in WEIGHT_PASSES:
        times = [item[f"{name}_s"] for item in items]
        fit = _fit_entry(counts, times, notes, f"weight_passes.{name}")
        fits[name] = {"intercept_s": fit.intercept, "per_param_s": fit.slope, "r2": fit.r2,
                      "num_params": counts, "medians_s": times}
    return fits


def build_document(workload: Workload, model_params: dict, raw: dict, *, world_size: int, device: str,
                   backend: str, batch_sizes: Sequence[int], optimizer: str, comm_sizes: Sequence[int],
                   repeats: int, comm_repeats: int, min_block_s: float = DEFAULT_MIN_BLOCK_S,
                   layer_passes: int = 1) -> dict:
    """The profile document (see `simulator.profile.PROFILE_FORMAT`) from the ranks' medians."""
    notes: list[str] = []
    by_level = raw["layers"]  # {k: [per active rank: time_layers rows]}
    totals = {k: 0.0 for k in by_level}
    layers = []
    for index, layer in enumerate(workload.layers):
        entry = {"index": index, "name": layer.name, "batch_sizes": list(batch_sizes)}
        for phase, key in (("forward", "forward_s"), ("backward", "backward_s")):
            means = {}
            for k, ranks in by_level.items():
                columns = zip(*(rows[index][key] for rows in ranks))
                means[k] = [sum(values) / len(values) for values in columns]
                totals[k] += sum(means[k])
            mean = means[world_size]
            fit = _fit_entry(batch_sizes, mean, notes, f"layers[{index}].{phase}")
            entry[phase] = {"intercept_s": fit.intercept, "per_sample_s": fit.slope}
            entry[f"r2_{phase}"] = fit.r2
            entry[f"{phase}_medians_s"] = mean
            if world_size > 1:
                entry[f"{phase}_medians_alone_s"] = means[1]
        layers.append(entry)

    counts = [item["num_params"] for item in raw["optimizer"]]
    times = [item["median_s"] for item in raw["optimizer"]]
    fit = _fit_entry(counts, times, notes, "optimizer")
    document = {
        "format": FORMAT,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": {"kind": "cuda" if device.startswith("cuda") else "cpu", "name": raw["device_name"],
                   "num_threads": raw["num_threads"]},
        "torch_version": torch.__version__,
        "backend": backend,
        "world_size": world_size,
        "model": {"name": workload.name, "params": dict(model_params), "num_layers": workload.num_layers,
                  "layer_names": [layer.name for layer in workload.layers],
                  "num_params": workload.num_params,
                  "forward_flops_per_sample": workload.forward_flops_per_sample},
        "layers": layers,
        "optimizer": {"name": optimizer, "intercept_s": fit.intercept, "per_param_s": fit.slope, "r2": fit.r2,
                      "num_params": counts, "medians_s": times},
        **({"weight_passes": _weight_pass_fits(raw["weight_passes"], notes)} if raw.get("weight_passes") else {}),
        **({"cold_start": raw["cold_start"]} if raw.get("cold_start") else {}),
        "p2p": (_alpha_beta(comm_sizes, raw["p2p"], notes, "p2p") if raw["p2p"] is not None else None),
        "allreduce": {str(g): {**_alpha_beta(comm_sizes, item["medians_s"], notes, f"allreduce.{g}"),
                               "concurrent_groups": item["concurrent_groups"]}
                      for g, item in sorted(raw["allreduce"].items())},
        "compute_slowdown": {str(k): (totals[k] / totals[1] if totals[1] > 0 else 1.0)
                             for k in sorted(totals)},
        "allgather": {str(g): {**_alpha_beta(comm_sizes, item["medians_s"], notes, f"allgather.{g}"),
                               "concurrent_groups": item["concurrent_groups"]}
                      for g, item in sorted(raw.get("allgather", {}).items())},
        "topk": {repr(float(density)): _topk_fit(items, notes, f"topk.{density}")
                 for density, items in sorted(raw.get("topk", {}).items())},
        **({"overlap": {"world_size": world_size, **raw["overlap"]}} if raw.get("overlap") else {}),
        **({"handoff": raw["handoff"]} if raw.get("handoff") else {}),
        "method": {
            "layers": f"per rank: median over {layer_passes} pass(es) spread over the calibration of the "
                      f"median over {repeats} blocks of back-to-back iterations (>= {min_block_s} s each) of the "
                      f"time per iteration; mean over the {world_size} ranks, all timing the same layer at once; "
                      "the last layer includes the loss",
            **({"layer_passes": raw["layer_passes"]} if raw.get("layer_passes") else {}),
            "compute_slowdown": "k ranks at once (the others waiting at barriers): sum over layers, batch sizes "
                                "and phases of the mean over the k ranks of their medians, / the same for "
                                "rank 0 alone",
            "comm": f"median of {comm_repeats} runs; alpha-beta least squares weighted by 1/t^2",
            "measure_s": raw["measure_s"],
        },
        "notes": notes,
    }
    return document


def calibrate(workload: Workload, model_params: dict, out_path, device: str = "cpu", world_size: int = 2,
              batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, repeats: int = DEFAULT_REPEATS,
              backend: str | None = None, *, optimizer: str = "sgd", warmup: int = DEFAULT_WARMUP,
              comm_sizes: Sequence[int] = DEFAULT_COMM_SIZES, comm_repeats: int = DEFAULT_COMM_REPEATS,
              num_threads: int = 1, models: str = "validator.models", seed: int = 0,
              min_block_s: float = DEFAULT_MIN_BLOCK_S, timeout_s: float = 1800.0, verbose: bool = True,
              topk_densities: Sequence[float] = DEFAULT_TOPK_DENSITIES,
              layer_passes: int = DEFAULT_LAYER_PASSES) -> dict:
    """Measure `workload` on `world_size` local ranks, write the profile to `out_path` atomically
    and return it. `models` names the module with `build_modules`, `make_batch` and `loss_fn`;
    `topk_densities` the densities of the top-k selection fits; `layer_passes` the sweeps over the
    layers, spread over the calibration (`validator.layer_passes`)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    if device == "cuda" and backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"nccl needs one GPU per rank: {world_size} ranks but {torch.cuda.device_count()} GPUs")
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if layer_passes < 1:
        raise ValueError(f"layer_passes must be >= 1, got {layer_passes}")
    batch_sizes = tuple(int(b) for b in batch_sizes)
    if len(set(batch_sizes)) < 2 or min(batch_sizes) < 1:
        raise ValueError(f"need at least two distinct positive batch sizes, got {batch_sizes}")
    settings = _Settings(workload, batch_sizes, repeats, warmup, device, optimizer, tuple(comm_sizes),
                         comm_repeats, models, seed, verbose, min_block_s,
                         tuple(sorted({float(d) for d in topk_densities})), layer_passes)
    config = LaunchConfig(world_size=world_size, backend=backend, device=device, timeout_s=timeout_s,
                          collective_timeout_s=max(60.0, timeout_s / 2), num_threads=num_threads)
    started = time.perf_counter()
    load_before = _load_average()
    if verbose and load_before is not None and load_before > (os.cpu_count() or 1):
        print(f"[calibrate] warning: the 1-minute load average is {load_before:.2f} on {os.cpu_count()} CPUs; "
              "other processes will distort the timings", file=sys.stderr)
    raw = spawn(_rank_main, (settings,), config)[0]
    background = raw["background_cpu"]
    document = build_document(workload, model_params, raw, world_size=world_size, device=device,
                              backend=backend, batch_sizes=batch_sizes, optimizer=optimizer,
                              comm_sizes=settings.comm_sizes, repeats=repeats, comm_repeats=comm_repeats,
                              min_block_s=min_block_s, layer_passes=layer_passes)
    document["method"]["total_s"] = time.perf_counter() - started
    document["method"]["load_average_1m"] = {"before": load_before, "after": _load_average(),
                                             "num_cpus": os.cpu_count()}
    if background is not None:
        document["method"]["background_cpu"] = background
        if background["share_of_machine"] > 0.1:
            document["notes"].append(
                f"other processes used {100 * background['share_of_machine']:.0f}% of the machine's CPU time "
                "during the calibration: compute and comm figures are distorted; recalibrate on a quiet machine")
    if verbose:
        for note in document["notes"]:
            print(f"[calibrate] note: {note}", file=sys.stderr)
    write_json_atomic(out_path, document)
    if verbose:
        print(f"[calibrate] wrote {out_path} in {document['method']['total_s']:.1f} s", file=sys.stderr)
    return document


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m validator.calibrate MODEL [--param key=value ...] --out profile.json [...]`."""
    import argparse

    import yaml

    from simulator.errors import ScenarioError
    from simulator.model_source import resolve_workload
    from simulator.scenario import ModelConfig

    parser = argparse.ArgumentParser(prog="python -m validator.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="zoo model name, e.g. mlp or resnet20")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="zoo factory parameter (value parsed as YAML); repeatable")
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)))
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--layer-passes", type=int, default=DEFAULT_LAYER_PASSES)
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"))
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl"))
    parser.add_argument("--models", default="validator.models", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    params = {}
    for item in args.param:
        key, _, value = item.partition("=")
        params[key.strip()] = yaml.safe_load(value)
    try:
        workload = resolve_workload(ModelConfig(name=args.model, params=params))
    except ScenarioError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    calibrate(workload, params, args.out, device=args.device, world_size=args.world_size,
              batch_sizes=[int(b) for b in args.batch_sizes.split(",")], repeats=args.repeats,
              backend=args.backend, optimizer=args.optimizer, models=args.models,
              layer_passes=args.layer_passes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
