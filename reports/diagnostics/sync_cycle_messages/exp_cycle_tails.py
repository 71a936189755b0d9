"""Experiments (2026-11-24): where the asynchronous cycle's isend tail (`handoff.cycle`) comes from.
Each variant runs `validator.handoff_bench.time_cycle_handoffs` (24 cycle runs) twice, or three times
for `blocks`, with every rank of one host in the cycle; the model's layer steps at batch 16 in the
compute windows unless the variant says otherwise. Results: results.md.

Run from the repository root:
    python reports/diagnostics/sync_cycle_messages/exp_cycle_tails.py VARIANT MODEL WORLD HOP_S
    e.g. ... exp_cycle_tails.py sources transformer_cpu 2 0.0112

VARIANT:
    sources  as calibrated / no clone() before each send / windows that sleep instead of computing
    batch    the windows' layer steps at batch 16, 8 and 2
    slack    rank 0's windows x1.0, x0.9, x0.8 of the others' (a lighter stage waits for a heavier one)
    blocks   every isend call kept: median, mean, the median over blocks of k consecutive calls / k
"""
import sys
import time

import numpy as np
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
import validator.handoff_bench as hb
from validator import comm_device
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

FIGURES = ("num_messages", "send_post_s", "send_post_mean_s", "ready_receive_s", "ready_receive_mean_s", "mean_delay_s")
ORIGINAL_SEND = hb._timed_send
VARIANTS = ("sources", "batch", "slack", "blocks")


def _send_without_clone(buffer, target, key, sends, pending, posts):
    sent_at = time.perf_counter()
    pending.append(comm_device.isend(buffer, dst=target))
    posts.append(time.perf_counter() - sent_at)
    sends.append((*key, target, sent_at))


def _variants(name, workload, rank, hop_s):
    """[(label, steps, send function, this rank's backward window)] of one variant."""
    steps = lambda batch: model_steps(workload, batch, load_models_module("validator.models"), seed=0)
    at_16 = steps(16)
    if name == "sources":
        return [("as is", at_16, ORIGINAL_SEND, hop_s), ("no clone", at_16, _send_without_clone, hop_s),
                ("sleep windows", [lambda: time.sleep(0.001)] * 4, ORIGINAL_SEND, hop_s)]
    if name == "batch":
        return [(f"batch {batch}", at_16 if batch == 16 else steps(batch), ORIGINAL_SEND, hop_s) for batch in (16, 8, 2)]
    if name == "slack":
        return [(f"rank 0's windows x{lighter:.1f}", at_16, ORIGINAL_SEND, hop_s * (lighter if rank == 0 else 1.0))
                for lighter in (1.0, 0.9, 0.8)]
    raise ValueError(name)


def rank_main(rank, variant, workload, hop_s):
    out = {}
    for _ in range(2):
        for label, steps, send, window_s in _variants(variant, workload, rank, hop_s):
            hb._timed_send = send
            cycle = hb.time_cycle_handoffs(steps, hop_compute_s=window_s, repeats=24)
            out.setdefault(label, []).append({key: cycle[key] for key in FIGURES})
    hb._timed_send = ORIGINAL_SEND
    return out if rank == 0 else None


def blocks_rank_main(rank, workload, hop_s):
    """Every rank's isend calls of three cycle measurements (`handoff_summary`'s input, kept)."""
    captured, summary = [], hb.handoff_summary
    hb.handoff_summary = lambda everyone, *args: captured.append(everyone) or summary(everyone, *args)
    steps = model_steps(workload, 16, load_models_module("validator.models"), seed=0)
    for _ in range(3):
        hb.time_cycle_handoffs(steps, hop_compute_s=hop_s, repeats=24)
    hb.handoff_summary = summary
    return captured if rank == 0 else None


def main():
    variant, name, world, hop_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    if variant not in VARIANTS:
        print(f"VARIANT: expected one of {', '.join(VARIANTS)}, got {variant!r}", file=sys.stderr)
        sys.exit(2)
    scenario = load_scenario(f"scenarios/validation/{name}.yaml", [f"cluster.gpus_per_node={world}"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    config = LaunchConfig(world_size=world, timeout_s=900)
    head = f"{name} ws{world} hop {hop_s * 1e3:.1f} ms"
    if variant == "blocks":
        for everyone in spawn(blocks_rank_main, (workload, hop_s), config)[0]:
            for rank, (_sends, _receives, posts) in enumerate(everyone):
                calls_ms = np.array(posts) * 1e3
                line = f"{head} rank {rank} isend n {len(calls_ms)} median {np.median(calls_ms):.2f} mean {calls_ms.mean():.2f}"
                for k in (4, 8, 16):
                    blocks = calls_ms[: len(calls_ms) // k * k].reshape(-1, k).sum(axis=1) / k
                    line += f" | k={k} block median {np.median(blocks):.2f}"
                print(line + f" | p99 {np.percentile(calls_ms, 99):.2f} max {calls_ms.max():.2f}")
        return
    for label, cycles in spawn(rank_main, (variant, workload, hop_s), config)[0].items():
        for c in cycles:
            print(f"{head} {label:22s} n {c['num_messages']:4d}  isend med {c['send_post_s'] * 1e3:.2f} "
                  f"mean {c['send_post_mean_s'] * 1e3:.2f}  ready med {c['ready_receive_s'] * 1e3:.2f} "
                  f"mean {c['ready_receive_mean_s'] * 1e3:.2f}  delay mean {c['mean_delay_s'] * 1e3:.2f}")


if __name__ == "__main__":
    main()
