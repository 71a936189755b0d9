"""Convergence of pipeline schedules (issue 4, SpecTrain seed claim). Prints a table, plots loss
curves into reports/convergence_{cnn,transformer}.png and writes reports/convergence.csv.

Schedules at 2 and 4 stages on the same stream of samples (micro-batches of 8), seed, learning rate
and momentum SGD: synchronous 1F1B (m = 4 micro-batches, one update per batch of 32),
asynchronous 1F1B without weight stashing, PipeDream weight stashing and SpecTrain (staggered
prediction), which update after every micro-batch. A plan step fills and drains the pipeline, so
the asynchronous kinds run plan steps of m = 32 micro-batches (= 8 synchronous steps): all but the
first and last M - 1 micro-batches see the steady-state staleness M - 1 - k on stage k. "step"
below counts batches of 32 samples for every schedule. Claim checked: prediction and stashing
stay near the synchronous result while no-stash degrades as stages grow.

Tasks are generated locally and deterministic: a narrow ResNet-20 on 3x16x16 N(0,1) images
labelled by a fixed random teacher (argmax over 10 classes of the standardised global means of a
random 3x3 convolution + ReLU); a 2-block GPT on sequences of a fixed random Markov chain (32 tokens, peaked
transitions). Evaluation: loss and accuracy of the current weights on a fixed held-out batch.

The curves come from the single-process emulator `validator.pipeline_reference`, which replays the
simulator's compiled plans with their exact weight versions. The numbers of these schedules depend
on the schedule only, not on timing, and tests/test_pipeline_runtime.py shows that real
multi-process gloo runs end with the emulator's parameters to 1e-5; the emulator makes hundreds
of steps affordable here. Run: python benchmarks/bench_convergence.py [--steps 120]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from accuracy_plots import loss_legend
from simulator import load_scenario, simulate
from simulator.output import write_text_atomic
from validator.pipeline_reference import emulate

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = {  # label -> (kind, strategy options)
    "sync 1F1B": ("1f1b", {}),
    "async no-stash": ("pipedream", {"weight_stashing": False}),
    "PipeDream stash": ("pipedream", {"weight_stashing": True}),
    "SpecTrain": ("spectrain", {"weight_prediction": "staggered"}),
}
MODELS = {
    "cnn": {"name": "resnet20", "params": {"width_multiplier": 0.5, "image_size": 16, "num_classes": 10}},
    "transformer": {"name": "transformer", "params": {"num_layers": 2, "hidden_size": 32, "num_heads": 4,
                                                      "seq_len": 16, "vocab_size": 32}},
}
BATCH, MICROBATCHES = 32, 4
ASYNC_WINDOW = 8
"""Synchronous steps per asynchronous plan step (m = MICROBATCHES * ASYNC_WINDOW micro-batches)."""


def teacher_task(model: str, seed: int = 7):
    """batch(num_samples, seed) -> (inputs, targets) of a fixed teacher (module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    if model == "cnn":
        kernel = torch.randn(10, 3, 3, 3, generator=generator)
        score = lambda images: F.conv2d(images, kernel, padding=1).relu().mean(dim=(2, 3))  # noqa: E731
        reference = score(torch.randn(2048, 3, 16, 16, generator=generator))
        center, scale = reference.mean(0), reference.std(0)

        def batch(num_samples: int, batch_seed: int):
            images = torch.randn(num_samples, 3, 16, 16, generator=torch.Generator().manual_seed(batch_seed))
            return images, ((score(images) - center) / scale).argmax(dim=1)
        return batch
    transitions = torch.softmax(3.0 * torch.randn(32, 32, generator=generator), dim=1)

    def batch(num_samples: int, batch_seed: int):
        g = torch.Generator().manual_seed(batch_seed)
        tokens = torch.empty(num_samples, 17, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, 32, (num_samples,), generator=g)
        for t in range(16):
            tokens[:, t + 1] = torch.multinomial(transitions[tokens[:, t]], 1, generator=g).squeeze(1)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return batch


def compiled_plan(model: str, kind: str, stages: int, options: dict, window: int):
    result = simulate(load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": stages, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MODELS[model],
        "strategy": {"kind": kind, "num_microbatches": MICROBATCHES * window, **options},
        "training": {"global_batch_size": BATCH * window, "optimizer": "momentum"}}))
    return result.plan, result.workload


def run_case(model: str, stages: int, label: str, steps: int, learning_rate: float, eval_every: int) -> list[dict]:
    """Rows per step of 32 samples; asynchronous plan steps cover `ASYNC_WINDOW` of them."""
    kind, options = SCHEDULES[label]
    window = 1 if kind == "1f1b" else ASYNC_WINDOW
    plan, workload = compiled_plan(model, kind, stages, options, window)
    task = teacher_task(model)

    def batch(plan_step: int):
        parts = [task(BATCH, 1000 + plan_step * window + k) for k in range(window)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    result = emulate(plan, workload, steps // window, "momentum", learning_rate, batch_fn=batch,
                     eval_batch=task(256, 99), eval_every=eval_every // window)
    evaluations = {row["step"] * window: row for row in result.evaluations}
    losses = [loss for step in result.microbatch_losses for loss in step]
    return [{"model": model, "stages": stages, "schedule": label, "step": step + 1,
             "train_loss": sum(losses[step * MICROBATCHES:(step + 1) * MICROBATCHES]) / MICROBATCHES,
             "eval_loss": evaluations.get(step + 1, {}).get("loss"),
             "eval_accuracy": evaluations.get(step + 1, {}).get("accuracy")}
            for step in range(len(losses) // MICROBATCHES)]


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (model, stages, label), case in frame.groupby(["model", "stages", "schedule"], sort=False):
        evaluated = case.dropna(subset=["eval_loss"])
        rows.append({"model": model, "stages": stages, "schedule": label,
                     "train_loss_last10": case["train_loss"].tail(10).mean(),
                     "eval_loss": evaluated["eval_loss"].iloc[-1],
                     "eval_accuracy": evaluated["eval_accuracy"].iloc[-1],
                     "eval_loss_mean": evaluated["eval_loss"].mean()})
    table = pd.DataFrame(rows)
    sync = table[table["schedule"] == "sync 1F1B"].set_index(["model", "stages"])["eval_loss"]
    sync_mean = table[table["schedule"] == "sync 1F1B"].set_index(["model", "stages"])["eval_loss_mean"]
    table["eval_loss_vs_sync"] = [row.eval_loss - sync[(row.model, row.stages)] for row in table.itertuples()]
    table["mean_vs_sync"] = [row.eval_loss_mean - sync_mean[(row.model, row.stages)] for row in table.itertuples()]
    return table


def plot(frame: pd.DataFrame, model: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    stage_counts = sorted(frame["stages"].unique())
    figure, axes = plt.subplots(1, len(stage_counts), figsize=(6 * len(stage_counts), 4), sharey=True)
    for axis, stages in zip(axes, stage_counts):
        for label in SCHEDULES:
            case = frame[(frame["model"] == model) & (frame["stages"] == stages) & (frame["schedule"] == label)]
            line, = axis.plot(case["step"], case["train_loss"].rolling(10, min_periods=1).mean(), alpha=0.35)
            evaluated = case.dropna(subset=["eval_loss"])
            axis.plot(evaluated["step"], evaluated["eval_loss"], color=line.get_color(), marker="o",
                      markersize=3, label=label)
        axis.set_title(f"{model}, {stages} stages")
        axis.set_xlabel(f"step ({BATCH} samples)")
        axis.grid(alpha=0.3)
    loss_legend(axes[0])
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=ASYNC_WINDOW, help="steps; a multiple of 8")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--out", default=str(ROOT / "reports"))
    parser.add_argument("--replot", action="store_true", help="table and plots from OUT/convergence.csv only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    started = time.perf_counter()
    cases = [(model, int(stages), label) for model in MODELS for stages in args.stages.split(",") for label in SCHEDULES]
    if args.replot:
        frame = pd.read_csv(out / "convergence.csv")
    else:
        rows = []
        from rich.progress import track
        for model, stages, label in track(cases, description="emulating", transient=True):
            rows += run_case(model, stages, label, args.steps, args.learning_rate, args.eval_every)
        frame = pd.DataFrame(rows)
        write_text_atomic(out / "convergence.csv", frame.to_csv(index=False))
    for model in MODELS:
        plot(frame, model, out / f"convergence_{model}.png")
    table = summary(frame)
    print("eval_loss: held-out loss at the end; eval_loss_mean: over all evaluations (speed of descent); "
          "*_vs_sync: minus sync 1F1B's")
    print(f"Convergence after {frame['step'].max()} steps of {BATCH} samples (micro-batches of {BATCH // MICROBATCHES}, "
          f"asynchronous plan steps of {MICROBATCHES * ASYNC_WINDOW} micro-batches, momentum SGD lr "
          f"{args.learning_rate}); curves from the plan emulator (validator.pipeline_reference), which "
          f"real gloo runs match to 1e-5 (tests/test_pipeline_runtime.py)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {out / 'convergence.csv'}, {out}/convergence_{{{','.join(MODELS)}}}.png "
          f"in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
