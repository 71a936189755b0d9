"""The measuring side of a calibration: what every rank runs (`rank_main`), phase by phase.

`validator.calibrate` spawns the ranks, fits what rank 0 returns and writes the profile; what each
phase measures is described there. Here: the layer sweeps spread over the calibration
(`validator.layer_passes`), the phases between them (`PHASES`, each given what the earlier ones
measured), and the machine's CPU accounting around them.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from simulator.workload import Workload
from validator.comm_bench import agree_max, time_allgather, time_allreduce, time_p2p
from validator.fsdp_bench import LINEARS_PER_UNIT, UNIT_COUNTS, time_fsdp_units
from validator.layer_passes import (comm_pass_spread, median_comm_over_passes, median_over_passes, pass_slots,
                                    pass_spread, pass_totals_s)
from validator.message_bench import DEFAULT_MESSAGE_BYTES, stage_hop_s, time_messages
from validator.microbench import load_models_module, time_layers, time_optimizer, time_topk
from validator.overlap_bench import DEFAULT_OVERLAP_BYTES, DEFAULT_OVERLAP_MESSAGES, OVERLAP_KINDS, model_steps, time_overlap
from validator.sweep_ratio import DEFAULT_PASSES, DEFAULT_TRIALS, combine_ranks, ranks_at_once, time_sweep_ratios
from validator.weight_pass_bench import time_weight_passes


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
    topk_densities: tuple[float, ...]
    layer_passes: int
    sweep_trials: int = DEFAULT_TRIALS
    sweep_passes: int = DEFAULT_PASSES
    message_bytes: int = DEFAULT_MESSAGE_BYTES
    fsdp: bool = False
    """Also time FSDP2's host work per collective (`validator.fsdp_bench`; >= 2 ranks)."""

    @property
    def middle_batch(self) -> int:
        return self.batch_sizes[len(self.batch_sizes) // 2]

    @property
    def timing(self) -> dict:
        return dict(repeats=self.repeats, warmup=self.warmup, min_block_s=self.min_block_s)


def say(settings: CalibrationSettings, message: str) -> None:
    if settings.verbose and dist.get_rank() == 0:
        print(f"[calibrate] {message}", file=sys.stderr, flush=True)


def divisors(world_size: int, minimum: int = 2) -> list[int]:
    return [g for g in range(minimum, world_size + 1) if world_size % g == 0]


def stage_sets(params_per_layer: list[int]) -> list[range]:
    """The layer sets the update and the weight passes are timed over: every prefix of the layers
    that adds weights (the parameter counts of stages from one layer to the whole model)."""
    return [range(end + 1) for end, count in enumerate(params_per_layer) if count > 0]


def topk_sizes(num_params: int) -> list[int]:
    """4096 x 4^j elements below the model's parameter count, then the count itself (>= 2 sizes)."""
    sizes = [4096]
    while sizes[-1] * 4 < num_params:
        sizes.append(sizes[-1] * 4)
    return sizes + [num_params if num_params > sizes[-1] else 2 * sizes[-1]]


def _measure_updates(settings: CalibrationSettings, device: str, measured: dict) -> dict:
    """The update and the asynchronous runtime's weight passes over `stage_sets`, all ranks at once."""
    modules = load_models_module(settings.models).build_modules(settings.workload, seed=settings.seed)
    sets = stage_sets([sum(p.numel() for p in module.parameters()) for module in modules])
    world = dist.get_world_size()
    say(settings, f"optimizer {settings.optimizer} over {len(sets)} parameter sets: {world} ranks at once")
    optimizer = time_optimizer(settings.optimizer, [[p for layer in layers for p in modules[layer].parameters()]
                                                    for layers in sets],
                               device=device, barrier=dist.barrier, agree=agree_max, **settings.timing)
    say(settings, f"weight passes (stash, predict, repredict, accumulate, average): {world} ranks at once")
    passes = time_weight_passes(modules, sets, device=device, barrier=dist.barrier, agree=agree_max,
                                **settings.timing)
    return {"optimizer": optimizer, "weight_passes": passes}


def _measure_topk(settings: CalibrationSettings, device: str, measured: dict) -> dict:
    topk = {}
    for density in settings.topk_densities:
        say(settings, f"top-k selection at density {density}: {dist.get_world_size()} ranks at once")
        topk[density] = time_topk(topk_sizes(settings.workload.num_params), density, device=device,
                                  barrier=dist.barrier, agree=agree_max, **settings.timing)
    return {"topk": topk}


def _measure_overlap(settings: CalibrationSettings, device: str, measured: dict) -> dict:
    """CPU, >= 2 ranks: how compute and communication slow each other on the shared cores."""
    world = dist.get_world_size()
    if device != "cpu" or world < 2:
        return {"overlap": None}
    steps = model_steps(settings.workload, settings.middle_batch, load_models_module(settings.models),
                        seed=settings.seed, device=device)
    overlap = {}
    for kind in OVERLAP_KINDS:
        say(settings, f"overlap: compute with a {kind} stream, {world} ranks at once")
        overlap[kind] = time_overlap(steps, kind, DEFAULT_OVERLAP_BYTES[kind], DEFAULT_OVERLAP_MESSAGES[kind],
                                     repeats=settings.repeats, warmup=settings.warmup)
    return {"overlap": overlap}


def _measure_sweep_ratios(settings: CalibrationSettings, device: str, measured: dict) -> dict:
    """Each layer inside whole-model sweeps over back to back, per batch size
    (`validator.sweep_ratio`), `ranks_at_once` ranks measuring (the others at the barriers); the
    ratios averaged over them, the same on every rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    together = ranks_at_once(world, settings.device)
    say(settings, f"sweep ratios: each layer inside whole-model sweeps and back to back, "
                  f"{len(settings.batch_sizes)} batch sizes, {together} rank(s) at once")
    mine = time_sweep_ratios(settings.workload, settings.batch_sizes, settings.sweep_trials, settings.sweep_passes,
                             device, models=settings.models, seed=settings.seed, barrier=dist.barrier,
                             active=rank < together)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return {"layer_sweep": {"batch_sizes": list(settings.batch_sizes), "trials": settings.sweep_trials,
                            "passes": settings.sweep_passes, "ranks_at_once": together, **combine_ranks(everyone)}}


def _measure_messages(settings: CalibrationSettings, device: str, measured: dict) -> dict:
    """>= 2 ranks: o_s, o_r and the delivery delay to a waiting rank along a chain of computing
    ranks (`validator.message_bench`), its hop a balanced stage's in-sweep backward at the middle
    batch size (from `_measure_sweep_ratios`)."""
    world = dist.get_world_size()
    if world < 2:
        return {"messages": None}
    sweep = measured.get("layer_sweep")
    backward_s = (sweep["sweep_backward_s"][settings.batch_sizes.index(settings.middle_batch)]
                  if sweep is not None else None)
    hop_s, hop_source = stage_hop_s(backward_s, world)
    steps = model_steps(settings.workload, settings.middle_batch, load_models_module(settings.models),
                        seed=settings.seed, device=device)
    say(settings, f"messages: a chain of {world} computing ranks, {settings.message_bytes} B messages, "
                  f"hop {hop_s * 1e3:.1f} ms ({hop_source})")
    summary = time_messages(steps, hop_s, settings.message_bytes, repeats=settings.repeats + 3,
                            warmup=settings.warmup)
    return {"messages": {**summary, "hop_source": hop_source}}


def _measure_fsdp(settings: CalibrationSettings, device: str, measured: dict) -> dict:
    """With `settings.fsdp` and >= 2 ranks: what an FSDP2 full-shard unit adds to a step, for two unit
    shapes (`validator.fsdp_bench`), and the parameter tensors of each of the model's layers."""
    if not settings.fsdp or dist.get_world_size() < 2:
        return {"fsdp": None}
    say(settings, f"FSDP2 units: stacks of {' and '.join(map(str, UNIT_COUNTS))} tiny units of "
                  f"{' and '.join(map(str, LINEARS_PER_UNIT))} Linear layers, {dist.get_world_size()} ranks at once")
    modules = load_models_module(settings.models).build_modules(settings.workload, seed=settings.seed)
    return {"fsdp": {"shapes": time_fsdp_units(device, warmup=max(settings.warmup, 3)),
                     "layer_tensors": [len(list(module.parameters())) for module in modules]}}


PHASES = (_measure_sweep_ratios, _measure_messages, _measure_updates, _measure_topk, _measure_overlap, _measure_fsdp)
"""The calibration's phases between the layer sweeps, in order; each gets what the earlier ones
measured (the messages' hop comes from the sweep ratios' sweeps)."""


def _concurrent_groups(settings: CalibrationSettings, g: int, timer) -> dict:
    """`timer` run by world / g groups of g consecutive ranks at once; its per-size times (means over
    repeats, `validator.comm_bench`) averaged over the groups."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(start, start + g))) for start in range(0, world, g)]
    mine = None if g == world else groups[rank // g]
    times_s = timer(settings.comm_sizes, settings.comm_repeats, group=mine, warmup=settings.warmup)
    group_times = [None] * world
    dist.all_gather_object(group_times, times_s)
    per_group = [group_times[start] for start in range(0, world, g)]
    return {"times_s": [sum(column) / len(column) for column in zip(*per_group)]}


def _measure_comm(settings: CalibrationSettings) -> dict:
    """p2p ping-pong between ranks 0 and 1; allreduce and allgather per group size."""
    world = dist.get_world_size()
    p2p = None
    if world >= 2:
        say(settings, f"p2p ping-pong ranks 0-1, {len(settings.comm_sizes)} sizes")
        p2p = time_p2p(settings.comm_sizes, settings.comm_repeats, settings.warmup)
    allreduce, allgather = {}, {}
    for g in divisors(world):
        say(settings, f"allreduce and allgather: {world // g} group(s) of {g} at once")
        allreduce[g] = _concurrent_groups(settings, g, time_allreduce)
        allgather[g] = _concurrent_groups(settings, g, time_allgather)
    return {"p2p": p2p, "allreduce": allreduce, "allgather": allgather}


def rank_main(rank: int, settings: CalibrationSettings) -> dict | None:
    """Layer sweeps (with `levels` ranks computing at once) and communication passes spread over the
    calibration, the `PHASES` between them; rank 0 returns everything, the others None."""
    world = dist.get_world_size()
    device = f"cuda:{torch.cuda.current_device()}" if settings.device == "cuda" else settings.device
    dist.barrier()
    started = time.perf_counter()
    machine_before, own_before = _machine_cpu_s(), _own_cpu_s()
    levels = [world] + [k for k in divisors(world, minimum=1) if k < world]
    slots = pass_slots(settings.layer_passes, len(PHASES))
    runs, comm_runs, measured = [], [], {}
    phase_s = {"layers": 0.0, "comm": 0.0, **{phase.__name__.removeprefix("_measure_"): 0.0 for phase in PHASES}}

    def timed(name, measure):
        phase_started = time.perf_counter()
        result = measure()
        phase_s[name] += time.perf_counter() - phase_started
        return result

    for slot in range(len(PHASES) + 1):
        for _ in range(slots.count(slot)):
            say(settings, f"layers, pass {len(runs) + 1} of {len(slots)}: {settings.workload.num_layers} layers x "
                          f"{len(settings.batch_sizes)} batch sizes, with {' / '.join(map(str, levels))} "
                          "rank(s) computing at once")
            runs.append(timed("layers", lambda: time_layers(
                settings.workload, settings.batch_sizes, barrier=dist.barrier, rounds=[rank < k for k in levels],
                device=device, models=settings.models, seed=settings.seed, agree=agree_max, **settings.timing)))
            comm_runs.append(timed("comm", lambda: _measure_comm(settings)))
        if slot < len(PHASES):
            phase = PHASES[slot]
            measured.update(timed(phase.__name__.removeprefix("_measure_"), lambda: phase(settings, device, measured)))
    everyone = [None] * world
    dist.all_gather_object(everyone, (median_over_passes(runs), pass_totals_s(runs)))
    layers = {k: [[entry["rounds"][position] for entry in rows] for rows, _ in everyone[:k]]
              for position, k in enumerate(levels)}  # {k: [per computing rank: per layer {forward_s, backward_s}]}
    dist.barrier()
    measure_s = time.perf_counter() - started
    machine_after = _machine_cpu_s()
    cpu_s = [None] * world
    dist.all_gather_object(cpu_s, _own_cpu_s() - own_before)
    if rank != 0:
        return None
    return {"layers": layers, "layer_passes": pass_spread([totals for _, totals in everyone]),
            **measured, **median_comm_over_passes(comm_runs), "comm_passes": comm_pass_spread(comm_runs),
            "measure_s": measure_s, "phase_s": phase_s,
            "background_cpu": _background_cpu(machine_before, machine_after, sum(cpu_s), measure_s),
            "num_threads": torch.get_num_threads(), "device_name": device_name(device)}


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_cpu_s() -> tuple[float, float] | None:
    """(CPU seconds all processes have used, seconds stolen by a VM's host) from /proc/stat
    (Linux), or None."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = sum(fields[:3]) + sum(fields[5:7])  # user, nice, system, irq, softirq
    steal = fields[7] if len(fields) > 7 else 0
    return busy / ticks, steal / ticks


def _background_cpu(before, after, ranks_cpu_s: float, wall_s: float) -> dict | None:
    """CPU time used during the measurements by anything but the ranks (other processes,
    including the launcher), and a VM host's steal: both distort the figures."""
    if before is None or after is None:
        return None
    others = max(0.0, after[0] - before[0] - ranks_cpu_s)
    cpus = os.cpu_count() or 1
    return {"wall_s": wall_s, "num_cpus": cpus, "other_processes_cpu_s": others, "steal_s": after[1] - before[1],
            "share_of_machine": others / (wall_s * cpus) if wall_s > 0 else 0.0}


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
