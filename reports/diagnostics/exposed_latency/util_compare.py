"""Back to back in one launch of W ranks (nineteenth session): the share of time each rank computes
in the middle half of a run (busy / elapsed), in
(a) the calibration's asynchronous 1F1B cycle (`validator.handoff_bench.run_cycle`, the ResNet's
    layer steps, its window from `stage_hop_compute_s`, 24 micro-batches; median of 4 runs),
(b) the pipeline runtime running PipeDream's steady-state plan of the ResNet-20 (the validated case;
    median over 8 steps after 2 warm-up ones),
(c) the same runtime on a synthetic MLP that is not in the validation set (hidden 768, 8 layers).
In an asynchronous 2-stage 1F1B every micro-batch pays its two messages' latency on the critical
loop, so 1 - utilisation is what messages cost there. Prints one line per round. Writes nothing.

    python reports/diagnostics/exposed_latency/util_compare.py WORLD ROUNDS
"""

import statistics
import sys

import torch
import torch.distributed as dist

from simulator.compare import with_strategy
from simulator.model_source import resolve_workload
from simulator.profile_costs import profile_costs
from simulator.scenario import load_scenario
from simulator.schedules.steady_state import steady_state_plan
from simulator.simulate import analytic_costs
from simulator.topology import build_topology
from validator.handoff_bench import run_cycle, stage_hop_compute_s
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps
from validator.pipeline_runtime import PipelineExecutor

PROFILES = "reports/diagnostics/cycle_steps/first_run/profiles"


def pipedream_plan(path: str, overrides: list[str], profile: str | None):
    scenario = load_scenario(path, overrides)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    variant = with_strategy(scenario, "pipedream:4", None)
    costs = profile_costs(profile, workload) if profile else analytic_costs(variant, workload)
    return steady_state_plan(variant, workload, build_topology(variant.cluster), costs), workload


def middle_utilisation(intervals: list[tuple[float, float]]) -> float:
    intervals = sorted(intervals)
    middle = intervals[len(intervals) // 4: 3 * len(intervals) // 4]
    return sum(end - start for start, end in middle) / (middle[-1][1] - middle[0][0])


def runtime_utilisation(rank: int, plan, workload, steps: int = 8, warmup: int = 2) -> float:
    executor = PipelineExecutor(plan, workload, rank, "momentum", 0.01, 0, "cpu")
    shares = []
    for step in range(warmup + steps):
        executor.load_batch(step)
        dist.barrier()
        spans = executor.step(step)
        if step >= warmup:
            shares.append(middle_utilisation([(span[4], span[5]) for span in spans if span[1] == "compute"]))
    return statistics.median(shares)


def rank_main(rank: int, world: int, rounds: int) -> list[dict]:
    overrides = [f"cluster.gpus_per_node={world}", "training.optimizer=momentum",
                 f"training.global_batch_size={16 * world}"]
    resnet_plan, resnet = pipedream_plan("scenarios/validation/resnet_cpu.yaml", overrides,
                                         f"{PROFILES}/resnet_cpu_ws{world}_momentum.json")
    synthetic_plan, synthetic = pipedream_plan(
        "scenarios/validation/mlp_cpu.yaml", overrides + ["model.params.hidden_dim=768",
                                                          "model.params.num_hidden_layers=8"], None)
    steps = model_steps(resnet, 16, load_models_module(None), seed=0, device="cpu")
    hop_s = stage_hop_compute_s(steps)
    buffer = torch.ones(8192)
    rows = []
    for _ in range(rounds):
        cycle = []
        for repeat in range(4):
            windows = []
            dist.barrier()
            run_cycle(steps, buffer, 24, hop_s, repeat, windows)
            cycle.append(middle_utilisation([(start, end) for start, end, _ in windows]))
        rows.append({"cycle": statistics.median(cycle),
                     "resnet_rt": runtime_utilisation(rank, resnet_plan, resnet),
                     "synth_rt": runtime_utilisation(rank, synthetic_plan, synthetic)})
    return rows


def main() -> int:
    world, rounds = int(sys.argv[1]), int(sys.argv[2])
    results = spawn(rank_main, (world, rounds), LaunchConfig(world_size=world, timeout_s=1200))
    for index in range(rounds):
        print(f"ws{world} round {index}: " + " | ".join(
            f"{name} " + " ".join(f"{results[rank][index][name]:.2f}" for rank in range(world))
            for name in results[0][index]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
