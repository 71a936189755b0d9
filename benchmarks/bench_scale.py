"""Scale benchmark (issue: scale): GPT-3 175B with Megatron 3D parallelism, one training step.

(a) TP 8 x PP 8 x DP 16 = 1024 A100 (scenarios/gpt3_175b_dgx_a100_3d.yaml), symmetric run
    (one rank per stage simulated, simulator/symmetry.py). Target < 1 s.
(b) the same with DP 128 = 8192 GPUs (1024 nodes, global batch x 8 so each replica keeps its
    96 micro-batches; k = 32 fat-tree). Target < 10 s.
(c) (a) simulated in full (strategy.symmetry off: 1024 ranks). Target < 60 s; its step time must
    equal (a)'s.
Peak memory: the process's maximum resident set size after each case (cases run in increasing
size, so the last figure is the peak of the largest), target < 2 GB. Events per second: engine
events / simulate() wall; the overhead factor is the engine's wall over a bare SimPy loop that
processes the same number of events (one process yielding N timeouts). Medians of --repeats
runs; the machine is shared, so ratios to the targets are printed too.

Run: python benchmarks/bench_scale.py [--repeats 3] [--full-repeats 1] [--skip-full]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import simpy

from simulator import load_scenario, simulate
from simulator.engine import Engine

PRESET = Path(__file__).resolve().parents[1] / "scenarios" / "gpt3_175b_dgx_a100_3d.yaml"
CASES = (
    ("(a) GPT-3 175B TP8 x PP8 x DP16, 1024 GPUs, symmetric", [], 1.0),
    ("(b) GPT-3 175B TP8 x PP8 x DP128, 8192 GPUs, symmetric",
     ["cluster.num_nodes=1024", "training.global_batch_size=12288"], 10.0),
    ("(c) GPT-3 175B TP8 x PP8 x DP16, 1024 GPUs, full", ["strategy.symmetry=off"], 60.0),
)


class EngineTimer:
    """Wall seconds spent in Engine.run (wrapped for the benchmark only)."""

    def __init__(self):
        self.seconds = 0.0
        self._run = Engine.run
        timer = self

        def timed_run(engine):
            started = time.perf_counter()
            try:
                return timer._run(engine)
            finally:
                timer.seconds += time.perf_counter() - started

        Engine.run = timed_run


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


def peak_rss_bytes() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB


def measure(overrides, repeats: int, timer: EngineTimer):
    walls, engine_walls, summary = [], [], None
    for _ in range(repeats):
        scenario = load_scenario(PRESET, overrides)
        timer.seconds = 0.0
        started = time.perf_counter()
        summary = simulate(scenario).summary
        walls.append(time.perf_counter() - started)
        engine_walls.append(timer.seconds)
    return statistics.median(walls), statistics.median(engine_walls), summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-repeats", type=int, default=1)
    parser.add_argument("--skip-full", action="store_true", help="skip case (c)")
    args = parser.parse_args()
    timer = EngineTimer()
    steps = {}
    for label, overrides, target_s in CASES:
        full = "strategy.symmetry=off" in overrides
        if full and args.skip_full:
            continue
        wall, engine_wall, summary = measure(overrides, args.full_repeats if full else args.repeats, timer)
        events = summary["num_events"]
        bare = statistics.median(bare_simpy_s(events) for _ in range(3))
        steps[label] = summary["step_time_s"]
        symmetry = summary["tensor"]["symmetry"]
        print(f"{label}: median wall {wall:.3f} s (target < {target_s:g} s, ratio {wall / target_s:.2f}) | "
              f"engine {engine_wall:.3f} s | {events:,} events, {events / wall:,.0f} events/s | bare SimPy "
              f"{bare:.3f} s for as many events, engine overhead x{engine_wall / bare:.1f}, whole simulate "
              f"x{wall / bare:.1f} | peak RSS so far {peak_rss_bytes() / 2**30:.2f} GiB (target < 2 GB) | "
              f"step {summary['step_time_s']:.3f} s, MFU {summary['mfu']:.1%}, "
              f"{summary['achieved_tflops_per_gpu']:.1f} TFLOP/s per GPU, "
              f"simulated ranks: {'one per stage' if symmetry['used'] else 'all'}")
    if len(steps) == 3:
        (_, a), _, (_, c) = steps.items()
        print(f"symmetric vs full step time (1024 GPUs): {a!r} vs {c!r}, relative difference {abs(a - c) / c:.1e}")


if __name__ == "__main__":
    main()
