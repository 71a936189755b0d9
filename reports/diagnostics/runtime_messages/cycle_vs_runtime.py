"""Twentieth session, 2026-11-24. Back to back in one launch: the cycle's message figures (ResNet layer steps, time_cycle_handoffs) against
the same figures timed in the pipeline runtime (PipeDream steady-state plans of the ResNet and of a synthetic
MLP), by the cycle's definitions (validator.handoff_bench.handoff_summary): isend call mean; a receive waited
for before its send began: delay from the isend start to the wait's end; a receive whose send began >= 0.5 ms
before the wait: the wait's duration. Prints one line per round (ms; counts in brackets).

    python reports/diagnostics/runtime_messages/cycle_vs_runtime.py WORLD ROUNDS
"""
import statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exposed_latency"))
import torch.distributed as dist
import util_compare as uc
from validator.handoff_bench import time_cycle_handoffs, stage_hop_compute_s, READY_MARGIN_S
from validator.launch import LaunchConfig, spawn
from validator.microbench import load_models_module
from validator.overlap_bench import model_steps
import validator.pipeline_runtime as prt

def runtime_records(rank, plan, workload, steps=8, warmup=2):
    ex = prt.PipelineExecutor(plan, workload, rank, "momentum", 0.01, 0, "cpu")
    sends, recvs, util = [], [], []
    for step in range(warmup + steps):
        ex.load_batch(step); dist.barrier()
        spans = ex.step(step)
        if step < warmup:
            continue
        t0 = ex.step_start
        for s in spans:
            if s[1] not in ("send", "recv"):
                continue
            kind, i = s[2].split(" ")[1].rstrip("0123456789"), s[7]
            if s[1] == "send":
                sends.append(((step, kind, i, rank, +1 if kind == "act" else -1), t0 + s[4], s[5] - s[4]))
            elif s[1] == "recv":
                src = rank - 1 if kind == "act" else rank + 1
                recvs.append(((step, kind, i, src, +1 if kind == "act" else -1), t0 + s[4], t0 + s[5]))
        util.append(uc.middle_utilisation([(s[4], s[5]) for s in spans if s[1] == "compute"]))
    return sends, recvs, util

def summary(every):
    sent = {k: t for e in every for k, t, _ in e[0]}
    posts = [d for e in every for _, _, d in e[0]]
    delays, ready = [], []
    for e in every:
        for k, start, end in e[1]:
            s = sent[k]
            lead = start - s
            if lead < 0: delays.append(end - s)
            elif lead >= READY_MARGIN_S: ready.append(end - start)
    return {"send_mean": statistics.fmean(posts), "ready_mean": statistics.fmean(ready) if ready else float("nan"),
            "delay_mean": statistics.fmean(delays) if delays else float("nan"), "n_ready": len(ready), "n_wait": len(delays),
            "util": statistics.median([u for e in every for u in e[2]])}

def rank_main(rank, world, rounds):
    try:
        return _rank_main(rank, world, rounds)
    except Exception:
        import traceback; traceback.print_exc(); raise

def _rank_main(rank, world, rounds):
    ov = [f"cluster.gpus_per_node={world}", "training.optimizer=momentum", f"training.global_batch_size={16 * world}"]
    rp, rw = uc.pipedream_plan("scenarios/validation/resnet_cpu.yaml", ov, f"{uc.PROFILES}/resnet_cpu_ws{world}_momentum.json")
    sp, sw = uc.pipedream_plan("scenarios/validation/mlp_cpu.yaml", ov + ["model.params.hidden_dim=768", "model.params.num_hidden_layers=8"], None)
    steps = model_steps(rw, 16, load_models_module(None), seed=0, device="cpu")
    hop = stage_hop_compute_s(steps)
    rows = []
    for _ in range(rounds):
        c = time_cycle_handoffs(steps, hop_compute_s=hop, repeats=12)
        row = {"cycle": {"send_mean": c["send_post_mean_s"], "ready_mean": c["ready_receive_mean_s"], "delay_mean": c["mean_delay_s"],
                         "n_ready": c["num_ready"], "n_wait": c["num_messages"], "util": float("nan")}}
        for name, plan, wl in (("resnet", rp, rw), ("synth", sp, sw)):
            every = [None] * world
            dist.all_gather_object(every, runtime_records(rank, plan, wl))
            row[name] = summary(every)
        rows.append(row)
    return rows

if __name__ == "__main__":
    world, rounds = int(sys.argv[1]), int(sys.argv[2])
    res = spawn(rank_main, (world, rounds), LaunchConfig(world_size=world, timeout_s=1200))
    for n, row in enumerate(res[0]):
        print(f"ws{world} round {n}: " + " | ".join(
            f"{name} send {f['send_mean']*1e3:.3f} ready {f['ready_mean']*1e3:.3f} ({f['n_ready']}) delay {f['delay_mean']*1e3:.3f} ({f['n_wait']}) util {f['util']:.2f}"
            for name, f in row.items()), flush=True)
