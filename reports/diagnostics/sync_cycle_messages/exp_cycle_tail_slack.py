# Run from the repository root: python reports/diagnostics/sync_cycle_messages/exp_cycle_tail_slack.py transformer_cpu 2 0.0112
"""Is the cycle's isend tail the price of every rank computing without slack? The same cycle with the
stages balanced (every rank's window = hop) and with rank 0's windows shortened (x0.9, x0.8, as a
real pipeline's lighter stage waits for the heavier one), 24 runs each, two rounds."""
import sys
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
import validator.handoff_bench as hb
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps

def rank_main(rank, workload, batch, hop, rounds):
    steps = model_steps(workload, batch, load_models_module("validator.models"), seed=0)
    out = {}
    for r in range(rounds):
        for lighter in (1.0, 0.9, 0.8):
            window = hop * (lighter if rank == 0 else 1.0)
            c = hb.time_cycle_handoffs(steps, hop_compute_s=window, repeats=24)
            out.setdefault(lighter, []).append({k: c[k] for k in ("num_messages", "send_post_s", "send_post_mean_s", "ready_receive_s", "ready_receive_mean_s", "mean_delay_s")})
    return out if rank == 0 else None

if __name__ == "__main__":
    name, ws, hop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sc = load_scenario(f"scenarios/validation/{name}.yaml", [f"cluster.gpus_per_node={ws}"])
    wl = resolve_workload(sc.model, sc.base_dir)
    res = spawn(rank_main, (wl, 16, hop, 2), LaunchConfig(world_size=ws, timeout_s=900))[0]
    for lighter, cs in res.items():
        for c in cs:
            print(f"{name} ws{ws} hop {hop*1e3:.1f} ms, rank 0's windows x{lighter:.1f}: n {c['num_messages']:4d}  isend med {c['send_post_s']*1e3:.2f} mean {c['send_post_mean_s']*1e3:.2f}"
                  f"  ready med {c['ready_receive_s']*1e3:.2f} mean {c['ready_receive_mean_s']*1e3:.2f}  delay mean {c['mean_delay_s']*1e3:.2f}")
