"""`probe.py` with every stage of a p-stage split in its own process at once (one thread each, the
allocator settings, rounds started together at a barrier, no messages between them): does a
stage's GPipe order slow its passes more than 1F1B's when the other stages compute beside it on
the shared host (caches, memory bandwidth)? Prints the same per-stage ratios. Writes nothing.

    python reports/diagnostics/inflight_probe/pair_probe.py [transformer] [STAGES] [ROUNDS]
"""

import multiprocessing
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe import M, ROOT, orders, partition, run_order  # noqa: E402


def stage_worker(model, stages, stage, split, rounds, barrier, results):
    from simulator.model_source import resolve_workload
    from simulator.scenario import load_scenario
    from validator.allocator import tune_allocator
    from validator.models import build_modules, loss_fn, make_batch
    torch.set_num_threads(1)
    tune_allocator()
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{model}_cpu.yaml", [f"cluster.gpus_per_node={stages}"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    modules = build_modules(workload)
    batches = [make_batch(workload, 16 * stages // M, seed=i) for i in range(M)]
    activations = [b[0] for b in batches]
    start = 0
    with torch.no_grad():
        for count in split[:stage]:
            activations = [torch.nn.Sequential(*modules[start:start + count])(a) for a in activations]
            start += count
    layers = torch.nn.Sequential(*modules[start:start + split[stage]])
    schedule = orders(stage, stages)
    sums = {name: [] for name in schedule}
    for r in range(rounds + 2):
        for name in (schedule if r % 2 else reversed(list(schedule))):
            barrier.wait()
            figures = run_order(layers, activations, [b[1] for b in batches], schedule[name], stage == stages - 1,
                                workload, loss_fn)
            if r >= 2:
                sums[name].append(figures)
    one = [statistics.median(o[i] for o in sums["1f1b"]) for i in (0, 1)]
    ratio = [statistics.median(g[i] for g in sums["gpipe"]) / one[i] for i in (0, 1)]
    results[stage] = (start, split[stage], one, ratio)


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "transformer"
    stages = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    split = partition(model, stages)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(stages), context.Manager().dict()
    workers = [context.Process(target=stage_worker, args=(model, stages, s, split, rounds, barrier, results))
               for s in range(stages)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for stage in range(stages):
        first, count, (f1, b1), (f_ratio, b_ratio) = results[stage]
        print(f"{model:11s} p={stages} stage {stage} layers {first}-{first + count - 1}, all stages at once: "
              f"1F1B F {f1 * 1e3 / M:6.3f} ms B {b1 * 1e3 / M:6.3f} ms per micro-batch | "
              f"GPipe over 1F1B: F {f_ratio:.3f} B {b_ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
