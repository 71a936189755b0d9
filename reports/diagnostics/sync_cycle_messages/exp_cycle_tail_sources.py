# Run from the repository root: python reports/diagnostics/sync_cycle_messages/exp_cycle_tail_sources.py transformer_cpu 2 0.0112
"""Does the cycle's isend tail come from the clone before each send, or from the compute windows' steps?"""
import sys, time
import torch, torch.distributed as dist
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
import validator.handoff_bench as hb
from validator import comm_device
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

ORIGINAL = hb._timed_send
def no_clone_send(buffer, target, key, sends, pending, posts):
    sent_at = time.perf_counter()
    pending.append(comm_device.isend(buffer, dst=target))
    posts.append(time.perf_counter() - sent_at)
    sends.append((*key, target, sent_at))

def sleeping_steps(n, s):
    return [lambda: time.sleep(s)] * n

def rank_main(rank, workload, batch, hop, rounds):
    steps = model_steps(workload, batch, load_models_module("validator.models"), seed=0)
    out = {}
    variants = {"as is": (steps, ORIGINAL), "no clone": (steps, no_clone_send), "sleep windows": (sleeping_steps(4, 0.001), ORIGINAL)}
    for r in range(rounds):
        for name, (st, send) in variants.items():
            hb._timed_send = send
            c = hb.time_cycle_handoffs(st, hop_compute_s=hop, repeats=24)
            out.setdefault(name, []).append({k: c[k] for k in ("num_messages", "send_post_s", "send_post_mean_s", "ready_receive_s", "ready_receive_mean_s", "mean_delay_s")})
    hb._timed_send = ORIGINAL
    return out if rank == 0 else None

if __name__ == "__main__":
    name, ws, hop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sc = load_scenario(f"scenarios/validation/{name}.yaml", [f"cluster.gpus_per_node={ws}"])
    wl = resolve_workload(sc.model, sc.base_dir)
    res = spawn(rank_main, (wl, 16, hop, 2), LaunchConfig(world_size=ws, timeout_s=900))[0]
    for variant, cs in res.items():
        for c in cs:
            print(f"{name} ws{ws} hop {hop*1e3:.1f} ms {variant:14s} n {c['num_messages']:4d}  isend med {c['send_post_s']*1e3:.2f} mean {c['send_post_mean_s']*1e3:.2f}"
                  f"  ready med {c['ready_receive_s']*1e3:.2f} mean {c['ready_receive_mean_s']*1e3:.2f}  delay mean {c['mean_delay_s']*1e3:.2f}")
