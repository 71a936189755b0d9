"""The experiment behind `cycle_compute` (2026-11-24; ACCURACY "Latest"): a rank's compute inside the
asynchronous 1F1B cycle (`validator.handoff_bench.run_cycle`, its compute windows recorded) against all
ranks computing back to back without messages and against rank 0 alone, per rank: the rate and the
main thread's CPU per step; then the windows' steps over the processor-sharing expectation, the other
threads' CPU (gloo's) in cores, and the lost work per message end. Steps: the workload's layer steps
at batch 16. Prints only.

Run: python reports/diagnostics/cycle_compute/exp_cycle_rate.py MODEL STAGES HOP_S   (e.g. resnet_cpu 4 0.008)
"""
import sys, time, json
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "benchmarks"))
import torch, torch.distributed as dist
from bench_pipeline_validation import pipeline_overrides
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from validator import handoff_bench
from validator.overlap_bench import model_steps
from validator.launch import LaunchConfig, spawn
import validator.models as models

WINDOWS = []
_orig = handoff_bench._compute_for
def _recording(steps, duration_s, position, device):
    w0, c0 = time.perf_counter(), time.thread_time()
    new = _orig(steps, duration_s, position, device)
    WINDOWS.append((new - position, time.perf_counter() - w0, time.thread_time() - c0, w0))
    return new

def continuous(steps, seconds, active):
    dist.barrier()
    n, w0, c0 = 0, time.perf_counter(), time.thread_time()
    if active:
        while time.perf_counter() - w0 < seconds:
            steps[n % len(steps)](); n += 1
    w, c = time.perf_counter() - w0, time.thread_time() - c0
    dist.barrier()
    return (n, w, c) if active else None

def rank_main(rank, workload, rounds, hop_s):
    torch.set_num_threads(1)
    steps = model_steps(workload, 16, models, seed=0)
    handoff_bench._compute_for = _recording
    out = {"busy": [], "alone": [], "cycle": []}
    for _ in range(3):
        steps[0]()
    for r in range(rounds):
        out["busy"].append(continuous(steps, 0.4, True))
        out["alone"].append(continuous(steps, 0.4, rank == 0))
        WINDOWS.clear()
        buffer = torch.ones(handoff_bench.DEFAULT_HANDOFF_BYTES // 4)
        dist.barrier()
        t0 = time.perf_counter(); pt0, tt0 = time.process_time(), time.thread_time()
        handoff_bench.run_cycle(steps, buffer, 24, hop_s, r)
        total = time.perf_counter() - t0
        out.setdefault("other_cpu", []).append(((time.process_time() - pt0) - (time.thread_time() - tt0), total))
        p0, pc0 = time.process_time(), None
        n = sum(x[0] for x in WINDOWS); w = sum(x[1] for x in WINDOWS); c = sum(x[2] for x in WINDOWS)
        out["cycle"].append((n, w, c, total))
        out.setdefault("windows", []).append(list(WINDOWS))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, out)
    return everyone if rank == 0 else None

if __name__ == "__main__":
    name, stages, hop_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sc = load_scenario(f"scenarios/validation/{name}.yaml", pipeline_overrides(stages))
    wl = resolve_workload(sc.model, sc.base_dir)
    res = spawn(rank_main, (wl, 5, hop_s), LaunchConfig(world_size=stages, backend="gloo", device="cpu", timeout_s=600))[0]
    import statistics as st
    a = [x for x in res[0]["alone"] if x]
    alone_rate = st.median(n / w for n, w, c in a)
    alone_cpu = st.median(c / n for n, w, c in a)
    print(f"{name} ws{stages} hop {hop_s*1e3:.1f} ms: alone {alone_rate:.0f} steps/s, cpu/step {alone_cpu*1e3:.3f} ms")
    for rank, out in enumerate(res):
        busy_rate = st.median(n / w for n, w, c in out["busy"]); busy_cpu = st.median(c / n for n, w, c in out["busy"])
        cyc_rate = st.median(n / w for n, w, c, t in out["cycle"]); cyc_cpu = st.median(c / n for n, w, c, t in out["cycle"])
        frac = st.median(w / t for n, w, c, t in out["cycle"])
        print(f" rank {rank}: busy rate/alone {busy_rate/alone_rate:.3f} cpu/step x{busy_cpu/alone_cpu:.3f} | "
              f"cycle rate/alone {cyc_rate/alone_rate:.3f} cpu/step x{cyc_cpu/alone_cpu:.3f} "
              f"cycle/busy rate {cyc_rate/busy_rate:.3f} computing {frac:.2f} of cycle")

    # processor-sharing expectation of each window's steps, from n(t) = ranks inside a window
    W = len(res)
    P = W * st.median(st.median(n / w for n, w, c in out["busy"]) for out in res) / alone_rate
    etas = []; lost = []
    for r in range(len(res[0]["windows"])):
        wins = [(rank, t0, t0 + w, n) for rank, out in enumerate(res) for (n, w, c, t0) in out["windows"][r]]
        events = sorted({t for _, a, b, _ in wins for t in (a, b)})
        actual = expected = 0.0
        for rank, a, b, n in wins:
            actual += n
            pts = [t for t in events if a <= t <= b]
            for u, v in zip(pts, pts[1:]):
                m = (u + v) / 2
                k = sum(1 for _, a2, b2, _ in wins if a2 <= m < b2)
                expected += alone_rate * (v - u) * min(1.0, P / k)
        etas.append(actual / expected); lost.append((expected - actual) / alone_rate / (4 * (W - 1) * 24))
    other = [st.median(cpu / t for cpu, t in out["other_cpu"]) for out in res]
    print(f" P = {P:.2f}; cycle efficiency (steps done / processor-sharing expectation) per round: "
          + " ".join(f"{e:.3f}" for e in etas) + f"; median {st.median(etas):.3f}")
    print(f" other threads' CPU (cores, per rank): " + " ".join(f"{x:.3f}" for x in other) + f"; sum {sum(other):.2f}")
    print(f" lost alone-work per message end: " + " ".join(f"{1e3*x:.3f}" for x in lost) + f" ms; median {1e3*st.median(lost):.3f} ms")
