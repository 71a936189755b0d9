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
   After every sweep, **whole-model passes** (`validator.pass_jitter_bench`): forward + backward
   of the whole model at the middle batch size, each after a barrier, all ranks at once; every
   pass's time on every rank goes into `pass_jitter` (how much a step's slowest rank is slower
   than the typical pass: `simulator.pass_jitter`), and, when all ranks share one host, each
   rank's exit from the pass's barrier after the first rank's (`start_offsets_s`).
2. **Optimizer, all ranks at once**: one update (step, then the gradients zeroed, as the runtimes
   do) over the parameters of each layer and of each prefix of layers (the stages a plan can
   have), fitted against the number of parameters; then, on the same sets, the asynchronous pipeline
   runtime's weight passes, **all ranks at once on a CPU host with a core per rank** (they share the
   memory bus), **rank 0 alone** where ranks outnumber cores or on a GPU (the others at a barrier:
   all at once, the block medians hid the time-sharing of these short passes;
   `validator.calibration_phases.weight_pass_ranks_at_once`; timed all at once, rank 0 alone
   too, kept as each fit's `alone`): stash, predict, repredict, accumulate, the replicas' gradient
   averaging and what a forward costs more on a weight copy than through the module (copy_forward)
   (`validator.weight_pass_bench`); each fit records its `ranks_at_once`. In the same cycles the
   backward on the copy over the backward through the modules (`copy_backward`, a median ratio:
   `simulator.copy_backward`).
   **Cold start**, all ranks at once (`validator.cold_bench`): every layer at the middle batch
   size and the update, each timed back to back and after a 50 ms pause, alternately; the ratios
   and the decay over shorter pauses (`simulator.cold_start`); on a CPU host no more ranks at
   once than it has cores. A layer's pass right after itself (between pauses) against an
   iteration of a back-to-back block timed in the same pair, the median difference over pairs:
   the profile's single-pass time per layer and phase (`validator.cold_bench.single_pass_overheads`).
   **Layer sweeps**, CPU only, no more ranks at once than cores (`validator.sweep_bench`): each layer's forward
   and backward inside whole-model sweeps against the same passes back to back, per batch size:
   the caches the other layers of a step refill (`layer_sweep`, `ProfileCosts.compute_s`).
3. **p2p**: ping-pong between ranks 0 and 1 (one-way = half the round trip).
4. **allreduce**: for every divisor g >= 2 of world_size, the world is cut into world_size / g
   groups of consecutive ranks (`new_group`) that all allreduce at the same time (as the
   concurrent groups of a GHP/DP plan do); each group's median (of the slowest member) is
   averaged over groups.
   p2p, allreduce and allgather (5.) are timed after every layer sweep, and each median (per kind,
   group size and message size) is the median over the sweeps, as the layers' figures
   (`validator.layer_passes.median_comm_over_passes`; the spread: `method.comm_passes`).
6. **Overlap** (CPU, world_size >= 2; `validator.overlap_bench`): compute steps (the layers'
   forward + backward at the middle batch size) alone, a stream of asynchronous allreduces (or of
   point-to-point messages between rank pairs) alone, and both at once, all ranks together:
   compute's and communication's slowdowns when they overlap on the shared cores
   (`simulator.host_sharing`). Then **handoff** (CPU and GPU, world_size >= 2;
   `validator.handoff_bench`, on a GPU with the messages staged through the host): messages passed
   along a chain of all ranks computing between hops; the mean delay from send to the end of a
   waiting receiver's `wait()`, with receives posted on demand (`ProfileCosts.handoff_s`) and
   posted one ahead as the pipeline runtime does (`ProfileCosts.handoff_preposted_s`); then the
   same pre-posted figures with every rank in the asynchronous 1F1B cycle at once (`handoff.cycle`,
   `ProfileCosts.asynchronous_messages`: what PipeDream and SpecTrain pay per message, and on a
   shared host 1F1B and interleaved 1F1B too); then the same figures timed inside the pipeline
   runtime running PipeDream on a synthetic MLP (`handoff.runtime`,
   `validator.runtime_messages_bench`; what asynchronous plans pay per message where each rank has
   a core, `ProfileCosts.runtime_messages`); then, on a CPU, the layers inside that cycle's compute
   windows against the processor sharing the engine would give them (`cycle_compute`,
   `validator.cycle_compute_bench`; where ranks outnumber cores, the factor on asynchronous compute,
   `ProfileCosts.asynchronous_compute_factor`, and the pool's parallelism with all ranks computing,
   `ProfileCosts.pool_curve`); then, on every device, each asynchronous kind's stage loop through
   the pipeline runtime without messages, in turns with 1F1B's (`stage_loops`,
   `validator.stage_loop_bench`; after the document is built, the engine plays the same loops on it
   for the section's model half, `simulator.stage_loop`).
5. **Top-k** (sparse gradients, `simulator.sparse`): the runtime's selection with error feedback
   (`validator.microbench.time_topk`) on flat gradients of 4096 x 4^j elements up to the model's
   parameter count, all ranks at once, at each density of `topk_densities` (fitted against the
   element count, least squares weighted by 1 / t^2); and **allgather** per group size as the
   allreduce above (sizes = bytes each rank contributes).

Communication times are fitted to alpha + S / beta by least squares weighted by 1 / t^2 (i.e.
relative errors, so the small sizes pin alpha and the large ones beta). Nothing is timed end to
end: no training step enters a fit. The profile format: `simulator.profile.PROFILE_FORMAT`.
Before it is written, the document is loaded as the simulator will load it
(`validator.calibration_document.loadable_document`): an optional `cycle_compute`, `copy_backward` or
`stage_loops` section whose ratio the loader finds implausible (a rank stalled mid-measurement) is left out with a
note naming the field and value; any other refusal stops the calibration, and no file is written.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from simulator.output import write_json_atomic
from simulator.stage_loop import stage_loops_section
from simulator.workload import Workload
from validator.calibration_document import build_document, loadable_document
from validator.calibration_phases import DEFAULT_TOPK_DENSITIES, CalibrationSettings, load_average, rank_main
from validator.comm_device import default_backend, device_problem
from validator.launch import LaunchConfig, spawn
from validator.layer_passes import DEFAULT_LAYER_PASSES
from validator.microbench import DEFAULT_MIN_BLOCK_S
from validator.pass_jitter_bench import DEFAULT_JITTER_PASSES

DEFAULT_BATCH_SIZES = (4, 16, 64)
"""Batch sizes each layer is timed at (per rank): spans the micro-batches of small validated runs."""
DEFAULT_REPEATS = 7
DEFAULT_WARMUP = 2
DEFAULT_COMM_SIZES = tuple(4096 * 4 ** k for k in range(7))
"""4 KiB, 16 KiB, ..., 16 MiB: log-spaced message / allreduce buffer sizes in bytes."""
DEFAULT_COMM_REPEATS = 10


def calibrate(workload: Workload, model_params: dict, out_path, device: str = "cpu", world_size: int = 2,
              batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, repeats: int = DEFAULT_REPEATS,
              backend: str | None = None, *, optimizer: str = "sgd", warmup: int = DEFAULT_WARMUP,
              comm_sizes: Sequence[int] = DEFAULT_COMM_SIZES, comm_repeats: int = DEFAULT_COMM_REPEATS,
              num_threads: int = 1, models: str = "validator.models", seed: int = 0,
              min_block_s: float = DEFAULT_MIN_BLOCK_S, timeout_s: float = 1800.0, verbose: bool = True,
              topk_densities: Sequence[float] = DEFAULT_TOPK_DENSITIES,
              layer_passes: int = DEFAULT_LAYER_PASSES, jitter_passes: int = DEFAULT_JITTER_PASSES) -> dict:
    """Measure `workload` on `world_size` local ranks, write the profile to `out_path` atomically
    and return it. `models` names the module with `build_modules`, `make_batch` and `loss_fn`;
    `topk_densities` the densities of the top-k selection fits; `layer_passes` the sweeps over the
    layers, spread over the calibration (`validator.layer_passes`); `jitter_passes` the whole-model
    passes timed after each sweep (`validator.pass_jitter_bench`; 0: none)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    backend = backend or default_backend(device)
    problem = device_problem(device, backend, world_size)
    if problem:
        raise ValueError(f"device {device!r}, backend {backend!r}: {problem}")
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if layer_passes < 1:
        raise ValueError(f"layer_passes must be >= 1, got {layer_passes}")
    if jitter_passes < 0:
        raise ValueError(f"jitter_passes must be >= 0, got {jitter_passes}")
    batch_sizes = tuple(int(b) for b in batch_sizes)
    if len(set(batch_sizes)) < 2 or min(batch_sizes) < 1:
        raise ValueError(f"need at least two distinct positive batch sizes, got {batch_sizes}")
    settings = CalibrationSettings(workload, batch_sizes, repeats, warmup, device, optimizer, tuple(comm_sizes),
                         comm_repeats, models, seed, verbose, min_block_s,
                         tuple(sorted({float(d) for d in topk_densities})), layer_passes,
                         jitter_passes)
    config = LaunchConfig(world_size=world_size, backend=backend, device=device, timeout_s=timeout_s,
                          collective_timeout_s=max(60.0, timeout_s / 2), num_threads=num_threads)
    started = time.perf_counter()
    load_before = load_average()
    if verbose and load_before is not None and load_before > (os.cpu_count() or 1):
        print(f"[calibrate] warning: the 1-minute load average is {load_before:.2f} on {os.cpu_count()} CPUs; "
              "other processes will distort the timings", file=sys.stderr)
    raw = spawn(rank_main, (settings,), config)[0]
    background = raw["background_cpu"]
    document = build_document(workload, model_params, raw, world_size=world_size, device=device,
                              backend=backend, batch_sizes=batch_sizes, optimizer=optimizer,
                              comm_sizes=settings.comm_sizes, repeats=repeats, comm_repeats=comm_repeats,
                              min_block_s=min_block_s, layer_passes=layer_passes)
    document["method"]["total_s"] = time.perf_counter() - started
    document["method"]["settings"] = {  # what a later calibration needs to measure the same (validator.bracket)
        "batch_sizes": list(batch_sizes), "repeats": repeats, "warmup": warmup, "comm_sizes": list(settings.comm_sizes),
        "comm_repeats": comm_repeats, "min_block_s": min_block_s, "topk_densities": list(settings.topk_densities),
        "layer_passes": layer_passes, "jitter_passes": jitter_passes, "num_threads": num_threads}
    document["method"]["load_average_1m"] = {"before": load_before, "after": load_average(),
                                             "num_cpus": os.cpu_count()}
    if background is not None:
        document["method"]["background_cpu"] = background
        problem = disturbance(document)
        if problem:
            document["notes"].append(f"{problem} during the calibration: compute and comm figures are distorted; "
                                     "recalibrate on a quiet machine")
    document = loadable_document(document, str(out_path))
    if raw.get("stage_loops"):  # the model's half needs the rest of the profile (`simulator.stage_loop`)
        document["stage_loops"] = stage_loops_section(document, workload, raw["stage_loops"])
        document = loadable_document(document, str(out_path))
    if verbose:
        for note in document["notes"]:
            print(f"[calibrate] note: {note}", file=sys.stderr)
    write_json_atomic(out_path, document)
    if verbose:
        print(f"[calibrate] wrote {out_path} in {document['method']['total_s']:.1f} s", file=sys.stderr)
    return document


DISTURBED_SHARE = 0.1
"""Share of the machine's CPU time (wall time x CPUs) taken from the ranks, by other processes or by
a VM's host (steal), above which a calibration's figures are called distorted."""


def disturbance(document: dict) -> str | None:
    """Why a profile's figures are distorted, from the CPU accounting its calibration recorded
    (`method.background_cpu`: /proc/stat around the measurements), or None. Seen on this project's
    VM: 196 s of steal in a 204 s calibration of 4 ranks on 2 CPUs (48 % of the machine; a normal
    calibration has < 1 s); its cold-start pairs timed a 2 ms backward pass at 41 ms, and the
    profile predicted its pipelines 2-3.7x too slow."""
    background = document.get("method", {}).get("background_cpu")
    if not background or background["wall_s"] <= 0:
        return None
    capacity_s = background["wall_s"] * background["num_cpus"]
    problems = []
    if background["share_of_machine"] > DISTURBED_SHARE:
        problems.append(f"other processes used {100 * background['share_of_machine']:.0f}% of the machine's CPU time")
    steal_share = background.get("steal_s", 0.0) / capacity_s
    if steal_share > DISTURBED_SHARE:
        problems.append(f"the VM's host took {100 * steal_share:.0f}% of the machine's CPU time (steal)")
    return "; ".join(problems) or None


def calibrate_quietly(*args, attempts: int = 3, say=lambda message: print(message, file=sys.stderr), **kwargs) -> dict:
    """`calibrate(*args, **kwargs)` again, up to `attempts` times in all, while the machine was
    disturbed (`disturbance`); returns the last profile (its notes say if it is still disturbed).
    For benchmarks: a calibration taken while a VM's host held the CPUs is not this machine's."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        document = calibrate(*args, **kwargs)
        problem = disturbance(document)
        if problem is None:
            return document
        say(f"[calibrate] attempt {attempt} of {attempts} disturbed: {problem}"
            + ("; calibrating again" if attempt < attempts else "; keeping it, with that note"))
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
