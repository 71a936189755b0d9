"""Accuracy on published FSDP runs on GPUs: MosaicML's MPT training benchmarks (LLM Foundry on
Composer and PyTorch FSDP, FULL_SHARD over every GPU, amp_bf16, flash attention), 52 runs on H100
80 GB (8-64 GPUs) and 59 on A100 80 GB (8 GPUs), models of 125M to 70B parameters, sequences of
512 to 65,536 tokens, with and without activation checkpointing; and torchtitan's LLaMA runs with
FSDP2 on 64 A100 80 GB.

Source: mosaicml/llm-foundry, `scripts/train/benchmarking/README.md` (Apache-2.0), tables "H100
80GB BF16" and "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", their amp_bf16 / DEFAULT /
FULL_SHARD rows. Transcribed into `scenarios/runs/mpt_fsdp_llm_foundry.csv` (the `ghpsim fit`
RUNS format: a base scenario per GPU, `mpt_fsdp_{h100,a100}_node.yaml`, and each row's model size,
sequence, node count, gradient accumulation, batch and activation checkpointing); a step is the
row's tokens per batch over its tokens per second. The MPT models of the benchmark are GPT-style
(biases, LayerNorm, learned positions, tied embedding): each row's parameter count equals the
table's to the parameter (a test).

Source of the torchtitan rows: pytorch/torchtitan `docs/performance.md` (BSD-3-Clause, commit
0413364), "Llama 3 performance numbers" and "Llama 2 performance numbers", FSDP2 on 64 A100 80 GB:
the rows whose activation checkpointing is one of the model's (none, full): LLaMA-3 70B at local
batch 1, LLaMA-2 13B and 70B at local batch 2 (`scenarios/runs/torchtitan_fsdp2_a100.csv`, base
`torchtitan_llama_a100.yaml`: fp32 gradient reduction, torchtitan's default; DGX A100 nodes with 8
HDR NICs assumed, the table naming no network). Its rows with "selective" checkpointing (every other
block, or an operator policy) are left out. A step is the local batch's tokens over the table's
tokens per second a GPU (its MFU column checks that the figure is per GPU).

Prints, per table and GPU:
- `datasheet`: the catalogue as a scenario gets it, nothing fitted;
- `5-fold`: `ghpsim fit`'s parameters (host time, GEMM ceiling and, these runs using flash
  attention, the attention kernel's ceiling) chosen on the GPU's other rows by 5-fold
  cross-validation, every row scored by the fold that did not see it (what a team calibrating on
  its own logs gets; tables of at least `MIN_FIT_ROWS` rows);
with MAPE, mean signed error, worst, and the mean signed error by sequence length and model size;
and how many runs the predicted peak memory fits on the GPU (all trained; the table's micro-batches
are the largest that fit, so their peaks lie near the 80 GB).

    python benchmarks/bench_published_fsdp.py [--no-fit] [--processes N] [--json] [--plot FILE.png]
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
from simulator.fit import PointCache, fit_refined, fitted_grid, predict_s, read_runs  # noqa: E402
from accuracy_plots import add_report_options, pyplot, save  # noqa: E402
from simulator.fit_plot import predicted_against_measured  # noqa: E402
from simulator.output import check_figure_file  # noqa: E402

RUNS_CSV = ROOT / "scenarios" / "runs" / "mpt_fsdp_llm_foundry.csv"
TORCHTITAN_CSV = ROOT / "scenarios" / "runs" / "torchtitan_fsdp2_a100.csv"
TABLES = (("MPT", RUNS_CSV), ("torchtitan", TORCHTITAN_CSV))
MIN_FIT_ROWS = 10
"""A table with fewer rows is scored with the datasheet only (5 folds of 2-3 rows say little)."""


def _predictions(args: tuple) -> list[float]:
    runs, point = args
    return [predict_s(run, point) for run in runs]


def _datasheet(runs) -> list[tuple[float, float, float]]:
    """Per run: the datasheet step time (s), predicted peak memory and the GPU's memory (bytes)."""
    from simulator.scenario import scenario_from_dict
    from simulator.simulate import simulate
    out = []
    for run in runs:
        scenario = scenario_from_dict(run.document, run.where)
        summary = simulate(scenario).summary
        out.append((summary["step_time_s"], summary["memory"]["peak_memory_bytes"], scenario.cluster.gpu.memory_bytes))
    return out


def error_table(runs, predicted: list[float]) -> dict:
    """MAPE, mean signed, worst (percent) and the mean signed error by sequence and by model width."""
    errors = [100 * (p - run.measured_s) / run.measured_s for run, p in zip(runs, predicted)]

    def by(key) -> dict[str, float]:
        groups: dict[int, list[float]] = {}
        for run, error in zip(runs, errors):
            groups.setdefault(key(run.document), []).append(error)
        return {str(k): round(statistics.fmean(v), 1) for k, v in sorted(groups.items())}

    return {"rows": len(runs), "mape_pct": statistics.fmean(abs(e) for e in errors),
            "mean_signed_pct": statistics.fmean(errors), "worst_pct": max(abs(e) for e in errors),
            "mean_signed_by_seq_len_pct": by(lambda d: d["model"]["params"]["seq_len"]),
            "mean_signed_by_hidden_pct": by(lambda d: d["model"]["params"]["hidden_size"])}


def group_figures(runs, pool, fit: bool) -> dict:
    """The datasheet predictions of one table's rows on one GPU and, with `fit`, the 5-fold held-out ones."""
    predicted = pool.apply(_datasheet, (runs,))
    datasheet = [step_s for step_s, _, _ in predicted]
    over = [peak / capacity - 1 for _, peak, capacity in predicted if peak > capacity]
    out = {"datasheet": error_table(runs, datasheet), "datasheet_s": datasheet,
           "memory": {"runs_that_fit": len(runs) - len(over), "largest_excess_pct": 100 * max(over, default=0.0)}}
    if fit:
        measured = [run.measured_s for run in runs]
        evaluate = PointCache(lambda points: pool.map(_predictions, [(runs, point) for point in points]))
        result = fit_refined(evaluate, measured, k=5, seed=0, grid=fitted_grid(runs))
        out.update(five_fold=error_table(runs, result.held_out), five_fold_s=result.held_out,
                   parameters=result.best, spread=result.spread)
    return out


def write_accuracy_plot(by_group: dict, path: Path) -> Path:
    """Predicted against measured step time per table and GPU: datasheet (hollow) and 5-fold held out (filled)."""
    figure, axes = pyplot().subplots(1, len(by_group), figsize=(5.2 * len(by_group), 5), squeeze=False)
    for axis, (group, (runs, figures)) in zip(axes[0], by_group.items()):
        measured = [run.measured_s for run in runs]
        axis.scatter(measured, figures["datasheet_s"], s=14, facecolors="none", edgecolors="tab:red",
                     label=f"datasheet: MAPE {figures['datasheet']['mape_pct']:.1f} %")
        if "five_fold_s" in figures:
            axis.scatter(measured, figures["five_fold_s"], s=10, color="tab:blue",
                         label=f"5-fold held out: MAPE {figures['five_fold']['mape_pct']:.1f} %")
        predicted_against_measured(axis, 0.6 * min(measured), 1.5 * max(measured), "s", f"{group}: {len(runs)} runs")
        axis.legend(fontsize=7)
    return save(figure, path, "published FSDP runs (LLM Foundry MPT, torchtitan LLaMA; full shard, bf16, flash attention)")


def _print(name: str, table: dict) -> None:
    print(f"  {name}: {table['rows']} runs, MAPE {table['mape_pct']:.1f} %, mean signed {table['mean_signed_pct']:+.1f} %, "
          f"worst {table['worst_pct']:.1f} %")
    for group in ("seq_len", "hidden"):
        values = table[f"mean_signed_by_{group}_pct"]
        print(f"      mean signed by {group}: " + ", ".join(f"{k} {v:+.1f} %" for k, v in values.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--no-fit", action="store_true", help="skip the cross-validated fit (minutes)")
    add_report_options(parser)
    args = parser.parse_args(argv)
    try:
        if args.plot is not None:
            check_figure_file(args.plot, "--plot")
        tables = [(name, read_runs(path)) for name, path in TABLES]
    except ScenarioError as error:
        print(f"bench_published_fsdp: error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    runs_by_group: dict[str, list] = {}  # "table GPU" -> its runs
    for name, runs in tables:
        for run in runs:
            runs_by_group.setdefault(f"{name} {run.document['cluster']['gpu']}", []).append(run)
    with multiprocessing.get_context("spawn").Pool(max(1, args.processes)) as pool:
        by_group = {group: (runs, group_figures(runs, pool, not args.no_fit and len(runs) >= MIN_FIT_ROWS))
                    for group, runs in runs_by_group.items()}
    if args.plot is not None:
        write_accuracy_plot(by_group, args.plot)
    figures = {group: {key: value for key, value in found.items() if not key.endswith("_s")}
               for group, (_, found) in by_group.items()}
    if args.json:
        print(json.dumps({"tables": figures, "wall_s": time.perf_counter() - started}, indent=2))
        return 0
    for group, table in figures.items():
        print(f"{group}:")
        _print("datasheet, nothing fitted", table["datasheet"])
        memory = table["memory"]
        excess = (f"; the others over by at most {memory['largest_excess_pct']:.1f} %"
                  if memory["runs_that_fit"] < table["datasheet"]["rows"] else "")
        print(f"      predicted peak memory: {memory['runs_that_fit']} of {table['datasheet']['rows']} runs fit the GPU, "
              f"where all trained{excess}")
        if "five_fold" in table:
            _print("5-fold held out", table["five_fold"])
            print("      parameters (all rows): " + ", ".join(
                f"{k} {v:.3g} +- {table['spread'][k]:.2g}" for k, v in table["parameters"].items()))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
