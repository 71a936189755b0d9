"""Calibrate a model on this machine: measure, fit and write a profile the simulator can use
(format `ghpsim-profile/2`, `simulator.profile`).

`calibrate(...)` spawns `world_size` local ranks (gloo on CPU, nccl on CUDA; each rank with
`torch.set_num_threads(1)` by default; `validator.calibration_phases` is what they run):

1. **Layers** (`validator.microbench.time_layers`): every layer's forward and backward at every
   batch size, the ranks in rounds back to back: all ranks at once, then for every divisor k <
   world_size (k = 1 always) ranks 0..k-1 while the others wait at the barrier. A rank's sample
   is a block of back-to-back iterations of >= `min_block_s`, per iteration (so that ranks sharing
   cores count the sharing), its figure the median over blocks. The layers are swept
   `layer_passes` times, spread over the calibration before, between and after the phases below,
   and each figure is the median over the sweeps (`validator.layer_passes`). The profile's fits
   (intercept + per sample x batch, least squares) take the all-ranks round, mean over ranks, each
   median multiplied by the layer's sweep ratio at its batch size (2.) before fitting, so that the
   fits are the pass inside a whole-model sweep; `compute_slowdown[k]` = the sum of every
   back-to-back figure with k ranks at once over the same with rank 0 alone.
2. **Sweep ratios** (`validator.sweep_ratio`): per batch size, each layer's forward and backward
   inside whole-model sweeps over the same pass back to back, no more ranks at once than a CPU
   host has cores (all on GPUs), averaged over them; recorded in `provenance.layer_sweep`.
3. **Messages** (world_size >= 2; `validator.message_bench`): `message_bytes` (64 KiB) messages
   along a chain of all ranks computing between hops, receives posted one ahead as the pipeline
   runtime does; the hop is a balanced stage's in-sweep backward at the middle batch size (the
   model's backward from 2. over world_size, within 2-50 ms). The mean `isend` call is `p2p`'s
   `send_overhead_s`, the mean completion of an already-arrived receive with the next one posted
   its `receive_overhead_s` (LogP's o_s, o_r); on CPU, `shared_processors.wakeup_s` = the mean
   delivery delay to a waiting rank - p2p(message_bytes) of the idle fit (7.) - o_s, at least 0.
   The raw figures: `provenance.messages`.
4. **Optimizer and weight passes**, all ranks at once, back to back: one update (step, then the
   gradients zeroed, as the runtimes do) and the asynchronous runtime's stash, predict, repredict,
   accumulate and average (`validator.weight_pass_bench`) over the parameters of every prefix of
   the layers, fitted against the parameter count.
5. **Top-k** selection with error feedback (`validator.microbench.time_topk`) on flat gradients
   of 4096 x 4^j elements up to the model's parameter count, at each of `topk_densities`.
6. **Overlap** (CPU, world_size >= 2; `validator.overlap_bench`): compute steps alone, a stream of
   allreduces (or point-to-point messages) alone, and both at once: the profile's
   `shared_processors` interference factors. Its `parallelism` is W / compute_slowdown[W].
7. **Communication**, after every layer sweep (`validator.comm_bench`: a collective's figure the
   mean over repeats, since a step pays their sum; a p2p figure the median), the median over the
   sweeps:
   p2p ping-pong between ranks 0 and 1 (one-way = half the round trip); allreduce and allgather
   for every divisor g >= 2 of world_size, the world cut into world_size / g groups of consecutive
   ranks that run at the same time (as the concurrent groups of a GHP / DP plan). Fitted to
   alpha + S / beta by least squares weighted by 1 / t^2 (relative errors: the small sizes pin
   alpha, the large ones beta).
8. **FSDP2** (`fsdp`, `calibrate --fsdp`, world_size >= 2; `validator.fsdp_bench`): stacks of tiny
   full-shard units of two shapes; what a unit adds to a step less its collectives as the fits of
   phase 7 price them gives the profile's `fsdp` (host work per collective, a + b x the unit's
   parameter tensors), with each layer's tensor count.

Nothing is timed end to end: no training step enters a fit. The settings, timings, CPU
accounting and notes (a clamped fit, a disturbed machine) go in the profile's `provenance`.

`calibrate_kernels(...)` (`ghpsim calibrate --kernels`) measures no model: GEMMs, memory-bound
kernels and the launch overhead of one device, into a kernel profile (`validator.kernel_bench`).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Sequence

import torch

from simulator.errors import ScenarioError
from simulator.output import check_output_file, write_json_atomic
from simulator.profile import FORMAT, WEIGHT_PASS_NAMES, AlphaBeta, KernelProfile, Profile, profile_document, profile_from_dict
from simulator.workload import Workload
from validator.calibration_phases import CalibrationSettings, device_name, rank_main
from validator.comm_device import default_backend, device_problem
from validator.launch import LaunchConfig, spawn
from validator.layer_passes import DEFAULT_LAYER_PASSES
from validator import kernel_bench
from validator.fitting import fit_line
from validator.fsdp_bench import host_work
from validator.message_bench import DEFAULT_MESSAGE_BYTES, wakeup_s
from validator.microbench import DEFAULT_MIN_BLOCK_S, load_models_module
from validator.sweep_ratio import DEFAULT_PASSES, DEFAULT_TRIALS, in_sweep

DEFAULT_BATCH_SIZES = (4, 16, 64)
"""Batch sizes each layer is timed at (per rank): spans the micro-batches of small validated runs."""
MAX_CALIBRATION_BATCH = 4096
"""The largest batch a calibration times per rank: beyond the micro-batches any validated run uses,
and a bound on the activations it allocates (a typo such as 99999999 asked for 200 GB)."""
DEFAULT_REPEATS = 7
DEFAULT_WARMUP = 2
DEFAULT_COMM_SIZES = tuple(4096 * 4 ** k for k in range(7))
"""4 KiB, 16 KiB, ..., 16 MiB: log-spaced message / allreduce buffer sizes in bytes."""
DEFAULT_COMM_REPEATS = 10
DEFAULT_TOPK_DENSITIES = (0.001, 0.01, 0.1)
"""Densities of the top-k selection fits (strategy.compression_density; default 0.01)."""


def calibrate(workload: Workload, model_params: dict, out_path, device: str = "cpu", world_size: int = 2,
              batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, repeats: int = DEFAULT_REPEATS,
              backend: str | None = None, *, optimizer: str = "sgd", warmup: int = DEFAULT_WARMUP,
              comm_sizes: Sequence[int] = DEFAULT_COMM_SIZES, comm_repeats: int = DEFAULT_COMM_REPEATS,
              num_threads: int = 1, models: str = "validator.models", seed: int = 0,
              min_block_s: float = DEFAULT_MIN_BLOCK_S, timeout_s: float = 1800.0, verbose: bool = True,
              topk_densities: Sequence[float] = DEFAULT_TOPK_DENSITIES,
              layer_passes: int = DEFAULT_LAYER_PASSES, sweep_trials: int = DEFAULT_TRIALS,
              sweep_passes: int = DEFAULT_PASSES, message_bytes: int = DEFAULT_MESSAGE_BYTES,
              model_source: str = "model", fsdp: bool = False) -> Profile:
    """Measure `workload` on `world_size` local ranks, write the profile to `out_path` atomically
    and return it. `models` names the module with `build_modules`, `make_batch` and `loss_fn`;
    `fsdp`: also time FSDP2's host work per collective (phase 8 of the module docstring).
    Bad settings, or a layer the ranks could not build (its `check_torch_specs`, naming
    `model_source`): a one-line ScenarioError naming the setting before any rank starts; nothing
    is written."""
    backend = backend or default_backend(device)
    settings = CalibrationSettings(workload, tuple(int(b) for b in batch_sizes), repeats, warmup, device, optimizer,
                                   tuple(comm_sizes), comm_repeats, models, seed, verbose, min_block_s,
                                   tuple(sorted({float(d) for d in topk_densities})), layer_passes,
                                   sweep_trials, sweep_passes, message_bytes, fsdp)
    _check(settings, world_size, backend)
    check_specs = getattr(load_models_module(models), "check_torch_specs", None)
    if check_specs is not None:  # e.g. an imported layer table: no torch modules to time
        check_specs(workload, model_source)
    check_output_file(out_path, "--out")  # before the ranks run, not after
    config = LaunchConfig(world_size=world_size, backend=backend, device=device, timeout_s=timeout_s,
                          collective_timeout_s=max(60.0, timeout_s / 2), num_threads=num_threads)
    started = time.perf_counter()
    load_before = _load_average()
    if verbose and load_before is not None and load_before > (os.cpu_count() or 1):
        print(f"[calibrate] warning: the 1-minute load average is {load_before:.2f} on {os.cpu_count()} CPUs; "
              "other processes will distort the timings", file=sys.stderr)
    raw = spawn(rank_main, (settings,), config)[0]
    notes: list[str] = []
    document = profile_fields(workload, model_params, raw, settings, world_size, backend, notes)
    problem = disturbance_of(raw["background_cpu"])
    if problem:
        notes.append(f"{problem} during the calibration: compute and comm figures are distorted; "
                     "recalibrate on a quiet machine")
    document["provenance"] = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__, "settings": {**_settings_record(settings), "num_threads": num_threads},
        "measure_s": raw["measure_s"], "phase_s": raw["phase_s"], "total_s": time.perf_counter() - started,
        "layer_passes": raw["layer_passes"], "comm_passes": raw["comm_passes"],
        "layer_sweep": raw["layer_sweep"], **({"messages": raw["messages"]} if raw.get("messages") else {}),
        **({"fsdp": raw["fsdp"]} if raw.get("fsdp") else {}),
        "load_average_1m": {"before": load_before, "after": _load_average(), "num_cpus": os.cpu_count()},
        **({"background_cpu": raw["background_cpu"]} if raw["background_cpu"] else {}), "notes": notes}
    profile = profile_from_dict(document, str(out_path))  # the loader's own check, before anything is written
    write_json_atomic(out_path, profile_document(profile))
    if verbose:
        for note in notes:
            print(f"[calibrate] note: {note}", file=sys.stderr)
        print(f"[calibrate] wrote {out_path} in {document['provenance']['total_s']:.1f} s", file=sys.stderr)
    return profile


def calibrate_kernels(out_path, device: str = "cuda", *, gpu: str | None = None,
                      dtypes: Sequence[str] | None = None, quick: bool = False, repeats: int | None = None,
                      verbose: bool = True) -> KernelProfile:
    """Time the kernels of one `device` (`validator.kernel_bench`), write the kernel profile to
    `out_path` atomically and return it; `gpu` names the catalogue entry of the datasheet figures.
    Bad settings (or `cuda` without a GPU): a one-line ScenarioError; nothing is written."""
    if device not in ("cpu", "cuda"):
        raise ScenarioError(f"device: expected cpu or cuda, got {device!r}")
    problem = device_problem(device, "gloo", 1)
    if problem:
        raise ScenarioError(f"device {device!r}: {problem}")
    settings = kernel_bench.bench_settings(device, tuple(dtypes) if dtypes else None, quick, repeats)
    spec = kernel_bench.catalogue_gpu(device, gpu)
    say = (lambda message: print(f"[calibrate] {message}", file=sys.stderr, flush=True)) if verbose else (
        lambda message: None)
    started = time.perf_counter()
    raw = kernel_bench.measure(settings, say)
    notes: list[str] = [] if device == "cuda" and not gpu else [
        kernel_bench.STAND_IN_NOTE if spec.name == "cpu" else f"datasheet figures: catalogue GPU {spec.name!r} (--gpu)"]
    if raw["timing"]["uncovered_blocks"]:
        notes.append(f"{raw['timing']['uncovered_blocks']} timed blocks outlasted their covering sleep: "
                     "those include host issue gaps")
    record = {"kind": device, "name": device_name(device), "num_threads": raw["timing"]["num_threads"]}
    document = kernel_bench.kernel_profile_document(raw, spec, record, notes)
    document["provenance"] = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__, "command": "ghpsim calibrate --kernels",
        "settings": settings.record(), "timing": raw["timing"], "total_s": time.perf_counter() - started,
        "derivation": "validator/kernel_bench.py, module docstring", "notes": notes}
    profile = profile_from_dict(document, str(out_path))
    write_json_atomic(out_path, profile_document(profile))
    for note in notes:
        say(f"note: {note}")
    say(f"wrote {out_path} in {document['provenance']['total_s']:.1f} s: "
        + ", ".join(f"{name} {value:.4g}" for name, value in profile.parameters.items()))
    return profile


def _settings_record(settings: CalibrationSettings) -> dict:
    """What a later calibration needs to measure the same (the profile's `provenance.settings`)."""
    return {"batch_sizes": list(settings.batch_sizes), "repeats": settings.repeats, "warmup": settings.warmup,
            "comm_sizes": list(settings.comm_sizes), "comm_repeats": settings.comm_repeats,
            "min_block_s": settings.min_block_s, "topk_densities": list(settings.topk_densities),
            "layer_passes": settings.layer_passes, "seed": settings.seed, "sweep_trials": settings.sweep_trials,
            "sweep_passes": settings.sweep_passes, "message_bytes": settings.message_bytes, "fsdp": settings.fsdp}


def _check(settings: CalibrationSettings, world_size: int, backend: str) -> None:
    if settings.device not in ("cpu", "cuda"):
        raise ScenarioError(f"device: expected cpu or cuda, got {settings.device!r}")
    for name, value, least in (("world_size", world_size, 1), ("repeats", settings.repeats, 1),
                               ("warmup", settings.warmup, 0), ("comm_repeats", settings.comm_repeats, 1),
                               ("layer_passes", settings.layer_passes, 1), ("sweep_trials", settings.sweep_trials, 1),
                               ("sweep_passes", settings.sweep_passes, 3), ("message_bytes", settings.message_bytes, 4)):
        if value < least:
            raise ScenarioError(f"{name}: {value} must be at least {least}")
    if len(set(settings.batch_sizes)) < 2 or min(settings.batch_sizes) < 1:
        raise ScenarioError(f"batch_sizes: need at least two distinct positive batch sizes, got {settings.batch_sizes}")
    if max(settings.batch_sizes) > MAX_CALIBRATION_BATCH:
        raise ScenarioError(f"batch_sizes: {max(settings.batch_sizes)} is larger than the {MAX_CALIBRATION_BATCH} "
                            "samples a calibration times (the fits extrapolate beyond the largest)")
    if len(set(settings.comm_sizes)) < 2 or min(settings.comm_sizes) < 4:
        raise ScenarioError(f"comm_sizes: need at least two distinct sizes of >= 4 bytes, got {settings.comm_sizes}")
    if settings.fsdp and world_size < 2:
        raise ScenarioError(f"world_size: {world_size}; timing FSDP (--fsdp) needs at least 2 ranks")
    problem = device_problem(settings.device, backend, world_size)
    if problem:
        raise ScenarioError(f"device {settings.device!r}, backend {backend!r}: {problem}")


def profile_fields(workload: Workload, model_params: dict, raw: dict, settings: CalibrationSettings,
                   world_size: int, backend: str, notes: list[str]) -> dict:
    """The profile document (without provenance) from the ranks' medians (`rank_main`); clamped
    fits are noted in `notes`."""
    layers, compute_slowdown = _layer_fits(workload, raw["layers"], settings.batch_sizes, world_size, notes,
                                           raw["layer_sweep"])
    counts = [item["num_params"] for item in raw["optimizer"]]
    update = _fit(counts, [item["median_s"] for item in raw["optimizer"]], notes, "optimizer")
    passes = {name: _fit(counts, [item[f"{name}_s"] for item in raw["weight_passes"]], notes, f"weight_passes.{name}")
              for name in WEIGHT_PASS_NAMES}
    document = {
        "format": FORMAT,
        "device": {"kind": settings.device, "name": raw["device_name"], "num_threads": raw["num_threads"]},
        "backend": backend,
        "world_size": world_size,
        "model": {"name": workload.name, "params": dict(model_params),
                  "layer_names": [layer.name for layer in workload.layers], "num_params": workload.num_params,
                  "forward_flops_per_sample": workload.forward_flops_per_sample},
        "layers": layers,
        "optimizer": {"name": settings.optimizer, "intercept_s": update.intercept, "per_param_s": update.slope},
        "weight_passes": {name: {"intercept_s": fit.intercept, "per_param_s": fit.slope} for name, fit in passes.items()},
        "topk": {density: _element_fit(items, notes, f"topk.{density}") for density, items in raw["topk"].items()},
        "allreduce": {g: _alpha_beta(settings.comm_sizes, item["times_s"], notes, f"allreduce.{g}")
                      for g, item in raw["allreduce"].items()},
        "allgather": {g: _alpha_beta(settings.comm_sizes, item["times_s"], notes, f"allgather.{g}")
                      for g, item in raw["allgather"].items()},
        "compute_slowdown": compute_slowdown,
    }
    wakeup = None
    if raw["p2p"] is not None:
        document["p2p"] = _alpha_beta(settings.comm_sizes, raw["p2p"], notes, "p2p")
        if raw.get("messages") is not None:
            overheads, wakeup = message_fields(raw["messages"], document["p2p"], notes)
            document["p2p"].update(overheads)
    if raw.get("fsdp") is not None:
        fits = {op: AlphaBeta(**document[op][world_size]).time_s for op in ("allgather", "allreduce")}
        document["fsdp"] = {**host_work(raw["fsdp"]["shapes"], world_size, fits["allgather"], fits["allreduce"]),
                            "layer_tensors": raw["fsdp"]["layer_tensors"]}
    if settings.device == "cpu":  # the ranks are processes sharing this host's cores
        document["shared_processors"] = _shared_processors(world_size, compute_slowdown, raw.get("overlap"))
        if wakeup is not None:
            document["shared_processors"]["wakeup_s"] = wakeup
    return document


def message_fields(messages: dict, p2p: dict, notes: list[str]) -> tuple[dict, float | None]:
    """From the message chain's summary (`validator.message_bench.message_summary`) and the idle
    p2p fit (`{latency_s, bandwidth_bytes_per_s}`): p2p's `{send_overhead_s, receive_overhead_s}`
    (the mean isend call, the mean ready receive), the wake-up delay (mean delay to a waiting rank
    - p2p(size) - o_s, >= 0; None without a waited message). A figure the chain could not time is
    left at 0 / out, with a note."""
    overheads = {"send_overhead_s": messages["send_call_mean_s"] or 0.0,
                 "receive_overhead_s": messages["ready_receive_mean_s"] or 0.0}
    for key, figure in (("send_overhead_s", "send_call_mean_s"), ("receive_overhead_s", "ready_receive_mean_s")):
        if messages[figure] is None:
            notes.append(f"p2p.{key}: the message chain timed no such message; left at 0")
    p2p_s = p2p["latency_s"] + messages["size_bytes"] / p2p["bandwidth_bytes_per_s"]
    wakeup = None
    if messages["delay_mean_s"] is None:
        notes.append("shared_processors.wakeup_s: the message chain timed no waited message; left at 0")
    else:
        wakeup = wakeup_s(messages["delay_mean_s"], p2p_s, overheads["send_overhead_s"])
    return overheads, wakeup


def _layer_fits(workload: Workload, by_level: dict, batch_sizes, world_size: int,
                notes: list[str], sweep: dict | None = None) -> tuple[list[dict], dict[int, float]]:
    """Per layer and phase the fit against the batch size of the all-ranks round's medians (mean
    over ranks) times the layer's sweep ratios (`sweep`: `{"forward_ratios", "backward_ratios"}`,
    per layer one per batch size; None: back to back); and compute_slowdown[k] = total of every
    back-to-back figure with k ranks at once / with one."""
    totals = {k: 0.0 for k in by_level}
    layers = []
    for index, layer in enumerate(workload.layers):
        entry = {"name": layer.name}
        for phase in ("forward", "backward"):
            for k, ranks in by_level.items():
                means = [sum(values) / len(values) for values in zip(*(rows[index][f"{phase}_s"] for rows in ranks))]
                totals[k] += sum(means)
                if k == world_size:
                    if sweep is not None:
                        means = in_sweep(means, sweep[f"{phase}_ratios"][index])
                    fit = _fit(batch_sizes, means, notes, f"layers[{index}].{phase}")
                    entry[phase] = {"intercept_s": fit.intercept, "per_sample_s": fit.slope}
        layers.append(entry)
    return layers, {k: (totals[k] / totals[1] if totals[1] > 0 else 1.0) for k in sorted(totals)}


def _shared_processors(world_size: int, compute_slowdown: dict[int, float], overlap: dict | None) -> dict:
    """P = W / compute_slowdown[W] ranks at full speed; the interference factors of `overlap`."""
    section = {"parallelism": world_size / compute_slowdown[world_size], "measured_ranks": world_size}
    if overlap:
        section["compute_slowdown_while"] = {kind: entry["compute_slowdown"] for kind, entry in overlap.items()}
        section["comm_slowdown_while_computing"] = {kind: entry["comm_slowdown"] for kind, entry in overlap.items()}
    return section


def _fit(xs, ys, notes: list[str], what: str, weights=None):
    fit = fit_line(xs, ys, weights)
    if fit.clamped:
        notes.append(f"{what}: {fit.clamped}")
    return fit


def _alpha_beta(sizes, times_s, notes: list[str], what: str) -> dict:
    fit = _fit(sizes, times_s, notes, what, weights=[1.0 / t ** 2 for t in times_s])
    if fit.slope <= 0:
        notes.append(f"{what}: time does not grow with size; bandwidth recorded as 1e30 B/s")
    return {"latency_s": fit.intercept, "bandwidth_bytes_per_s": 1.0 / fit.slope if fit.slope > 0 else 1e30}


def _element_fit(items: list[dict], notes: list[str], what: str) -> dict:
    medians = [item["median_s"] for item in items]
    fit = _fit([item["num_elements"] for item in items], medians, notes, what, weights=[1.0 / t ** 2 for t in medians])
    return {"intercept_s": fit.intercept, "per_element_s": fit.slope}


DISTURBED_SHARE = 0.1
"""Share of the machine's CPU time (wall time x CPUs) taken from the ranks, by other processes or by
a VM's host (steal), above which a calibration's figures are called distorted."""


def disturbance(profile: Profile) -> str | None:
    """Why a profile's figures are distorted, from the CPU accounting its calibration recorded
    (`provenance.background_cpu`: /proc/stat around the measurements), or None."""
    return disturbance_of(profile.provenance.get("background_cpu"))


def disturbance_of(background: dict | None) -> str | None:
    """`disturbance` of one `background_cpu` record. Seen on this project's VM: 196 s of steal in a
    204 s calibration of 4 ranks on 2 CPUs (48 % of the machine; a normal calibration has < 1 s),
    and the profile predicted its pipelines 2-3.7x too slow."""
    if not background or background["wall_s"] <= 0:
        return None
    problems = []
    if background["share_of_machine"] > DISTURBED_SHARE:
        problems.append(f"other processes used {100 * background['share_of_machine']:.0f}% of the machine's CPU time")
    steal_share = background.get("steal_s", 0.0) / (background["wall_s"] * background["num_cpus"])
    if steal_share > DISTURBED_SHARE:
        problems.append(f"the VM's host took {100 * steal_share:.0f}% of the machine's CPU time (steal)")
    return "; ".join(problems) or None


def calibrate_quietly(*args, attempts: int = 3, say=lambda message: print(message, file=sys.stderr),
                      **kwargs) -> Profile:
    """`calibrate(*args, **kwargs)` again, up to `attempts` times in all, while the machine was
    disturbed (`disturbance`); returns the last profile (its notes say if it is still disturbed).
    For benchmarks: a calibration taken while a VM's host held the CPUs is not this machine's."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        profile = calibrate(*args, **kwargs)
        problem = disturbance(profile)
        if problem is None:
            return profile
        say(f"[calibrate] attempt {attempt} of {attempts} disturbed: {problem}"
            + ("; calibrating again" if attempt < attempts else "; keeping it, with that note"))
    return profile


def _load_average() -> float | None:
    """The host's 1-minute load average (recorded: other processes distort CPU timings)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
