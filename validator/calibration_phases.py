"""The measuring side of a calibration: what every rank runs (`rank_main`), phase by phase.

`validator.calibrate` spawns the ranks, fits their medians and writes the profile; the order of
the phases and what each measures is described there. Here: the layer sweeps spread over the
calibration (`validator.layer_passes`), the phases between them (`PHASES`), and the machine's CPU
accounting around them.
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from simulator.weight_pass_layers import timed_layer_sets
from simulator.workload import Workload
from validator.cold_bench import time_cold_start
from validator.cycle_compute_bench import measure_cycle_compute
from validator.runtime_messages_bench import measure_runtime_messages
from validator.stage_loop_bench import measure_stage_loops
from validator.sweep_bench import time_layer_sweeps
from validator.handoff_bench import measure_handoff
from validator.machine_cpu import machine_cpu_s
from validator.layer_passes import (DEFAULT_LAYER_PASSES, comm_pass_spread, median_comm_over_passes,
                                   median_over_passes, pass_slots, pass_spread, pass_totals_s)
from validator.comm_bench import agree_max, time_allgather, time_allreduce, time_p2p
from validator.microbench import load_models_module, time_layers, time_optimizer, time_topk
from validator.overlap_bench import (DEFAULT_OVERLAP_BYTES, DEFAULT_OVERLAP_MESSAGES, OVERLAP_KINDS,
                                     model_steps, time_overlap)
from validator.pass_jitter_bench import DEFAULT_JITTER_PASSES, time_model_passes
from validator.weight_pass_bench import time_weight_passes

DEFAULT_TOPK_DENSITIES = (0.001, 0.01, 0.1)
"""Densities of the top-k selection fits (strategy.compression_density; default 0.01)."""


@dataclass(frozen=True)
class CalibrationSettings:
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
    jitter_passes: int = DEFAULT_JITTER_PASSES
    """Whole-model passes per burst, a burst before, between and after the phases at each number of
    ranks at once recorded (`validator.pass_jitter_bench`); 0: none."""


def say(settings: CalibrationSettings, message: str) -> None:
    if settings.verbose and dist.get_rank() == 0:
        print(f"[calibrate] {message}", file=sys.stderr, flush=True)


def _divisors(world_size: int, minimum: int = 2) -> list[int]:
    return [g for g in range(minimum, world_size + 1) if world_size % g == 0]


def _layer_sets(modules) -> list[list[int]]:
    """The sets the update and the weight passes are timed over, as layer indices
    (`simulator.weight_pass_layers.timed_layer_sets`, which the simulator rebuilds from the workload)."""
    return [list(layers) for layers in timed_layer_sets([sum(p.numel() for p in module.parameters())
                                                         for module in modules])]


def _parameter_sets(modules) -> list[list[torch.Tensor]]:
    """The parameters of each of `_layer_sets`."""
    return [[p for layer in layers for p in modules[layer].parameters()] for layers in _layer_sets(modules)]


def _topk_sizes(num_params: int) -> list[int]:
    """4096 x 4^j elements below the model's parameter count, then the count itself (>= 2 sizes)."""
    sizes = [4096]
    while sizes[-1] * 4 < num_params:
        sizes.append(sizes[-1] * 4)
    return sizes + [num_params if num_params > sizes[-1] else 2 * sizes[-1]]


def weight_pass_ranks_at_once(world_size: int, device: str, cores: int | None = None) -> int:
    """How many ranks time the weight passes at once: all of them on a CPU host with a core for
    each rank, else rank 0 alone (the others at a barrier).

    - Ranks outnumbering the cores: all ranks at once, the median over blocks hid the time-sharing.
      A pass is a small share of its micro-batch cycle, so most blocks saw no preemption inside
      it. On the 2-core host, 4 ranks at once over rank 0 alone measured 1.0-1.8x for the passes
      against the layers' 1.9-2.5x, so rescaling them by the layers' slowdown kept 0.44-0.87 of
      their work (`benchmarks/bench_weight_pass_sharing.py`). So rank 0 alone.
    - A core for each rank: no preemption to hide, but the ranks share the memory bus, and the
      passes stream a stage's weights (and the update its optimizer state) through it. On the
      2-core host, 2 ranks at once over rank 0 alone measured 1.43-1.56x for the MLP's passes
      (its layers' compute_slowdown[2]: 1.10), 1.12-1.27x for the transformer's (1.06) and 1.00-1.03x
      for the ResNet-20's (1.01) (2026-11-24, `bench_weight_pass_sharing.py --ranks 2`). Timed
      alone and rescaled by the layers' slowdown, the MLP's kept about 0.7 of their work. So all
      ranks at once, timed in cycles as the runtime runs them.
    - A GPU per rank: rank 0 alone (unchanged; not measured on a GPU host)."""
    if device != "cpu" or world_size <= 1:
        return 1
    return world_size if world_size <= (cores or os.cpu_count() or 1) else 1


def _measure_updates(settings: CalibrationSettings, device: str, rank: int) -> dict:
    """Optimizer updates, all ranks at once; the asynchronous runtimes' weight passes with
    `weight_pass_ranks_at_once` ranks at once, and where that is all of them, rank 0 alone too
    (kept beside the fits as `alone`: what the passes cost without the others' memory traffic)."""
    world = dist.get_world_size()
    modules = load_models_module(settings.models).build_modules(settings.workload, seed=settings.seed)
    timing = dict(repeats=settings.repeats, device=device, warmup=settings.warmup,
                  min_block_s=settings.min_block_s)
    say(settings, f"optimizer {settings.optimizer}: {world} ranks at once")
    optimizer = time_optimizer(settings.optimizer, _parameter_sets(modules), barrier=dist.barrier,
                               agree=agree_max, **timing)
    micro_batch = settings.batch_sizes[len(settings.batch_sizes) // 2]
    ranks_at_once = weight_pass_ranks_at_once(world, device)
    batch, _targets = load_models_module(settings.models).make_batch(settings.workload, micro_batch, seed=settings.seed)

    def time_passes(**sync) -> list[dict]:
        return time_weight_passes(modules, _layer_sets(modules), batch, optimizer=settings.optimizer,
                                  max_copy_age=world - 1, **sync, **timing)

    weight_passes = alone = None
    if ranks_at_once > 1:
        say(settings, f"weight passes (stash, predict, accumulate) and the update in micro-batch cycles at "
                      f"batch {micro_batch}: {ranks_at_once} ranks at once")
        dist.barrier()
        weight_passes = time_passes(barrier=dist.barrier, agree=agree_max)
        if rank != 0:
            weight_passes = None
    say(settings, f"weight passes and the update in micro-batch cycles at batch {micro_batch}: rank 0 alone")
    dist.barrier()
    if rank == 0:
        alone = time_passes()
    dist.barrier()
    if ranks_at_once == 1:
        weight_passes, alone = alone, None
    return {"optimizer": optimizer, "weight_passes": weight_passes, "weight_passes_alone": alone,
            "weight_pass_ranks_at_once": ranks_at_once}


def _measure_cold_and_topk(settings: CalibrationSettings, device: str, rank: int) -> dict:
    """Cold start (on a CPU host no more ranks at once than cores), top-k selection and, on a CPU
    host, the layer sweeps (`validator.sweep_bench`, no more ranks at once than cores either)."""
    world = dist.get_world_size()
    cold_batch = settings.batch_sizes[len(settings.batch_sizes) // 2]
    say(settings, f"cold start: layers at batch {cold_batch} and the update, back to back and after a pause")
    ranks_at_once = world if device != "cpu" else min(world, os.cpu_count() or 1)
    cold_start = time_cold_start(settings.workload, cold_batch, settings.optimizer, pairs=settings.repeats,
                                 device=device, models=settings.models, seed=settings.seed, barrier=dist.barrier,
                                 active=rank < ranks_at_once)
    if cold_start is not None:
        cold_start["ranks_at_once"] = ranks_at_once  # fixes the layer medians its hot passes compare with
    topk = {}
    for density in settings.topk_densities:
        say(settings, f"top-k selection at density {density}: {world} ranks at once")
        topk[density] = time_topk(_topk_sizes(settings.workload.num_params), density, repeats=settings.repeats,
                                  device=device, warmup=settings.warmup, barrier=dist.barrier, agree=agree_max,
                                  min_block_s=settings.min_block_s)
    layer_sweep = None
    if device == "cpu":  # measured on a CPU host only (a GPU's layers are stream-timed: unmeasured there)
        say(settings, f"layer sweeps: each layer inside whole-model sweeps and back to back, "
                      f"{len(settings.batch_sizes)} batch sizes, {ranks_at_once} rank(s) at once")
        layer_sweep = time_layer_sweeps(settings.workload, settings.batch_sizes, device=device,
                                        models=settings.models, seed=settings.seed, barrier=dist.barrier,
                                        active=rank < ranks_at_once)
        if layer_sweep is not None:
            layer_sweep["ranks_at_once"] = ranks_at_once
    return {"cold_start": cold_start, "topk": topk, "layer_sweep": layer_sweep}


def _concurrent_groups(settings: CalibrationSettings, g: int, timer) -> dict:
    """`timer` run by world / g groups of g consecutive ranks at once; medians averaged over groups."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(start, start + g))) for start in range(0, world, g)]
    mine = None if g == world else groups[rank // g]
    medians = timer(settings.comm_sizes, settings.comm_repeats, group=mine, warmup=settings.warmup)
    group_medians = [None] * world
    dist.all_gather_object(group_medians, medians)
    per_group = [group_medians[start] for start in range(0, world, g)]
    return {"medians_s": [sum(col) / len(col) for col in zip(*per_group)], "concurrent_groups": world // g}


def _measure_comm(settings: CalibrationSettings, device: str, rank: int) -> dict:
    """p2p ping-pong between ranks 0 and 1; allreduce and allgather per group size."""
    world = dist.get_world_size()
    p2p = None
    if world >= 2:
        say(settings, f"p2p ping-pong ranks 0-1, {len(settings.comm_sizes)} sizes")
        p2p = time_p2p(settings.comm_sizes, settings.comm_repeats, settings.warmup)
    allreduce, allgather = {}, {}
    for g in _divisors(world):
        say(settings, f"allreduce: {world // g} group(s) of {g} at once")
        allreduce[g] = _concurrent_groups(settings, g, time_allreduce)
        say(settings, f"allgather: {world // g} group(s) of {g} at once")
        allgather[g] = _concurrent_groups(settings, g, time_allgather)
    return {"p2p": p2p, "allreduce": allreduce, "allgather": allgather}


def _measure_overlap(settings: CalibrationSettings, device: str, rank: int) -> dict:
    """>= 2 ranks: handoffs and the runtime's own work per message (`validator.handoff_bench`; on a
    GPU, messages staged through the host); shared cores (CPU): also how compute and communication
    slow each other, and how much the layers get done in the asynchronous cycle (`cycle_compute`);
    every device: each asynchronous kind's stage loop (`validator.stage_loop_bench`)."""
    world = dist.get_world_size()
    overlap, handoff = {}, None
    if world < 2:
        return {"overlap": overlap, "handoff": handoff, "cycle_compute": None, "stage_loops": {}}
    steps = model_steps(settings.workload, settings.batch_sizes[len(settings.batch_sizes) // 2],
                        load_models_module(settings.models), seed=settings.seed, device=device)
    if device == "cpu":
        for kind in OVERLAP_KINDS:
            say(settings, f"overlap: compute with a {kind} stream, {world} ranks at once")
            overlap[kind] = time_overlap(steps, kind, DEFAULT_OVERLAP_BYTES[kind], DEFAULT_OVERLAP_MESSAGES[kind],
                                         repeats=settings.repeats, warmup=settings.warmup)
    handoff = measure_handoff(steps, settings.repeats + 3, settings.warmup, lambda message: say(settings, message))
    say(settings, "handoff: the pipeline runtime's own messages, PipeDream on a synthetic MLP")
    runtime = measure_runtime_messages()
    if runtime is not None:
        handoff["runtime"] = runtime
    cycle_compute = None
    if device == "cpu":
        say(settings, "cycle compute: the layers in the asynchronous 1F1B cycle's windows against the shared cores")
        cycle_compute = measure_cycle_compute(steps)
    say(settings, "stage loops: each asynchronous kind's stages through the pipeline runtime, without messages")
    stage_loops = measure_stage_loops(settings.workload, settings.optimizer, device,
                                      "cpu" if device == "cpu" else "cuda")
    return {"overlap": overlap, "handoff": handoff, "cycle_compute": cycle_compute, "stage_loops": stage_loops}


_PHASES = (_measure_updates, _measure_cold_and_topk, _measure_overlap)
"""The calibration's phases between the passes, in order. A pass times the layers, the whole-model
passes and the communication (`_measure_comm`): every figure a step is made of is then a median
over passes spread over the calibration (`validator.layer_passes`)."""


def rank_main(rank: int, settings: CalibrationSettings) -> dict | None:
    world = dist.get_world_size()
    device = settings.device
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    workload = settings.workload
    dist.barrier()
    started = time.perf_counter()
    machine_before, own_before = machine_cpu_s(), _own_cpu_s()

    levels = [world] + [k for k in _divisors(world, minimum=1) if k < world]
    slots = pass_slots(settings.layer_passes, len(_PHASES))
    runs, comm_runs, measured = [], [], {}
    jitter_batch = settings.batch_sizes[len(settings.batch_sizes) // 2]
    jitter_levels = sorted({world, world if device != "cpu" else min(world, os.cpu_count() or 1)})
    pass_times_s = {k: [] for k in jitter_levels}  # ranks at once -> this rank's pass times
    pass_starts_s = {k: [] for k in jitter_levels}  # ... and their starts (barrier exits), host clock
    for slot in range(len(_PHASES) + 1):
        for _ in range(slots.count(slot)):
            say(settings, f"layers, pass {len(runs) + 1} of {len(slots)}: {workload.num_layers} layers x "
                           f"{len(settings.batch_sizes)} batch sizes, with {' / '.join(map(str, levels))} "
                           "rank(s) computing at once")
            runs.append(time_layers(workload, settings.batch_sizes, barrier=dist.barrier,
                                    rounds=[rank < k for k in levels], repeats=settings.repeats,
                                    warmup=settings.warmup, device=device, models=settings.models,
                                    seed=settings.seed, agree=agree_max, min_block_s=settings.min_block_s))
        for k in jitter_levels if settings.jitter_passes > 0 else ():
            say(settings, f"whole-model passes at batch {jitter_batch}: {settings.jitter_passes}, {k} rank(s) at once")
            pass_times_s[k] += time_model_passes(workload, jitter_batch, settings.jitter_passes, device=device,
                                                 models=settings.models, seed=settings.seed, barrier=dist.barrier,
                                                 active=rank < k, started_at_s=pass_starts_s[k])
        for _ in range(slots.count(slot)):
            comm_runs.append(_measure_comm(settings, device, rank))
        if slot < len(_PHASES):
            measured.update(_PHASES[slot](settings, device, rank))
    everyone = [None] * world
    dist.all_gather_object(everyone, (median_over_passes(runs), pass_totals_s(runs)))
    layer_medians = {}  # {k: [per active rank: rows with forward_s / backward_s of that level]}
    for position, k in enumerate(levels):
        layer_medians[k] = [[entry["rounds"][position] for entry in rank_rows] for rank_rows, _ in everyone[:k]]
    every_pass = [None] * world
    dist.all_gather_object(every_pass, (pass_times_s, pass_starts_s, socket.gethostname()))
    pass_jitter = None
    if settings.jitter_passes > 0:
        pass_jitter = {"batch_size": jitter_batch, "passes_per_burst": settings.jitter_passes,
                       "levels": {str(k): [list(row) for row in zip(*(times[k] for times, _, _ in every_pass[:k]))]
                                  for k in jitter_levels}}
        if len({host for _, _, host in every_pass}) == 1:  # one host: one monotonic clock for all ranks
            pass_jitter["start_offsets_s"] = {
                str(k): [[start - min(row) for start in row]
                         for row in zip(*(starts[k] for _, starts, _ in every_pass[:k]))]
                for k in jitter_levels}
    dist.barrier()
    measure_s = time.perf_counter() - started
    machine_after, own_after = machine_cpu_s(), _own_cpu_s()
    cpu_s = [None] * world
    dist.all_gather_object(cpu_s, own_after - own_before)
    if rank != 0:
        return None
    return {"layers": layer_medians, "layer_passes": pass_spread([totals for _, totals in everyone]),
            **measured, **median_comm_over_passes(comm_runs), "comm_passes": comm_pass_spread(comm_runs),
            "measure_s": measure_s,
            "pass_jitter": pass_jitter,
            "background_cpu": _background_cpu(machine_before, machine_after, sum(cpu_s), measure_s),
            "num_threads": torch.get_num_threads(),
            "device_name": _device_name(device)}


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


def load_average() -> float | None:
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
