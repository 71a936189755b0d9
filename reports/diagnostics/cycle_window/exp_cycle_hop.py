"""Experiment (2026-11-24): the asynchronous cycle's message figures (`handoff.cycle`) against its backward
window `hop_compute_s`, each hop twice, 24 runs of the cycle each, the model's layer steps at the
calibration's middle batch. Run: python reports/diagnostics/cycle_window/exp_cycle_hop.py transformer_cpu 2 0.002,0.008,0.016"""
import sys, time, statistics
import torch, torch.distributed as dist
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from validator.handoff_bench import time_cycle_handoffs
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

def rank_main(rank, workload, batch, hops, rounds):
    steps = model_steps(workload, batch, load_models_module("validator.models"), seed=0)
    t = []
    for s in steps[:8]:
        s()
    for s in steps:
        a = time.perf_counter(); s(); t.append(time.perf_counter() - a)
    out = {"step_ms": [round(x * 1e3, 2) for x in t]}
    for r in range(rounds):
        for hop in hops:
            c = time_cycle_handoffs(steps, hop_compute_s=hop, repeats=24)
            out.setdefault(hop, []).append({k: c[k] for k in ("num_messages", "send_post_s", "send_post_mean_s", "ready_receive_s", "ready_receive_mean_s", "mean_delay_s")})
    return out if rank == 0 else None

if __name__ == "__main__":
    name, ws = sys.argv[1], int(sys.argv[2])
    hops = [float(h) for h in sys.argv[3].split(",")]
    sc = load_scenario(f"scenarios/validation/{name}.yaml", [f"cluster.gpus_per_node={ws}"])
    wl = resolve_workload(sc.model, sc.base_dir)
    from validator.calibrate import DEFAULT_BATCH_SIZES
    batch = DEFAULT_BATCH_SIZES[len(DEFAULT_BATCH_SIZES) // 2]
    res = spawn(rank_main, (wl, batch, hops, 2), LaunchConfig(world_size=ws, timeout_s=900))[0]
    print(name, ws, "batch", batch, "layer steps ms", res["step_ms"])
    for hop in hops:
        for c in res[hop]:
            print(f"hop {hop*1e3:4.0f} ms  n {c['num_messages']:4d}  isend med {c['send_post_s']*1e3:.2f} mean {c['send_post_mean_s']*1e3:.2f}"
                  f"  ready med {c['ready_receive_s']*1e3:.2f} mean {c['ready_receive_mean_s']*1e3:.2f}  delay mean {c['mean_delay_s']*1e3:.2f}")
