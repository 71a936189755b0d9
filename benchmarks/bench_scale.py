"""Scale benchmark (issue 73): one training step of large Megatron-style runs. Prints, per case, the
median of --repeats runs (wall and CPU seconds, engine seconds, events, peak resident memory), each
run in a fresh process so its memory is its own; the machine is shared, so CPU seconds are printed
beside the wall and ratios to the targets too.

Folded (simulator/symmetry.py: one rank per pipeline stage), GPT-3 175B TP8 x PP8 x DP256 on
16,384 A100 (2,048 DGX nodes, batch 96 per replica), on every preset fabric: target <= 2 s each.
fat_tree with the default k (64: the smallest with k^3/4 >= 16,384 NICs and a power of two of whole
nodes under each edge switch) and with k = 48 (3 nodes a switch). LLaMA-3 405B as Meta laid it out
on 16,384 H100 (TP8 x PP16 x DP128, `scenarios/llama3_405b_4d_h100.yaml` without CP) on the default
fat-tree: each replica 16 nodes, folded (target <= 2 s).
1T GPT (128 layers, hidden 25,600, 160 heads) on 3,072 GPUs, TP8 x PP64 x DP6, 512 micro-batches
per replica, rail_optimized, folded (and its steady state extended, simulator/steady_extension.py):
target <= 5 s.
GPT-3 175B on 1,024 GPUs (scenarios/gpt3_175b_dgx_a100_3d.yaml) folded (target <= 1 s), and in full
(strategy.symmetry=off, 1,024 ranks): target <= 20 s and <= 1 GB, and engine seconds per event <= 3x
a bare SimPy loop of as many events (one process yielding N timeouts). Events are the engine's:
SimPy events processed plus action completions (simulator/engine.py); the full run's step time must
equal the folded one's. The same with one device 1.3x slow (`cluster.stragglers`): the symmetry is
broken, so every rank is simulated (target <= 20 s, as a full run). Engine seconds are every engine
run's (a short steady-state attempt and the summary's single-device run included); the ratio per
event is that of the run with the most events, the step's.

GPipe on the demo's cluster (VGG16, 16 V100 in 4 nodes over 10 GbE, one stage a GPU) with 4,096
micro-batches of one sample: thousands of sends of one stage pair queue on the same links at once.
Target <= 20 s, as a full run (flows alike share one rate: simulator/network.py).

Run: python benchmarks/bench_scale.py [--repeats 3] [--full-repeats 3] [--skip-full] [--only TEXT]
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time
from pathlib import Path

import simpy

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "scenarios" / "gpt3_175b_dgx_a100_3d.yaml"
DEMO = ROOT / "scenarios" / "demo.yaml"


def gpt3_16k(fabric: str, *extra: str) -> list[str]:
    return ["cluster.num_nodes=2048", f"cluster.topology={fabric}", "training.global_batch_size=24576", *extra]


GPT_1T = ["model.params.num_layers=128", "model.params.hidden_size=25600", "model.params.num_heads=160",
          "cluster.num_nodes=384", "cluster.topology=rail_optimized", "strategy.pp_degree=64",
          "strategy.num_microbatches=512", "training.global_batch_size=3072"]
LLAMA3_16K = [f"scenario={ROOT / 'scenarios' / 'llama3_405b_4d_h100.yaml'}", "cluster.topology=fat_tree",
              "strategy.cp_degree=1", "strategy.num_microbatches=16"]
CASES = (
    ("GPT-3 16,384 GPUs two_tier, folded", gpt3_16k("two_tier"), 2.0),
    ("GPT-3 16,384 GPUs rail_optimized, folded", gpt3_16k("rail_optimized"), 2.0),
    ("GPT-3 16,384 GPUs torus_2d, folded", gpt3_16k("torus_2d"), 2.0),
    ("GPT-3 16,384 GPUs fat_tree k=48, folded", gpt3_16k("fat_tree", "cluster.fat_tree_k=48"), 2.0),
    ("GPT-3 16,384 GPUs fat_tree default k", gpt3_16k("fat_tree"), 2.0),
    ("LLaMA-3 405B 16,384 GPUs TP8 x PP16 x DP128 fat_tree, folded", LLAMA3_16K, 2.0),
    ("1T GPT 3,072 GPUs TP8 x PP64 x DP6, folded", GPT_1T, 5.0),
    ("GPT-3 1,024 GPUs, folded", [], 1.0),
    ("GPT-3 1,024 GPUs, full", ["strategy.symmetry=off"], 20.0),
    ("GPT-3 1,024 GPUs, one 1.3x straggler (not folded)", ["cluster.stragglers={5: 1.3}"], 20.0),
    ("GPipe 4,096 micro-batches, 16 stages over 10 GbE", [f"scenario={DEMO}", "strategy.kind=gpipe",
     "strategy.num_groups=1", "strategy.num_microbatches=4096", "training.global_batch_size=4096"], 20.0),
)
FULL_RUNS = ("strategy.symmetry=off", "cluster.stragglers={5: 1.3}")
"""Overrides of the cases that simulate every rank (--skip-full, --full-repeats)."""


def bare_simpy_s(num_events: int) -> float:
    """Wall seconds for SimPy alone to process `num_events` events (one process, N timeouts)."""
    env = simpy.Environment()

    def ticker():
        for _ in range(num_events - 1):  # + the process's initialisation event
            yield env.timeout(1.0)

    env.process(ticker())
    started = time.perf_counter()
    env.run()
    return time.perf_counter() - started


def one_run(overrides: list[str]) -> dict:
    """One simulate() in this (fresh) process: its figures, or the one-line error it refused with."""
    from simulator import load_scenario, simulate
    from simulator.engine import Engine
    from simulator.errors import ScenarioError
    engine = {"s": 0.0, "step_s": 0.0, "step_events": 0}
    run = Engine.run

    def timed_run(self):
        """Times every engine run; the step's own is the one with the most events (simulate also
        plays a small single-device run for the summary's speedup)."""
        started = time.perf_counter()
        result = run(self)
        seconds = time.perf_counter() - started
        engine["s"] += seconds
        if result.num_events > engine["step_events"]:
            engine["step_s"], engine["step_events"] = seconds, result.num_events
        return result

    Engine.run = timed_run
    path = PRESET
    if overrides and overrides[0].startswith("scenario="):
        path, overrides = Path(overrides[0].removeprefix("scenario=")), overrides[1:]
    scenario = load_scenario(path, overrides)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        summary = simulate(scenario).summary
    except ScenarioError as error:
        return {"error": str(error), "wall_s": time.perf_counter() - wall}
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "engine_s": engine["s"],
            "engine_step_s": engine["step_s"],
            "events": summary["num_events"], "step_time_s": summary["step_time_s"],
            "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
            "symmetry": summary.get("tensor", {}).get("symmetry", {"used": False, "reason": "not a tensor plan"}),
            "mfu": summary["mfu"],
            "steady_state": summary.get("steady_state", "every micro-batch simulated")}


def measure(overrides: list[str], repeats: int) -> list[dict]:
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        return [pool.apply(one_run, (overrides,)) for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-repeats", type=int, default=3)
    parser.add_argument("--skip-full", action="store_true", help="skip the runs of every one of 1,024 ranks")
    parser.add_argument("--only", default="", help="run only the cases whose label contains this text")
    args = parser.parse_args()
    steps = {}
    for label, overrides, target_s in CASES:
        full = any(override in FULL_RUNS for override in overrides)
        if (full and args.skip_full) or args.only not in label:
            continue
        runs = measure(overrides, args.full_repeats if full else args.repeats)
        if "error" in runs[0]:
            print(f"{label}: refused in {statistics.median(r['wall_s'] for r in runs):.2f} s: {runs[0]['error']}")
            continue
        median = {key: statistics.median(r[key] for r in runs)
                  for key in ("wall_s", "cpu_s", "engine_s", "engine_step_s", "rss_bytes")}
        last = runs[-1]
        bare = statistics.median(bare_simpy_s(last["events"]) for _ in range(3))
        steps[label] = last["step_time_s"]
        print(f"{label}: median wall {median['wall_s']:.2f} s (target <= {target_s:g} s, ratio "
              f"{median['wall_s'] / target_s:.2f}), CPU {median['cpu_s']:.2f} s | engine {median['engine_s']:.2f} s, "
              f"{last['events']:,} events, {median['engine_step_s'] / last['events'] * 1e6:.2f} us an event, "
              f"x{median['engine_step_s'] / bare:.1f} a bare SimPy loop of as many ({bare:.2f} s, "
              f"{bare / last['events'] * 1e6:.2f} us) | peak RSS {median['rss_bytes'] / 2**30:.2f} GiB | step {last['step_time_s']:.6f} s, "
              f"MFU {last['mfu']:.1%} | folded: {last['symmetry']['used']} ({last['symmetry']['reason']}) | "
              f"{last['steady_state']}")
    folded, full = steps.get("GPT-3 1,024 GPUs, folded"), steps.get("GPT-3 1,024 GPUs, full")
    if folded is not None and full is not None:
        print(f"folded vs full step time (1,024 GPUs): {folded!r} vs {full!r}, relative difference "
              f"{abs(folded - full) / full:.1e}")


if __name__ == "__main__":
    main()
