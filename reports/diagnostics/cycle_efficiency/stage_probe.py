"""A 2-stage first stage's passes timed in one process, one thread: the calibration's way (each layer
alone, back to back on the same input, `validator.microbench.time_layers`) and the runtime's way
(the stage's layer-wise forward and backward, in GPipe, 1F1B and forward-then-backward order, on
varied or repeated inputs). With `--profile`, the calibration's way at the profile's timed batch
sizes against the per-layer medians the profile recorded: how far the machine's speed moved since.
Prints; writes nothing.

    python reports/diagnostics/cycle_efficiency/stage_probe.py transformer_cpu 8 [--profile PROFILE.json]

Why (thirtieth session): the transformer's 2-stage passes ran 1.08-1.32x their simulated time in
every plan (`step_spans_tx2.log`); this separates the machine's speed from the plans' own effects.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from validator.microbench import activation_chain, load_models_module  # noqa: E402

REPEATS = 40


def median_pair(run) -> tuple[float, float]:
    """Medians over REPEATS calls (after 5 warm-up calls) of the two seconds `run` returns."""
    for _ in range(5):
        run()
    samples = [run() for _ in range(REPEATS)]
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def calibration_way_s(modules, stage, batch) -> tuple[float, float]:
    """Summed over the stage's layers: each layer's forward and backward alone on the same input."""
    chain = activation_chain(modules, batch)
    forward_s = backward_s = 0.0
    for i in stage:
        output_grad = torch.randn(chain[i + 1].shape)

        def run(i=i, output_grad=output_grad):
            x = chain[i].detach().requires_grad_(i > 0)
            t0 = time.perf_counter()
            out = modules[i](x)
            t1 = time.perf_counter()
            out.backward(output_grad)
            return t1 - t0, time.perf_counter() - t1

        f, b = median_pair(run)
        forward_s, backward_s = forward_s + f, backward_s + b
    return forward_s, backward_s


def runtime_way_s(modules, stage, batches, order, varied: bool) -> tuple[float, float]:
    """Mean forward and backward of the stage's micro-batches run in `order` ((phase, micro-batch)),
    layer-wise graphs with each layer's input a leaf, as `validator.pipeline_runtime`."""
    def forward(x):
        inputs, outputs = [], []
        for i in stage:
            if i > 0:
                x = x.detach().requires_grad_(True)
            inputs.append(x)
            x = modules[i](x)
            outputs.append(x)
        return inputs, outputs

    def backward(state):
        inputs, outputs = state
        grad = torch.ones_like(outputs[-1])
        for k in reversed(range(len(stage))):
            outputs[k].backward(grad)
            grad = inputs[k].grad if k > 0 else None

    def run():
        forwards, backwards, states = [], [], {}
        for phase, j in order:
            t0 = time.perf_counter()
            if phase == "F":
                states[j] = forward(batches[j % len(batches)] if varied else batches[0])
                forwards.append(time.perf_counter() - t0)
            else:
                backward(states.pop(j))
                backwards.append(time.perf_counter() - t0)
        return statistics.mean(forwards), statistics.mean(backwards)

    return median_pair(run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="transformer_cpu")
    parser.add_argument("microbatch", nargs="?", type=int, default=8)
    parser.add_argument("--profile", help="a profile of the same model: compare with its per-layer medians")
    args = parser.parse_args()
    torch.set_num_threads(1)
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{args.model}.yaml",
                             ["cluster.gpus_per_node=2", "training.optimizer=momentum", "training.global_batch_size=32"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    models = load_models_module()
    modules = [m.train() for m in models.build_modules(workload, seed=0)]
    stage = list(range(len(modules) // 2))
    batches = [models.make_batch(workload, args.microbatch, seed=s)[0] for s in range(8)]
    f, b = calibration_way_s(modules, stage, batches[0])
    print(f"{args.model} micro-batch {args.microbatch}, layers {stage}: the calibration's way F {1e3 * f:.3f} B {1e3 * b:.3f} ms")
    orders = {"gpipe": [("F", j) for j in range(4)] + [("B", j) for j in range(4)],
              "1f1b": [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
              "forward then backward": [("F", 0), ("B", 0)]}
    for label, order in orders.items():
        for varied in (True, False):
            f, b = runtime_way_s(modules, stage, batches, order, varied)
            print(f"  the runtime's way, {label:21s} inputs {'varied' if varied else 'same'}: F {1e3 * f:.3f} B {1e3 * b:.3f} ms")
    if args.profile:
        profile = json.loads(Path(args.profile).read_text())
        for k, size in enumerate(profile["layers"][0]["batch_sizes"]):
            if size > 16:
                continue
            recorded_f = sum(profile["layers"][i]["forward_medians_s"][k] for i in stage)
            recorded_b = sum(profile["layers"][i]["backward_medians_s"][k] for i in stage)
            f, b = calibration_way_s(modules, stage, models.make_batch(workload, size, seed=0)[0])
            print(f"  batch {size}: now over the profile's record ({profile['created_utc']}): "
                  f"F {f / recorded_f:.2f} B {b / recorded_b:.2f}")


if __name__ == "__main__":
    main()
