"""Why the calibration times the weight passes on one rank alone. Prints figures.

The asynchronous pipeline runtime's weight passes (stash, predict, accumulate, average:
`validator.weight_pass_bench`) are short, a few per cent of a micro-batch's cycle. Timed with all
ranks at once on a host with fewer cores than ranks, the median over blocks of cycles rarely
sees a preemption inside a pass, so it shows little of the time-sharing; the profile then
rescaled them to one rank alone by the layers' slowdown (compute_slowdown[W], ~2.1 for 4 ranks
on 2 cores) and kept 0.5-0.7x of their work. This benchmark times, on the same layer sets, each
pass (and the update, `validator.microbench.time_optimizer`) with all W ranks at once and with
rank 0 alone (the others at a barrier), in alternating rounds, and prints the ratio
all-at-once / alone per pass next to the layers' compute_slowdown[W] of the committed profile:
a pass whose ratio is below the layers' slowdown lost work when divided by it.

Run: python benchmarks/bench_weight_pass_sharing.py [--models resnet_cpu,mlp_cpu,transformer_cpu]
     [--ranks 4] [--rounds 2]
Reads reports/profiles/<model>_ws<W>_momentum.json for compute_slowdown (the pipeline benchmark's).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch.distributed as dist

from bench_pipeline_validation import pipeline_overrides
from simulator.model_source import resolve_workload
from simulator.profile import load_profile
from simulator.scenario import load_scenario
from validator.calibration_phases import _layer_sets, _parameter_sets
from validator.comm_bench import agree_max
from validator.launch import LaunchConfig, spawn
from validator.microbench import time_optimizer
from validator.models import build_modules, make_batch
from validator.weight_pass_bench import WEIGHT_PASSES, time_weight_passes

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet_cpu", "mlp_cpu", "transformer_cpu")


def _timings(modules, batch, coordinated: bool) -> dict:
    """Weight passes and updates over the calibration's layer sets (`coordinated`: every rank at once)."""
    sync = dict(barrier=dist.barrier, agree=agree_max) if coordinated else {}
    return {"passes": time_weight_passes(modules, _layer_sets(modules), batch, **sync),
            "update": time_optimizer("momentum", _parameter_sets(modules), **sync)}


def rank_main(rank: int, workload, micro_batch: int, rounds: int) -> list[tuple[dict, dict]]:
    modules = build_modules(workload, seed=0)
    batch, _targets = make_batch(workload, micro_batch, seed=0)
    pairs = []
    for round_index in range(rounds):  # alternate which comes first, so a drift hits both alike
        order = ("together", "alone") if round_index % 2 == 0 else ("alone", "together")
        timed = {}
        for mode in order:
            dist.barrier()
            if mode == "together":
                timed[mode] = _timings(modules, batch, coordinated=True)
            elif rank == 0:
                timed[mode] = _timings(modules, batch, coordinated=False)
            dist.barrier()
        pairs.append((timed.get("together"), timed.get("alone")))
    return pairs


def _ratios(pairs, key: str) -> tuple[float, float]:
    """Median over layer sets and rounds of together / alone, and the ratio of their sums."""
    per_set, together_s, alone_s = [], 0.0, 0.0
    for together, alone in pairs:
        rows = zip(together["update"], alone["update"]) if key == "update" else zip(together["passes"], alone["passes"])
        field = "median_s" if key == "update" else f"{key}_s"
        for a, b in rows:
            if b[field] <= 0:  # copy_forward is a difference of two forwards, clamped at 0
                continue
            per_set.append(a[field] / b[field])
            together_s, alone_s = together_s + a[field], alone_s + b[field]
    if not per_set:
        return float("nan"), float("nan")
    return statistics.median(per_set), together_s / alone_s


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.ranks} ranks at once over rank 0 alone (median over layer sets and rounds; ratio of the sums)")
    for name in args.models.split(","):
        scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml", pipeline_overrides(args.ranks))
        workload = resolve_workload(scenario.model, scenario.base_dir)
        micro_batch = scenario.training.global_batch_size // 4  # the pipeline benchmark's 4 micro-batches
        profile_path = ROOT / "reports" / "profiles" / f"{name}_ws{args.ranks}_momentum.json"
        slowdown = load_profile(profile_path).compute_slowdown.get(args.ranks) if profile_path.exists() else None
        config = LaunchConfig(world_size=args.ranks, backend="gloo", device="cpu", timeout_s=1800)
        pairs = spawn(rank_main, (workload, micro_batch, args.rounds), config)[0]
        layers = f"{slowdown:.2f}" if slowdown else "n/a (no profile)"
        print(f"\n{name} (micro-batch {micro_batch}): the layers' compute_slowdown[{args.ranks}] = {layers}")
        print(f"  {'pass':10s} {'median':>7s} {'sums':>6s}  share of the alone work kept by / slowdown")
        for key in (*WEIGHT_PASSES, "update"):
            median, of_sums = _ratios(pairs, key)
            kept = f"{of_sums / slowdown:.2f}" if slowdown else "n/a"
            print(f"  {key:10s} {median:7.2f} {of_sums:6.2f}  {kept}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
