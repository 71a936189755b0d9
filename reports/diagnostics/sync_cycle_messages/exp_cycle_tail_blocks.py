# Run from the repository root: python reports/diagnostics/sync_cycle_messages/exp_cycle_tail_blocks.py transformer_cpu 2 0.0112
"""Per-message samples of the cycle: mean vs median vs the median of blocks of k consecutive messages / k."""
import sys, statistics
import numpy as np
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
import validator.handoff_bench as hb
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

CAPTURED = {}
ORIGINAL = hb.handoff_summary
def capture(everyone, *args):
    CAPTURED["everyone"] = everyone
    return ORIGINAL(everyone, *args)

def rank_main(rank, workload, batch, hop, rounds):
    steps = model_steps(workload, batch, load_models_module("validator.models"), seed=0)
    hb.handoff_summary = capture
    out = []
    for r in range(rounds):
        hb.time_cycle_handoffs(steps, hop_compute_s=hop, repeats=24)
        out.append(CAPTURED["everyone"])
    return out if rank == 0 else None

if __name__ == "__main__":
    name, ws, hop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sc = load_scenario(f"scenarios/validation/{name}.yaml", [f"cluster.gpus_per_node={ws}"])
    wl = resolve_workload(sc.model, sc.base_dir)
    res = spawn(rank_main, (wl, 16, hop, 3), LaunchConfig(world_size=ws, timeout_s=900))[0]
    for everyone in res:
        for rank, (sends, receives, posts) in enumerate(everyone):
            p = np.array(posts) * 1e3
            line = f"{name} ws{ws} rank {rank} isend n {len(p)} median {np.median(p):.2f} mean {p.mean():.2f}"
            for k in (4, 8, 16):
                blocks = p[: len(p) // k * k].reshape(-1, k).sum(axis=1) / k
                line += f" | k={k} block median {np.median(blocks):.2f}"
            line += f" | p99 {np.percentile(p, 99):.2f} max {p.max():.2f}"
            print(line)
