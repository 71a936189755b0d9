"""Accuracy on published FP8 training runs on H100: NVIDIA's pre-training throughput tables for NeMo
and Megatron-Bridge on DGX H100 (Megatron-Core with Transformer Engine FP8), 13 runs of GPT-3 5B to
175B and LLaMA-2 / LLaMA-3 8B to 405B on 8 to 1,024 GPUs, with tensor, pipeline (interleaved),
context and data parallelism.

Sources: NeMo Framework documentation, "Performance" (24.12 release, the DGX H100 table: FP8 with
Transformer Engine's default delayed scaling), and NVIDIA-NeMo/Megatron-Bridge `docs/performance-
summary.md` and `docs/performance-summary-archive.md` (25.11 and 26.02 containers, DGX-H100 rows,
"FP8-CS": per-tensor current scaling). Transcribed into `scenarios/runs/nemo_fp8_h100.csv` (the
`ghpsim fit` RUNS format; base `nemo_fp8_dgx_h100.yaml`, which states the settings the tables leave
out); a step is the global batch's tokens over the table's tokens per second a GPU x the GPUs.
Left out: the Nemotron rows (no preset of that model), the MoE rows (expert balance forced by the
benchmark) and an FSDP row whose recompute the table does not state.

Scored with the datasheet catalogue: nothing in the model was chosen on these rows. Prints each
run's error, MAPE, mean signed and worst error, the mean signed error by scaling recipe and by
model, and how many runs the predicted peak memory fits on the 80 GB (all trained).

    python benchmarks/bench_published_fp8.py [--processes N] [--json] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.errors import ScenarioError  # noqa: E402
from simulator.fit import read_runs  # noqa: E402
from accuracy_plots import add_report_options, pyplot, save  # noqa: E402
from simulator.fit_plot import predicted_against_measured  # noqa: E402
from simulator.output import check_figure_file  # noqa: E402

RUNS_CSV = ROOT / "scenarios" / "runs" / "nemo_fp8_h100.csv"


def label(document: dict) -> str:
    """A run's name: its model (GPT rows by size), GPU count and layout."""
    model, strategy, cluster = document["model"], document["strategy"], document["cluster"]
    name = model["name"]
    if name == "transformer":
        params = model["params"]
        name = {24: "gpt3-5b", 44: "gpt3-20b", 96: "gpt3-175b"}.get(params["num_layers"], "gpt")
    layout = "x".join(f"{key}{strategy.get(f'{key}_degree', 1)}" for key in ("tp", "pp", "cp"))
    return (f"{name} on {cluster['num_nodes'] * cluster['gpus_per_node']}, {layout}, "
            f"batch {document['training']['global_batch_size']}, {document['training']['fp8_recipe']}")


def predict(run) -> tuple[float, float, float]:
    """(predicted step s, predicted peak memory bytes, the GPU's memory bytes) of one run."""
    from simulator.scenario import scenario_from_dict
    from simulator.simulate import simulate
    scenario = scenario_from_dict(run.document, run.where, run.base_dir)
    summary = simulate(scenario).summary
    return summary["step_time_s"], summary["memory"]["peak_memory_bytes"], scenario.cluster.gpu.memory_bytes


def figures(runs, predicted) -> dict:
    """MAPE, mean signed and worst error (percent), by recipe and by model, and the memory check."""
    errors = [100 * (step_s / run.measured_s - 1) for run, (step_s, _, _) in zip(runs, predicted)]

    def by(key) -> dict[str, float]:
        groups: dict[str, list[float]] = {}
        for run, error in zip(runs, errors):
            groups.setdefault(key(run.document), []).append(error)
        return {group: round(statistics.fmean(values), 1) for group, values in groups.items()}

    return {"rows": [{"run": label(run.document), "measured_s": run.measured_s, "predicted_s": step_s,
                      "error_pct": error, "peak_memory_gib": peak / 2**30, "fits": peak <= capacity}
                     for run, (step_s, peak, capacity), error in zip(runs, predicted, errors)],
            "mape_pct": statistics.fmean(abs(error) for error in errors),
            "mean_signed_pct": statistics.fmean(errors), "worst_pct": max(abs(error) for error in errors),
            "mean_signed_by_recipe_pct": by(lambda d: d["training"]["fp8_recipe"]),
            "mean_signed_by_model_pct": by(lambda d: label(d).split(" on ")[0]),
            "runs_that_fit": sum(peak <= capacity for _, peak, capacity in predicted)}


def write_accuracy_plot(runs, result: dict, path: Path) -> Path:
    figure, axis = pyplot().subplots(figsize=(5.5, 5))
    measured = [row["measured_s"] for row in result["rows"]]
    axis.scatter(measured, [row["predicted_s"] for row in result["rows"]], s=16, color="tab:red",
                 label=f"datasheet: MAPE {result['mape_pct']:.1f} %")
    predicted_against_measured(axis, 0.6 * min(measured), 1.5 * max(measured), "s", f"{len(runs)} runs")
    axis.legend(fontsize=7)
    return save(figure, path, "published FP8 runs on DGX H100 (NeMo, Megatron-Bridge)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    add_report_options(parser)
    args = parser.parse_args(argv)
    try:
        if args.plot is not None:
            check_figure_file(args.plot, "--plot")
        runs = read_runs(RUNS_CSV)
    except ScenarioError as error:
        print(f"bench_published_fp8: error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(max(1, args.processes)) as pool:
        predicted = pool.map(predict, runs)
    result = figures(runs, predicted)
    if args.plot is not None:
        write_accuracy_plot(runs, result, args.plot)
    if args.json:
        print(json.dumps({**result, "wall_s": time.perf_counter() - started}, indent=2))
        return 0
    print("published FP8 runs on DGX H100, datasheet, nothing fitted:")
    print(f"{'run':<48} {'measured s':>10} {'predicted s':>11} {'error':>7} {'peak GiB':>9}")
    for row in result["rows"]:
        memory = f"{row['peak_memory_gib']:.1f}" + ("" if row["fits"] else "*")
        print(f"{row['run']:<48} {row['measured_s']:>10.3f} {row['predicted_s']:>11.3f} "
              f"{row['error_pct']:>+6.1f}% {memory:>9}")
    print(f"{len(runs)} runs: MAPE {result['mape_pct']:.1f} %, mean signed {result['mean_signed_pct']:+.1f} %, "
          f"worst {result['worst_pct']:.1f} %")
    for group in ("recipe", "model"):
        values = result[f"mean_signed_by_{group}_pct"]
        print(f"  mean signed by {group}: " + ", ".join(f"{k} {v:+.1f} %" for k, v in values.items()))
    print(f"predicted peak memory fits the GPU in {result['runs_that_fit']} of {len(runs)} runs, where all trained"
          + ("" if result["runs_that_fit"] == len(runs) else " (* over)"))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
