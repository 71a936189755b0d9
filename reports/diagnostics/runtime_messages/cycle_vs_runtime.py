"""Twentieth session, 2026-11-24. Back to back in one launch of WORLD ranks, ROUNDS times: the
calibration cycle's message figures (`validator.handoff_bench.time_cycle_handoffs` on the ResNet's
layer steps) against the same figures timed in the pipeline runtime on PipeDream's steady-state
plans of the ResNet and of a synthetic MLP (hidden 768 x 8 layers), both by the cycle's definitions
(`validator.handoff_bench.handoff_summary`, the runtime's spans turned into its records by
`validator.runtime_messages_bench.message_records`): the mean isend call; the mean delay from an
isend to the end of a wait that began before it; the mean wait on a message sent >= 0.5 ms before
the wait. Also the runtime ranks' median share of time computing (`util`). Prints one line per
round (ms; message counts in brackets). Writes nothing.

    python reports/diagnostics/runtime_messages/cycle_vs_runtime.py WORLD ROUNDS
"""

import statistics
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exposed_latency"))

import util_compare  # noqa: E402
from validator.handoff_bench import handoff_summary, stage_hop_compute_s, time_cycle_handoffs  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.microbench import load_models_module  # noqa: E402
from validator.overlap_bench import model_steps  # noqa: E402
from validator.pipeline_runtime import PipelineExecutor  # noqa: E402
from validator.runtime_messages_bench import message_records  # noqa: E402

SYNTHETIC = ["model.params.hidden_dim=768", "model.params.num_hidden_layers=8"]


def runtime_figures(rank: int, world: int, plan, workload, steps: int = 8, warmup: int = 2) -> dict:
    """`handoff_summary` of the runtime's messages over `steps` steps after `warmup`, with `util`."""
    executor = PipelineExecutor(plan, workload, rank, "momentum", 0.01, 0, "cpu")
    sends, receives, posts, shares = [], [], [], []
    for step in range(warmup + steps):
        executor.load_batch(step)
        dist.barrier()
        spans = executor.step(step)
        if step < warmup:
            continue
        sent, received, posted = message_records(spans, step, rank, executor.step_start)
        sends += sent
        receives += received
        posts += posted
        shares.append(util_compare.middle_utilisation([(span[4], span[5]) for span in spans if span[1] == "compute"]))
    everyone = [None] * world
    dist.all_gather_object(everyone, (sends, receives, posts, shares))
    summary = handoff_summary([record[:3] for record in everyone], 0, 0.0, 0)
    return {**summary, "util": statistics.median(share for record in everyone for share in record[3])}


def rank_main(rank: int, world: int, rounds: int) -> list[dict]:
    overrides = [f"cluster.gpus_per_node={world}", "training.optimizer=momentum",
                 f"training.global_batch_size={16 * world}"]
    resnet_plan, resnet = util_compare.pipedream_plan(
        "scenarios/validation/resnet_cpu.yaml", overrides,
        f"{util_compare.PROFILES}/resnet_cpu_ws{world}_momentum.json")
    synthetic_plan, synthetic = util_compare.pipedream_plan("scenarios/validation/mlp_cpu.yaml",
                                                            overrides + SYNTHETIC, None)
    steps = model_steps(resnet, 16, load_models_module(None), seed=0, device="cpu")
    hop_s = stage_hop_compute_s(steps)
    rows = []
    for _ in range(rounds):
        row = {"cycle": {**time_cycle_handoffs(steps, hop_compute_s=hop_s, repeats=12), "util": float("nan")}}
        for name, plan, workload in (("resnet", resnet_plan, resnet), ("synth", synthetic_plan, synthetic)):
            row[name] = runtime_figures(rank, world, plan, workload)
        rows.append(row)
    return rows


def line(name: str, figures: dict) -> str:
    ms = lambda value: "nan" if value is None else f"{value * 1e3:.3f}"  # noqa: E731
    return (f"{name} send {ms(figures['send_post_mean_s'])} ready {ms(figures['ready_receive_mean_s'])} "
            f"({figures['num_ready']}) delay {ms(figures['mean_delay_s'])} ({figures['num_messages']}) "
            f"util {figures['util']:.2f}")


def main() -> int:
    world, rounds = int(sys.argv[1]), int(sys.argv[2])
    results = spawn(rank_main, (world, rounds), LaunchConfig(world_size=world, timeout_s=1200))
    for index, row in enumerate(results[0]):
        print(f"ws{world} round {index}: " + " | ".join(line(name, figures) for name, figures in row.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
