"""Where a pipeline's CPU time goes on a shared CPU host: measured per-phase CPU seconds inside real
runs against the work the simulator plays for the same phases. Prints figures.

The validation benchmarks compare step times; a step-time error mixes two things: the work of
each pass (core-seconds at one rank alone) and how the passes share the cores (the engine's
processor-sharing pool, `simulator.host_sharing`). This benchmark separates them. Each rank of a
real run (`validator.measure.run_rank`, the runtime of `validator.pipeline_runtime`) records, per
action kind (forward, backward, update, stash, predict, accumulate, send, recv), the CPU time of
its main thread (`time.thread_time`: the time it ran on a core, not the time it waited for one)
and the wall time; and per step its process CPU time (all threads: gloo's too). The simulator's
work per phase is the same plan played with the profile's costs on unshared cores (so each
compute span lasts its work). Both are per micro-batch, summed over
ranks. The cores' busy share is the ranks' process CPU time over the step's wall time: near the
host's parallelism P, the schedule kept every core busy; below it, ranks waited for each other.

This is how the double-counted sharing of the update and weight passes was found (2026-11,
commit 1dc0942: an MLP stage's update measured 0.5x the work predicted, 1 / compute_slowdown[4]).
Warm-up steps count too (their actions are timed like the others).

Run: python benchmarks/bench_pipeline_cpu_time.py [--models resnet_cpu,mlp_cpu] [--stages 4]
     [--kinds 1f1b,pipedream,spectrain] [--launches 2]
Uses the committed profiles reports/profiles/<model>_ws<p>_momentum.json (calibrates when absent).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench_pipeline_validation import VIRTUAL_STAGES, pipeline_overrides, pipeline_profile
from simulator.engine import Engine
from simulator.fabrics import build_topology
from simulator.model_source import resolve_workload
from simulator.plan import Compute
from simulator.scenario import load_scenario
from simulator.simulate import engine_costs
from validator.launch import LaunchConfig, spawn
from validator.measure import RunOptions, run_rank
from simulator.profile_costs import profile_costs
from validator.validate import prepare_case

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp_cpu", "resnet_cpu", "transformer_cpu")


def timed_rank(rank: int, plan, workload, options: RunOptions) -> dict:
    """`run_rank` with every action handler of the pipeline runtime timed (main-thread CPU and
    wall seconds per action kind) and every step's process CPU time recorded."""
    import validator.pipeline_runtime as runtime

    cpu_s, wall_s, calls = defaultdict(float), defaultdict(float), defaultdict(int)
    steps = []

    def timed(handler, kind_of):
        def run(executor, action):
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            handler(executor, action)
            kind = kind_of(action)
            cpu_s[kind] += time.thread_time() - cpu0
            wall_s[kind] += time.perf_counter() - wall0
            calls[kind] += 1
        return run

    executor = runtime.PipelineExecutor  # the runtime calls its handlers by name (`HANDLERS`)
    executor._compute = timed(executor._compute, lambda action: action.phase)
    executor._recv = timed(executor._recv, lambda action: "recv")
    executor._send = timed(executor._send, lambda action: "send")
    step = runtime.PipelineExecutor.step

    def timed_step(executor, index):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        spans = step(executor, index)
        steps.append((time.perf_counter() - wall0, time.process_time() - cpu0))
        return spans

    runtime.PipelineExecutor.step = timed_step
    result = run_rank(rank, plan, workload, options)
    result.update(cpu_s=dict(cpu_s), wall_s=dict(wall_s), calls=dict(calls), steps=steps)
    return result


def predicted_work_s(case, costs, scenario) -> dict[str, float]:
    """Seconds of work per compute phase of the case's run plan, all ranks: the plan played on
    unshared processors (`shared_processors` None), so each compute span lasts its work."""
    costs = copy.copy(engine_costs(case.plan, costs))
    costs.shared_processors = None
    topology = build_topology(scenario.cluster)
    spans = Engine(case.plan, topology, costs, scenario.strategy.num_parameter_servers).run().spans
    work = defaultdict(float)
    for span in spans:
        if span[1] == "compute":
            work[span[3]] += span[5] - span[4]
    return dict(work)


def microbatches_per_run_step(plan) -> int:
    """Micro-batches one `executor.step` runs: the plan's distinct micro-batch indices."""
    return len({a.microbatch for actions in plan.actions for a in actions
                if isinstance(a, Compute) and a.microbatch is not None and a.microbatch >= 0})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--kinds", default="1f1b,pipedream,spectrain")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    p = args.stages
    for name in args.models.split(","):
        scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                                 pipeline_overrides(p) + [VIRTUAL_STAGES])
        workload = resolve_workload(scenario.model, scenario.base_dir)
        profile = pipeline_profile(name, p)
        if not profile.exists():
            from validator.calibrate import calibrate_quietly
            calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=p,
                              optimizer="momentum", verbose=False)
        costs = profile_costs(str(profile), workload, optimizer="momentum")
        options = RunOptions(steps=args.steps, warmup=2, optimizer="momentum")
        cases = [prepare_case(scenario, workload, costs, f"{kind}:{args.microbatches}", None, options)
                 for kind in args.kinds.split(",")]
        launches = defaultdict(list)
        for _ in range(args.launches):  # in rounds, so that every kind meets the same spells
            for case in cases:
                launches[case.kind].append(spawn(timed_rank, (case.plan, workload, case.run_options),
                                                 LaunchConfig(world_size=case.plan.num_ranks)))
        parallelism = costs.shared_processors.parallelism if costs.shared_processors else float("nan")
        print(f"\n{name} p={p} (P = {parallelism:.2f} cores): ms per micro-batch, summed over ranks")
        for case in cases:
            report(case, predicted_work_s(case, costs, scenario), launches[case.kind], options)
    return 0


def report(case, work_s: dict[str, float], launches: list[list[dict]], options: RunOptions) -> None:
    per_step = microbatches_per_run_step(case.plan)
    run_steps = len(launches) * (options.warmup + options.steps)
    microbatches = run_steps * per_step
    cpu_s, wall_s = defaultdict(float), defaultdict(float)
    for ranks in launches:
        for result in ranks:
            for kind, seconds in result["cpu_s"].items():
                cpu_s[kind] += seconds
                wall_s[kind] += result["wall_s"][kind]
    measured = [result["step_times_s"] for ranks in launches for result in ranks[:1]]
    step_s = statistics.median(s for steps in measured for s in steps)
    busy = statistics.median(sum(result["steps"][i][1] for result in ranks) / ranks[0]["steps"][i][0]
                             for ranks in launches for i in range(options.warmup, len(ranks[0]["steps"])))
    print(f"  {case.kind:20s} step measured {step_s * 1e3:6.1f} ms, predicted {case.predicted.step_time_s * 1e3:6.1f} ms;"
          f" cores busy {busy:.2f} (process CPU over wall)")
    print(f"  {'':20s} {'phase':10s} {'measured CPU':>12s} {'(wall)':>8s} {'predicted work':>15s} {'ratio':>6s}")
    for kind in sorted(set(cpu_s) | set(work_s), key=lambda k: -cpu_s.get(k, 0.0)):
        cpu_ms = 1e3 * cpu_s.get(kind, 0.0) / microbatches
        work_ms = 1e3 * work_s.get(kind, 0.0) / per_step if kind in work_s else float("nan")
        ratio = cpu_ms / work_ms if work_ms and work_ms == work_ms else float("nan")
        print(f"  {'':20s} {kind:10s} {cpu_ms:12.2f} {1e3 * wall_s.get(kind, 0.0) / microbatches:8.2f}"
              f" {work_ms:15.2f} {ratio:6.2f}")


if __name__ == "__main__":
    sys.exit(main())
