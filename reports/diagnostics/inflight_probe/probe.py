"""Do a stage's passes slow with the micro-batches it keeps in flight? One process, one thread,
the validator's allocator settings: for each validation model at 2 and 4 stages (the partition the
simulator picks, m = 4 micro-batches of 4 x stages samples, as `bench_pipeline_validation.py`
runs them), every stage's layers run one step's forwards and backwards in GPipe's order (4
forwards, then 4 backwards: up to 4 micro-batches' activations alive) and in 1F1B's (stage s of p:
p - s forwards, then backward / forward in turn: at most p - s alive), rounds of the two orders
alternating. Prints per stage the median over rounds of the step's forward and backward sums in
GPipe's order over 1F1B's. Writes nothing.

    python reports/diagnostics/inflight_probe/probe.py [mlp,resnet,transformer] [ROUNDS]

Why (thirty-second session): across the eleven Intel Xeon pipeline runs the model predicts the
transformer's GPipe step 5-7 % below its 1F1B step (1F1B pays the cycle's message costs), while the
runs measured GPipe 0-7 % above 1F1B; a 2-stage step-spans run (`../cycle_efficiency/
step_spans_tx2.log`) timed GPipe's forwards and backwards 4-12 % slower than 1F1B's on the same
ranks. The calibration times passes with no other micro-batch in flight.
"""

import statistics
import subprocess
import sys
import time
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
M = 4


def partition(model: str, stages: int) -> list[int]:
    command = ["ghpsim", "simulate", str(ROOT / "scenarios" / "validation" / f"{model}_cpu.yaml"),
               "--set", f"cluster.gpus_per_node={stages}", "--set", "training.optimizer=momentum",
               "--set", f"training.global_batch_size={16 * stages}", "--set", "strategy.kind=gpipe",
               "--set", "strategy.num_groups=1", "--set", f"strategy.num_microbatches={M}", "--json"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)["partition"]


def orders(stage: int, stages: int) -> dict[str, list[tuple[str, int]]]:
    gpipe = [("F", i) for i in range(M)] + [("B", i) for i in range(M)]
    warm = min(stages - stage, M)
    one_f_one_b = [("F", i) for i in range(warm)]
    next_forward = warm
    for i in range(M):
        one_f_one_b.append(("B", i))
        if next_forward < M:
            one_f_one_b.append(("F", next_forward))
            next_forward += 1
    return {"gpipe": gpipe, "1f1b": one_f_one_b}


def run_order(layers, inputs, targets, order, last, workload, loss_fn):
    """(forward seconds, backward seconds) of one step in `order`."""
    for parameter in layers.parameters():
        parameter.grad = None
    alive, forward_s, backward_s = {}, 0.0, 0.0
    for phase, micro in order:
        started = time.perf_counter()
        if phase == "F":
            x = inputs[micro].detach().requires_grad_(inputs[micro].is_floating_point())
            out = layers(x)
            alive[micro] = loss_fn(workload, out, targets[micro]) if last else out
            forward_s += time.perf_counter() - started
        else:
            out = alive.pop(micro)
            if last:
                out.backward()
            else:
                out.backward(torch.ones_like(out))
            backward_s += time.perf_counter() - started
    return forward_s, backward_s


def main() -> None:
    from simulator.model_source import resolve_workload
    from simulator.scenario import load_scenario
    from validator.allocator import tune_allocator
    from validator.models import build_modules, loss_fn, make_batch
    torch.set_num_threads(1)
    tune_allocator()
    models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mlp", "resnet", "transformer"]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    for model in models:
        for stages in (2, 4):
            scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{model}_cpu.yaml",
                                     [f"cluster.gpus_per_node={stages}"])
            workload = resolve_workload(scenario.model, scenario.base_dir)
            modules = build_modules(workload)
            micro = 16 * stages // M
            batches = [make_batch(workload, micro, seed=i) for i in range(M)]
            activations = [b[0] for b in batches]
            start = 0
            for stage, count in enumerate(partition(model, stages)):
                layers = torch.nn.Sequential(*modules[start:start + count])
                start += count
                last = stage == stages - 1
                schedule = orders(stage, stages)
                sums = {name: [] for name in schedule}
                for r in range(rounds + 2):
                    for name in (schedule if r % 2 else reversed(list(schedule))):
                        figures = run_order(layers, activations, [b[1] for b in batches], schedule[name], last,
                                            workload, loss_fn)
                        if r >= 2:
                            sums[name].append(figures)
                with torch.no_grad():
                    activations = [layers(a) for a in activations]
                f_ratio = statistics.median(g[0] for g in sums["gpipe"]) / statistics.median(o[0] for o in sums["1f1b"])
                b_ratio = statistics.median(g[1] for g in sums["gpipe"]) / statistics.median(o[1] for o in sums["1f1b"])
                f1 = statistics.median(o[0] for o in sums["1f1b"]) * 1e3 / M
                b1 = statistics.median(o[1] for o in sums["1f1b"]) * 1e3 / M
                print(f"{model:11s} p={stages} stage {stage} layers {start - count}-{start - 1}: 1F1B F {f1:6.3f} ms "
                      f"B {b1:6.3f} ms per micro-batch | GPipe over 1F1B: F {f_ratio:.3f} B {b_ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
