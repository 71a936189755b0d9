"""Convergence of top-k sparse gradients with and without error feedback against dense DP (issue 6,
LaySA seed: PAPERS.md 3). Prints a table, writes reports/sparse_convergence.csv and .png.

Task and model: the CNN task of benchmarks/bench_convergence.py (a narrow ResNet-20 on 3x16x16
N(0,1) images labelled by a fixed random teacher; its `teacher_task` and model are imported), DP
over G = 4 ranks, batches of 32 samples (8 per rank), momentum SGD, the same seed and sample stream
for every variant. Variants: dense (mean of the G gradients); top-k at densities 0.1 and 0.01 per
layer (each layer with parameters is a gradient bucket, k = ceil(rho n)), with error feedback
(the unsent rest is added to the next step's gradient) and without (it is dropped). Evaluation:
loss and accuracy on a fixed held-out batch of 256.

The runs are a single-process emulation of the G ranks (`validator.sparse_reference`): each rank's
gradient is computed on its slice of the batch and the exchange is done in memory. The numbers
depend only on the per-rank gradients, not on timing, and tests/test_sparse_runtime.py shows that
real 2-rank gloo runs of the runtime end with the reference's parameters (to 1e-5).
Run: python benchmarks/bench_sparse_convergence.py [--steps 150]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_plots import loss_legend  # noqa: E402
from bench_convergence import MODELS, teacher_task  # noqa: E402

from simulator import load_scenario, simulate  # noqa: E402
from simulator.output import write_text_atomic  # noqa: E402
from validator.sparse_reference import plan_buckets, sparse_training  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RANKS, BATCH = 4, 32
VARIANTS = {  # label -> (density, error feedback)
    "dense": (None, True),
    "top-k 0.1 + EF": (0.1, True),
    "top-k 0.01 + EF": (0.01, True),
    "top-k 0.1 no EF": (0.1, False),
    "top-k 0.01 no EF": (0.01, False),
}


def layer_buckets():
    """Per-layer gradient buckets of the compiled top-k DP plan (a 1-byte bucket cap closes one per
    layer with parameters), and the workload."""
    result = simulate(load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": RANKS, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MODELS["cnn"],
        "strategy": {"kind": "dp", "bucket_size_bytes": 1, "gradient_compression": "topk"},
        "training": {"global_batch_size": BATCH, "optimizer": "momentum"}}))
    return plan_buckets(result.plan), result.workload


def run_variant(label: str, steps: int, learning_rate: float, eval_every: int, buckets, workload) -> list[dict]:
    density, feedback = VARIANTS[label]
    task = teacher_task("cnn")
    result = sparse_training(workload, RANKS, buckets, density, steps, BATCH, "momentum", learning_rate,
                             error_feedback=feedback, batch_fn=lambda step: task(BATCH, 1000 + step),
                             eval_batch=task(256, 99), eval_every=eval_every)
    evaluations = {row["step"]: row for row in result.evaluations}
    return [{"variant": label, "density": density if density is not None else 1.0, "error_feedback": feedback,
             "step": step + 1, "train_loss": loss, "sent_fraction": result.sent_fraction[step],
             "eval_loss": evaluations.get(step + 1, {}).get("loss"),
             "eval_accuracy": evaluations.get(step + 1, {}).get("accuracy")}
            for step, loss in enumerate(result.losses)]


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for label, case in frame.groupby("variant", sort=False):
        evaluated = case.dropna(subset=["eval_loss"])
        rows.append({"variant": label, "train_loss_last10": case["train_loss"].tail(10).mean(),
                     "eval_loss": evaluated["eval_loss"].iloc[-1],
                     "eval_accuracy": evaluated["eval_accuracy"].iloc[-1],
                     "eval_loss_mean": evaluated["eval_loss"].mean(),
                     "sent_fraction": case["sent_fraction"].mean()})
    table = pd.DataFrame(rows)
    dense = table.set_index("variant").loc["dense"]
    table["eval_loss_vs_dense"] = table["eval_loss"] - dense["eval_loss"]
    table["mean_vs_dense"] = table["eval_loss_mean"] - dense["eval_loss_mean"]
    return table


def plot(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(12, 4))
    for label in frame["variant"].unique():
        case = frame[frame["variant"] == label]
        evaluated = case.dropna(subset=["eval_loss"])
        line, = loss_axis.plot(case["step"], case["train_loss"].rolling(10, min_periods=1).mean(), alpha=0.3)
        loss_axis.plot(evaluated["step"], evaluated["eval_loss"], color=line.get_color(), marker="o",
                       markersize=3, label=label)
        accuracy_axis.plot(evaluated["step"], evaluated["eval_accuracy"], color=line.get_color(), marker="o",
                           markersize=3, label=label)
    accuracy_axis.set_ylabel("held-out accuracy")
    for axis in (loss_axis, accuracy_axis):
        axis.set_xlabel(f"step ({BATCH} samples, {RANKS} ranks)")
        axis.grid(alpha=0.3)
    loss_legend(loss_axis)
    figure.suptitle("ResNet-20 (x0.5) on the teacher task: dense vs top-k, with and without error feedback")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "reports"))
    parser.add_argument("--replot", action="store_true", help="table and plot from OUT/sparse_convergence.csv only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    started = time.perf_counter()
    if args.replot:
        frame = pd.read_csv(out / "sparse_convergence.csv")
    else:
        buckets, workload = layer_buckets()
        rows = []
        from rich.progress import track
        for label in track(list(VARIANTS), description="emulating", transient=True):
            rows += run_variant(label, args.steps, args.learning_rate, args.eval_every, buckets, workload)
        frame = pd.DataFrame(rows)
        write_text_atomic(out / "sparse_convergence.csv", frame.to_csv(index=False))
    plot(frame, out / "sparse_convergence.png")
    print(f"Convergence after {frame['step'].max()} steps of {BATCH} samples on {RANKS} emulated DP ranks "
          f"(momentum SGD lr {args.learning_rate}, per-layer top-k). Single-process emulation of the rank "
          "averaging (validator.sparse_reference): the numbers depend only on the per-rank gradients, and "
          "real gloo runs of the runtime match it to 1e-5 (tests/test_sparse_runtime.py).")
    print("eval_loss: held-out loss at the end; eval_loss_mean: over all evaluations (speed of descent); "
          "sent_fraction: nonzero entries of the averaged gradient; *_vs_dense: minus dense's")
    print(summary(frame).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {out / 'sparse_convergence.csv'}, {out / 'sparse_convergence.png'} "
          f"in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
