"""The calibration's asynchronous 1F1B cycle at 2 ranks (nineteenth session): how long each compute
window takes from one to the next against how long it computes, i.e. what the two messages of a
micro-batch cost on the cycle's critical loop.

Runs `validator.handoff_bench.run_cycle` (24 micro-batches, receives posted one ahead) with the
ResNet-20's layer steps, 1 + REPEATS times (the first untimed), and over the middle half of each
run's compute windows reports per rank: the elapsed time per window, the busy time per window and
their ratio. HOP_S sets the backward window (default: the calibration's `stage_hop_compute_s`),
FORWARD_SHARE the forward window's share of it (default 0.5), SIZE_BYTES the message (default 64 KiB).

    [HOP_S=0.0015] [FORWARD_SHARE=0.8] [SIZE_BYTES=32768] python reports/diagnostics/exposed_latency/cycle_period.py REPEATS
"""

import os
import sys

import torch
import torch.distributed as dist

from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from validator.handoff_bench import DEFAULT_HANDOFF_BYTES, run_cycle, stage_hop_compute_s
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

MICROBATCHES = 24


def rank_main(rank: int, repeats: int) -> dict:
    scenario = load_scenario("scenarios/validation/resnet_cpu.yaml", ["cluster.gpus_per_node=2"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    steps = model_steps(workload, 16, load_models_module(None), seed=0, device="cpu")
    hop_s = float(os.environ["HOP_S"]) if "HOP_S" in os.environ else stage_hop_compute_s(steps)
    forward_share = float(os.environ.get("FORWARD_SHARE", "0.5"))
    buffer = torch.ones(int(os.environ.get("SIZE_BYTES", DEFAULT_HANDOFF_BYTES)) // 4)
    elapsed_s = busy_s = windows_counted = 0
    for repeat in range(1 + repeats):
        windows = []
        dist.barrier()
        run_cycle(steps, buffer, MICROBATCHES, hop_s, repeat, windows, forward_share)
        middle = windows[len(windows) // 4: 3 * len(windows) // 4]
        if repeat == 0:
            continue
        elapsed_s += middle[-1][1] - middle[0][0]
        busy_s += sum(end - start for start, end, _ in middle)
        windows_counted += len(middle)
    return {"rank": rank, "hop_ms": hop_s * 1e3, "elapsed_per_window_ms": elapsed_s / windows_counted * 1e3,
            "busy_per_window_ms": busy_s / windows_counted * 1e3, "busy_share": busy_s / elapsed_s}


def main() -> int:
    for row in spawn(rank_main, (int(sys.argv[1]),), LaunchConfig(world_size=2, timeout_s=600)):
        print(" ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                       for key, value in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
