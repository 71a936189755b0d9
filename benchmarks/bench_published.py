"""Accuracy on published GPU measurements: 1,440 Megatron-DeepSpeed iteration times on one 8xA100
node (`shared/data/published/vtrain_a100_single_node.csv`, Bang et al., vTrain, MICRO 2024).

Each row becomes a scenario (GPT, seq 1024, vocabulary 50257, fp16, Adam, full recompute, 1F1B,
gradients reduced after the backward, TP x PP x DP on one DGX A100 node with NVSwitch: the
authors' settings) and is simulated. Prints, for each model: MAPE,
mean signed error, worst, the share within 10 %, and the mean signed error per tensor-parallel
degree, pipeline degree, micro-batch size and hidden size.

- `analytic`: the roofline at a fixed efficiency per layer kind (`costs.model: analytic`);
- `kernel, datasheet`: the kernel model with the datasheet parameters alone and a host that never
  holds the GPU back (`costs.host_overhead_s: 0`), nothing chosen on these rows;
- `kernel, catalogue`: the catalogue as a scenario gets it, whose host time per kernel
  (`simulator.kernel_catalogue.HOST_OVERHEAD_S`) was chosen on these rows: scored in sample (the
  5-fold figure below is its held-out error);
- `kernel, 5-fold`: `ghpsim fit`'s parameters (its grid `simulator.fit.FITTED`, refined around
  the best point) chosen by 5-fold cross-validation, every row scored by the fold that did not see it;
- `kernel, half`: fitted on a random half of the rows (seed 0), scored on the other half.
For each model it also scores the choice a planner makes from it (`layout_choice`): the rows that
train the same model on the same GPUs with the same global batch are one job's candidate layouts
(TP x PP x DP and micro-batch size); the layout predicted fastest is run, and its regret is its
measured time over the job's measured fastest, minus 1.
Also prints the model FLOPs utilisation of every GPT scenario in `scenarios/`. `--plot FILE.png`
draws predicted against measured for every row: the datasheet model beside the 5-fold held-out one
(with --no-fit, the catalogue's, in sample), coloured by tensor-parallel degree
(`reports/published_a100_accuracy.png`).

    python benchmarks/bench_published.py [--rows N] [--no-fit] [--json] [--csv PATH] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.errors import ScenarioError  # noqa: E402
from accuracy_plots import pyplot, save  # noqa: E402
from simulator.fit_plot import predicted_against_measured  # noqa: E402
from simulator.output import check_figure_file  # noqa: E402
from simulator.fit import PointCache, Run, fit_refined, folds, predict_s, refined_search  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from simulator.units import plural  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "published" / "vtrain_a100_single_node.csv"
COLUMNS = {"# GPUs": "num_gpus", "global batch": "global_batch", "micro batch": "micro_batch",
           "hidden size": "hidden", "attention heads": "heads", "# layers": "layers",
           "sequence length": "seq", "tensor parallelism": "tp", "data parallelism": "dp",
           "pipeline parallelism": "pp", "iteration time (ms)": "measured_ms"}
VOCABULARY = 50257
"""GPT-2 tokenizer, as in the authors' validation configurations (the data's README)."""


def read_rows(path: Path = DATA) -> pd.DataFrame:
    """The published rows with short column names; ScenarioError naming the file if unreadable."""
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as error:
        raise ScenarioError(f"{path}: cannot read the published measurements: {error}") from None
    missing = sorted(set(COLUMNS) - set(frame.columns))
    if missing:
        raise ScenarioError(f"{path}: missing columns {missing}")
    return frame.rename(columns=COLUMNS)


def row_scenario(row) -> dict:
    """The scenario of one published run (settings from the data's README)."""
    num_microbatches = int(row.global_batch) // (int(row.micro_batch) * int(row.dp))
    return {
        "name": f"vtrain_t{row.tp}p{row.pp}d{row.dp}_h{row.hidden}_l{row.layers}_b{row.micro_batch}",
        "cluster": {"num_nodes": 1, "gpus_per_node": int(row.num_gpus), "gpu": "A100-80GB",
                    "intra_node_link": "nvlink3-a100", "inter_node_link": "ib-hdr"},
        "model": {"name": "transformer", "params": {
            "num_layers": int(row.layers), "hidden_size": int(row.hidden), "num_heads": int(row.heads),
            "seq_len": int(row.seq), "vocab_size": VOCABULARY}},
        "strategy": {"kind": "megatron", "tp_degree": int(row.tp), "pp_degree": int(row.pp),
                     "num_microbatches": num_microbatches, "overlap_backward": False,
                     "partition": "uniform"},  # Megatron-DeepSpeed: partition_method="type:transformer"
        "training": {"global_batch_size": int(row.global_batch), "dtype": "fp16", "optimizer": "adam",
                     "recompute": "full"},
    }


def predict_ms(frame: pd.DataFrame, overrides: dict | None = None) -> list[float]:
    """Predicted iteration time (ms) of every row; `overrides` merge into each scenario's sections."""
    out = []
    for row in frame.itertuples(index=False):
        document = row_scenario(row)
        for section, values in (overrides or {}).items():
            document[section] = {**document.get(section, {}), **values}
        out.append(1e3 * simulate(scenario_from_dict(document)).step_time_s)
    return out


def _runs(frame: pd.DataFrame) -> list[Run]:
    return [Run(row_scenario(row), row.measured_ms / 1e3, f"row {i}") for i, row in enumerate(frame.itertuples(index=False))]


def _point_predictions_ms(args: tuple) -> list[float]:
    runs, point = args
    return [1e3 * predict_s(run, point) for run in runs]


def fitted_figures(frame: pd.DataFrame, processes: int) -> dict:
    """The 5-fold and the half-split figures of `ghpsim fit`'s search (module docstring)."""
    runs, measured = _runs(frame), list(frame.measured_ms)
    with multiprocessing.Pool(processes) as pool:
        evaluate = PointCache(lambda points: pool.map(_point_predictions_ms, [(runs, point) for point in points]))
        five = fit_refined(evaluate, measured, k=5, seed=0)
        train, test = folds(len(frame), 2, seed=0)
        chosen = refined_search(evaluate, measured, train)
        predicted = evaluate([chosen])[0]
    half = frame.iloc[test].assign(predicted_ms=[predicted[r] for r in test])
    return {"five_fold": error_table(frame.assign(predicted_ms=five.held_out)), "five_fold_ms": list(five.held_out),
            "five_fold_parameters": five.best, "five_fold_spread": five.spread,
            "half": error_table(half), "half_parameters": chosen,
            "points_simulated": len(evaluate.predictions)}


def gpt_mfu() -> dict:
    """MFU of every GPT-style scenario in `scenarios/` (GPT, LLaMA, BLOOM) with the datasheet kernel model."""
    out = {}
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if path.name.startswith(("gpt", "llama", "bloom")):
            from simulator.scenario import load_scenario
            try:
                out[path.name] = simulate(load_scenario(path)).summary["mfu"]
            except ScenarioError as error:
                print(f"bench_published: {path.name}: {error}", file=sys.stderr)
    return out


def error_table(frame: pd.DataFrame) -> dict:
    """MAPE, mean signed, worst, share within 10 % and the signed error by group, in percent."""
    error = 100 * (frame.predicted_ms - frame.measured_ms) / frame.measured_ms
    groups = {name: {str(key): round(float(part.mean()), 1) for key, part in error.groupby(frame[name])}
              for name in ("tp", "pp", "micro_batch", "hidden")}
    return {"rows": len(frame), "mape_pct": float(error.abs().mean()), "mean_signed_pct": float(error.mean()),
            "worst_pct": float(error.abs().max()), "within_10_pct_share": float((error.abs() <= 10).mean()),
            "mean_signed_by_group_pct": groups}


def write_accuracy_plot(frame: pd.DataFrame, panels: dict[str, list[float]], path: Path) -> Path:
    """Predicted against measured iteration time, one panel per model in `panels` (title ->
    predicted ms per row), points coloured by tensor-parallel degree."""
    figure, axes = pyplot().subplots(1, len(panels), figsize=(5.2 * len(panels), 5), squeeze=False)
    low, high = 0.8 * frame.measured_ms.min(), 1.25 * frame.measured_ms.max()
    for axis, (title, predicted) in zip(axes[0], panels.items()):
        table = error_table(frame.assign(predicted_ms=predicted))
        for tp, part in frame.assign(predicted_ms=predicted).groupby("tp"):
            axis.scatter(part.measured_ms, part.predicted_ms, s=5, alpha=0.6, label=f"TP {tp}")
        predicted_against_measured(axis, low, high, "ms",
                                   f"{title}\nMAPE {table['mape_pct']:.1f} %, worst {table['worst_pct']:.1f} %")
        axis.legend(fontsize=7, markerscale=2)
    return save(figure, path, f"{len(frame):,} published Megatron-DeepSpeed iterations on one 8xA100 node")


JOB_COLUMNS = ("num_gpus", "global_batch", "hidden", "heads", "layers", "seq")
"""A training job: the rows sharing these are its candidate layouts (`layout_choice`)."""


def layout_choice(frame: pd.DataFrame, predicted_ms) -> dict:
    """How well the predictions pick each job's layout (module docstring): jobs of two or more
    layouts, the share whose predicted-fastest layout is the measured fastest, the regret of the
    pick (median, mean, worst, in percent), the mean regret of a layout drawn at random (the bar a
    planner must clear) and the median Spearman rank correlation of predicted and measured times
    over the jobs of three or more layouts."""
    frame = frame.assign(predicted_ms=list(predicted_ms))
    regrets, random_pick, correlations = [], [], []
    for _job, layouts in frame.groupby(list(JOB_COLUMNS)):
        if len(layouts) < 2:
            continue
        fastest_ms = layouts.measured_ms.min()
        regrets.append(100 * (layouts.measured_ms[layouts.predicted_ms.idxmin()] / fastest_ms - 1))
        random_pick.append(100 * float((layouts.measured_ms / fastest_ms - 1).mean()))
        correlation = layouts.predicted_ms.corr(layouts.measured_ms, method="spearman") if len(layouts) > 2 else None
        if correlation is not None and correlation == correlation:  # not NaN: some order among the predictions
            correlations.append(float(correlation))
    if not regrets:
        return {"jobs": 0}
    regret = pd.Series(regrets, dtype=float)
    return {"jobs": len(regrets), "fastest_picked_share": float((regret == 0).mean()),
            "median_regret_pct": float(regret.median()), "mean_regret_pct": float(regret.mean()),
            "worst_regret_pct": float(regret.max()), "random_pick_mean_regret_pct": float(pd.Series(random_pick).mean()),
            "median_spearman": float(pd.Series(correlations).median()) if correlations else None}


def _print_choice(choice: dict) -> None:
    if not choice["jobs"]:
        print("    layout choice: no job has two layouts")
        return
    print(f"    layout choice over {plural(choice['jobs'], 'job')}: fastest picked in {100 * choice['fastest_picked_share']:.0f} %, "
          f"regret median {choice['median_regret_pct']:.1f} %, mean {choice['mean_regret_pct']:.1f} %, worst "
          f"{choice['worst_regret_pct']:.1f} % (a random layout: mean {choice['random_pick_mean_regret_pct']:.1f} %)"
          + (f"; rank correlation median {choice['median_spearman']:.2f}" if choice["median_spearman"] is not None else ""))


def _print_table(name: str, table: dict) -> None:
    print(f"{name}: {table['rows']} rows, MAPE {table['mape_pct']:.1f} %, mean signed {table['mean_signed_pct']:+.1f} %, "
          f"worst {table['worst_pct']:.1f} %, {100 * table['within_10_pct_share']:.0f} % of rows within 10 %")
    for group, by_key in table["mean_signed_by_group_pct"].items():
        print(f"    mean signed by {group}: " + ", ".join(f"{key} {value:+.1f} %" for key, value in by_key.items()))
    if "layout_choice" in table:
        _print_choice(table["layout_choice"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rows", type=int, default=None, help="score only the first N rows (default: all)")
    parser.add_argument("--no-fit", action="store_true", help="skip the cross-validated fit (minutes)")
    parser.add_argument("--processes", type=int, default=os.cpu_count(), help="worker processes of the fit")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--csv", type=Path, default=DATA, help="the published measurements (default: %(default)s)")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="draw predicted against measured for every row into this figure")
    args = parser.parse_args(argv)
    try:
        if args.plot is not None:
            check_figure_file(args.plot, "--plot")
        frame = read_rows(args.csv)
    except ScenarioError as error:
        print(f"bench_published: error: {error}", file=sys.stderr)
        return 2
    if args.rows is not None:
        frame = frame.head(args.rows)
    started = time.perf_counter()
    datasheet_ms, catalogue_ms = predict_ms(frame, {"costs": {"host_overhead_s": 0}}), predict_ms(frame)
    analytic_ms = predict_ms(frame, {"costs": {"model": "analytic"}})
    figures = {"analytic": error_table(frame.assign(predicted_ms=analytic_ms)),
               "kernel_datasheet": error_table(frame.assign(predicted_ms=datasheet_ms)),
               "kernel_catalogue": error_table(frame.assign(predicted_ms=catalogue_ms))}
    choices = {"analytic": analytic_ms, "kernel_datasheet": datasheet_ms, "kernel_catalogue": catalogue_ms}
    if not args.no_fit:
        figures.update(fitted_figures(frame, args.processes))
        choices["five_fold"] = figures["five_fold_ms"]
    for name, predicted in choices.items():
        figures[name]["layout_choice"] = layout_choice(frame, predicted)
    if args.plot is not None:
        write_accuracy_plot(frame, {"kernel model, datasheet, no host time": datasheet_ms,
                                    **({"kernel model, catalogue (in sample)": catalogue_ms} if args.no_fit else
                                       {"kernel model, 5-fold held out": figures["five_fold_ms"]})}, args.plot)
    figures.pop("five_fold_ms", None)
    figures["gpt_mfu"] = gpt_mfu()
    figures["wall_s"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    _print_table("analytic (roofline), datasheet", figures["analytic"])
    _print_table("kernel model, datasheet (host time 0)", figures["kernel_datasheet"])
    _print_table("kernel model, catalogue (its host time chosen on these rows: in sample)", figures["kernel_catalogue"])
    if not args.no_fit:
        _print_table("kernel model, 5-fold held-out", figures["five_fold"])
        print("    parameters (all rows): " + ", ".join(
            f"{k} {v:.3g} +- {figures['five_fold_spread'][k]:.2g}" for k, v in figures["five_fold_parameters"].items()))
        _print_table("kernel model, fitted on half, scored on the other half", figures["half"])
        print("    parameters (half): " + ", ".join(f"{k} {v:.3g}" for k, v in figures["half_parameters"].items())
              + f"; {figures['points_simulated']} grid points simulated in all")
    print("MFU of the GPT-style scenarios: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in figures["gpt_mfu"].items()))
    print(f"({figures['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
