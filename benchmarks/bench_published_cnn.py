"""Accuracy on a published CNN: ResNet-50 v1.5 training throughput in PyTorch on DGX A100 (80 GB) and
DGX-1 (V100 16 GB), one and eight GPUs, predicted with the datasheet catalogue and scored against
the measurements.

Source: NVIDIA DeepLearningExamples, `PyTorch/Classification/ConvNets/resnet50v1.5/README.md`,
"Training performance results" (pytorch-21.03 NGC container), images per second for the whole
node; per-GPU batch and memory format from the same folder's `configs.yml` (256 with AMP and with
TF32, 112 in FP32 on V100; AMP runs channels_last, `memory_format: nhwc`, TF32 and FP32 PyTorch's
default NCHW), SGD with momentum, data parallelism with PyTorch DDP. A step of b images a GPU on n GPUs
is measured at b n / throughput seconds.

Each row is predicted twice: with `costs.model: auto` (what a scenario gets: the kernel model on
Volta, Ampere and Hopper, the analytic roofline elsewhere) and with `costs.model: kernel` (the
kernel model on every GPU: the same here, every GPU of these runs having a catalogue row).
Nothing here is fitted: these rows are held out from every parameter of the model.

    python benchmarks/bench_published_cnn.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.simulate import simulate  # noqa: E402

NODES = {"A100-80GB": "nvswitch2-a100", "V100-16GB": "nvlink2-v100"}
"""The GPU presets of DGX A100 80 GB and DGX-1 16 GB, and the link inside each node."""
RUNS = (  # (gpu, GPUs, batch a GPU, dtype, published images/s of the node)
    ("A100-80GB", 1, 256, "fp16", 2470), ("A100-80GB", 8, 256, "fp16", 16621),
    ("A100-80GB", 1, 256, "tf32", 938), ("A100-80GB", 8, 256, "tf32", 7248),
    ("V100-16GB", 1, 256, "fp16", 1200), ("V100-16GB", 8, 256, "fp16", 8322),
    ("V100-16GB", 1, 112, "fp32", 367), ("V100-16GB", 8, 112, "fp32", 2855),
)
COST_MODELS = ("auto", "kernel")


def run_scenario(gpu: str, num_gpus: int, batch: int, dtype: str, cost_model: str) -> dict:
    return {"name": f"resnet50_{gpu}_{num_gpus}x{batch}_{dtype}",
            "cluster": {"num_nodes": 1, "gpus_per_node": num_gpus, "gpu": gpu, "intra_node_link": NODES[gpu]},
            "model": {"name": "resnet50"}, "strategy": {"kind": "dp"},
            "training": {"global_batch_size": batch * num_gpus, "dtype": dtype, "optimizer": "momentum",
                         "memory_format": "nhwc" if dtype == "fp16" else "nchw"},  # configs.yml: AMP nhwc
            "costs": {"model": cost_model}}


def figures() -> dict:
    """Every row's measured and predicted step time (s) and error (%) per cost model, and the
    MAPE, mean signed error and worst row per cost model."""
    rows = []
    for gpu, num_gpus, batch, dtype, images_per_s in RUNS:
        row = {"gpu": gpu, "gpus": num_gpus, "batch": batch, "dtype": dtype,
               "measured_s": batch * num_gpus / images_per_s}
        for cost_model in COST_MODELS:
            predicted = simulate(scenario_from_dict(run_scenario(gpu, num_gpus, batch, dtype, cost_model))).step_time_s
            row[f"{cost_model}_s"] = predicted
            row[f"{cost_model}_error_pct"] = 100 * (predicted - row["measured_s"]) / row["measured_s"]
        rows.append(row)
    summary = {}
    for cost_model in COST_MODELS:
        errors = [row[f"{cost_model}_error_pct"] for row in rows]
        worst = max(rows, key=lambda row: abs(row[f"{cost_model}_error_pct"]))
        summary[cost_model] = {"mape_pct": statistics.fmean(abs(e) for e in errors),
                               "mean_signed_pct": statistics.fmean(errors),
                               "worst_pct": abs(worst[f"{cost_model}_error_pct"]),
                               "worst_row": f"{worst['gpu']} x{worst['gpus']} {worst['dtype']}"}
    return {"rows": rows, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = figures()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("ResNet-50 v1.5, PyTorch DDP (NVIDIA DeepLearningExamples), datasheet, nothing fitted:")
    print(f"{'run':32s} {'measured ms':>11s} " + " ".join(f"{m + ' ms':>10s} {'error':>7s}" for m in COST_MODELS))
    for row in result["rows"]:
        label = f"{row['gpu']} x{row['gpus']} batch {row['batch']} {row['dtype']}"
        print(f"{label:32s} {1e3 * row['measured_s']:11.1f} " + " ".join(
            f"{1e3 * row[m + '_s']:10.1f} {row[m + '_error_pct']:+6.1f}%" for m in COST_MODELS))
    for cost_model, summary in result["summary"].items():
        print(f"costs.model {cost_model}: {len(result['rows'])} runs, MAPE {summary['mape_pct']:.1f} %, mean signed "
              f"{summary['mean_signed_pct']:+.1f} %, worst {summary['worst_pct']:.1f} % ({summary['worst_row']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
