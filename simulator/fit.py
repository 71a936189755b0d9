"""`ghpsim fit RUNS.csv --out PROFILE.json`: fit the few physical parameters of the GPU kernel model
to measured step times from a cluster's own training logs, with k-fold held-out error.

RUNS.csv has one row per measured run: a `measured_step_s` column (seconds per training step),
an optional `base` column (a scenario file, relative to the CSV; else `--base`), and any number of
columns named by dotted scenario keys (`strategy.tp_degree`, `training.global_batch_size`,
`model.params.hidden_size`, ...) whose values override the base, as `--set` does.

What is fitted (`FITTED`), each over a bounded grid of physical values:
- `host_overhead_s`: the framework's host time to issue one kernel (eager PyTorch: about 5-25 us
  of CPU work per operator, from the Python call through the dispatcher to cudaLaunchKernel, more
  with a framework's Python hooks around each module); a pass lasts at least its kernel count
  times this;
- `gemm_efficiency`: the fraction of the per-SM dense peak a full GEMM tile sustains.
Everything else stays at the catalogue's sourced values. The search is exhaustive over the grid:
every row is simulated once per grid point, then each fold picks the point with the least MAPE
on its training rows and is scored on its held-out rows (k-fold cross-validation; the folds are
a seeded shuffle). The written parameters are the point that is best on all rows; their
uncertainty is the spread of the folds' choices.
"""

from __future__ import annotations

import copy
import csv
import itertools
import math
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.errors import ScenarioError

MEASURED_COLUMN = "measured_step_s"
FITTED = {
    "host_overhead_s": (0.0, 5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6, 100e-6),
    "gemm_efficiency": (0.65, 0.75, 0.822, 0.9),
}
"""Grid per fitted parameter (bounds: host overhead 0-100 us, GEMM ceiling 0.65-0.9)."""


@dataclass(frozen=True)
class Run:
    """One measured run: its scenario document and measured step time."""

    document: dict
    measured_s: float
    where: str


def read_runs(path: str | Path, base: str | Path | None = None) -> list[Run]:
    """The rows of a RUNS.csv as scenario documents (module docstring); one-line ScenarioErrors
    naming the file, row and column."""
    from simulator.scenario import apply_override, read_yaml
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ScenarioError(f"{path}: cannot read the runs: {error}") from None
    if not rows:
        raise ScenarioError(f"{path}: no runs (expected a header and one row per run)")
    if MEASURED_COLUMN not in rows[0]:
        raise ScenarioError(f"{path}: missing column {MEASURED_COLUMN!r} (seconds per training step)")
    runs, bases = [], {}
    for number, row in enumerate(rows, start=2):
        where = f"{path}:{number}"
        base_file = row.get("base") or base
        if not base_file:
            raise ScenarioError(f"{where}: base: no scenario file (give a `base` column or --base)")
        base_path = (path.parent / base_file) if row.get("base") else Path(base_file)
        if base_path not in bases:
            bases[base_path] = read_yaml(base_path)
        document = copy.deepcopy(bases[base_path])
        for column, value in row.items():
            if column in ("base", MEASURED_COLUMN) or value in (None, ""):
                continue
            apply_override(document, f"{column}={value}", where)
        try:
            measured_s = float(row[MEASURED_COLUMN])
        except ValueError:
            raise ScenarioError(f"{where}: {MEASURED_COLUMN}: {row[MEASURED_COLUMN]!r} is not a number") from None
        if not measured_s > 0:
            raise ScenarioError(f"{where}: {MEASURED_COLUMN}: {measured_s} must be > 0")
        runs.append(Run(document, measured_s, where))
    return runs


def grid_points(grid: dict[str, tuple[float, ...]] | None = None) -> list[dict[str, float]]:
    """Every combination of the grid's values (default `FITTED`)."""
    grid = FITTED if grid is None else grid
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[name] for name in names))]


def predict_s(run: Run, point: dict[str, float] | None) -> float:
    """The run's simulated step time with the kernel model's parameters replaced by `point`."""
    from simulator.kernel_costs import KernelCosts, device_for
    from simulator.model_source import resolve_workload
    from simulator.scenario import scenario_from_dict
    from simulator.simulate import simulate
    scenario = scenario_from_dict(run.document, run.where)
    if point is None:
        return simulate(scenario).step_time_s
    workload = resolve_workload(scenario.model, scenario.base_dir)
    training, gpu = scenario.training, scenario.cluster.gpu
    parameters = replace(device_for(gpu, training.dtype).parameters, **point)
    costs = KernelCosts.for_scenario(scenario, workload, parameters)
    return simulate(scenario, costs=costs, workload=workload).step_time_s


def mape_pct(predicted: list[float], measured: list[float]) -> float:
    return 100.0 * statistics.fmean(abs(p - m) / m for p, m in zip(predicted, measured))


def folds(num_rows: int, k: int, seed: int = 0) -> list[list[int]]:
    """k folds of a seeded shuffle of the row indices."""
    order = list(range(num_rows))
    random.Random(seed).shuffle(order)
    return [order[i::k] for i in range(k)]


@dataclass
class FitResult:
    best: dict[str, float]
    spread: dict[str, float]
    """Standard deviation of each parameter over the folds' choices."""
    fold_choices: list[dict[str, float]]
    held_out: list[float]
    """Per row, the prediction from the point its fold chose without it."""
    in_sample_mape_pct: float
    held_out_mape_pct: float


def fit(predictions: list[list[float]], points: list[dict[str, float]], measured: list[float],
        k: int = 5, seed: int = 0) -> FitResult:
    """Choose among `points` (each with its predictions of every row) by k-fold cross-validation."""
    if len(measured) < k:
        raise ScenarioError(f"--folds: {k} folds need at least {k} runs, got {len(measured)}")

    def best_on(rows: list[int]) -> int:
        return min(range(len(points)),
                   key=lambda p: mape_pct([predictions[p][r] for r in rows], [measured[r] for r in rows]))

    held_out, choices = [math.nan] * len(measured), []
    for fold in folds(len(measured), k, seed):
        chosen = best_on(sorted(set(range(len(measured))) - set(fold)))
        choices.append(points[chosen])
        for row in fold:
            held_out[row] = predictions[chosen][row]
    best = best_on(list(range(len(measured))))
    spread = {name: statistics.pstdev(choice[name] for choice in choices) for name in points[0]}
    return FitResult(points[best], spread, choices, held_out, mape_pct(predictions[best], measured),
                     mape_pct(held_out, measured))


def predict_grid(runs: list[Run], points: list[dict[str, float]], progress=None) -> list[list[float]]:
    """Every run simulated at every point (one list of predictions per point)."""
    out = []
    for point in points:
        out.append([predict_s(run, point) for run in runs])
        if progress is not None:
            progress()
    return out


def fit_runs(runs: list[Run], k: int = 5, seed: int = 0, progress=None) -> tuple[FitResult, dict]:
    """Fit `runs` (all on one GPU architecture) and the kernel profile document to write."""
    from simulator.kernel_costs import gpu_architecture
    from simulator.profile import FORMAT
    from simulator.scenario import scenario_from_dict
    architectures = {gpu_architecture(scenario_from_dict(run.document, run.where).cluster.gpu) for run in runs}
    if len(architectures) != 1:
        raise ScenarioError(f"cluster.gpu: the runs mix GPU architectures {sorted(architectures)}; fit one at a time")
    points = grid_points()
    measured = [run.measured_s for run in runs]
    result = fit(predict_grid(runs, points, progress), points, measured, k, seed)
    document = {"format": FORMAT, "kind": "kernel", "architecture": architectures.pop(),
                "parameters": result.best,
                "fit": {"runs": len(runs), "folds": k, "seed": seed,
                        "held_out_mape_pct": result.held_out_mape_pct,
                        "in_sample_mape_pct": result.in_sample_mape_pct,
                        "spread_over_folds": result.spread, "grid": {n: list(v) for n, v in FITTED.items()}}}
    return result, document


def run(args) -> int:
    import json

    from simulator.output import check_output_file, write_json_atomic
    from simulator.profile import profile_from_dict
    from simulator.progress import stderr_progress
    check_output_file(args.out, "--out")
    if args.folds < 2:
        raise ScenarioError(f"--folds: {args.folds} must be at least 2")
    runs = read_runs(args.runs, args.base)
    with stderr_progress(enabled=not args.json) as bar:
        task = bar.add_task(f"fitting {len(runs)} runs", total=len(grid_points()))
        result, document = fit_runs(runs, args.folds, args.seed, progress=lambda: bar.advance(task))
    profile_from_dict(document, args.out)  # the document validates before it is written
    write_json_atomic(args.out, document)
    if args.json:
        print(json.dumps(document["fit"] | {"parameters": result.best}, indent=2))
        return 0
    print(f"{len(runs)} runs, {args.folds}-fold held-out MAPE {result.held_out_mape_pct:.1f} % "
          f"(in sample {result.in_sample_mape_pct:.1f} %)")
    for name, value in result.best.items():
        print(f"  {name} = {value:.4g} +- {result.spread[name]:.2g} (spread over the folds)")
    print(f"kernel profile written to {args.out}: use it with `ghpsim simulate SCENARIO --profile {args.out}`")
    return 0
