"""`ghpsim fit RUNS.csv --out PROFILE.json`: fit the few physical parameters of the GPU kernel model
to measured step times from a cluster's own training logs, with k-fold held-out error.

RUNS.csv has one row per measured run: a `measured_step_s` column (seconds per training step),
an optional `base` column (a scenario file, relative to the CSV; else `--base`), and any number of
columns named by dotted scenario keys (`strategy.tp_degree`, `training.global_batch_size`,
`model.params.hidden_size`, ...) whose values override the base, as `--set` does. An empty cell
keeps the base's value for that row; a column's name is checked whatever its cells hold. Columns
the fit would ignore are refused (`fit_csv.UNSUPPORTED_COLUMNS`: costs.model, costs.efficiency,
costs.host_overhead_s; every run is simulated with the kernel model, whose host time is fitted).
Every row is checked before any fitting (`simulator.fit_csv`: cells against the header, quoting,
a finite measured time within `fit_csv.MEASURED_RANGE_S`, the scenario it gives); the profile is written last.

What is fitted (`FITTED`), each over a bounded grid of physical values:
- `host_overhead_s`: the framework's host time to issue one kernel (eager PyTorch: about 5-25 us
  of CPU work per operator, from the Python call through the dispatcher to cudaLaunchKernel, more
  with a framework's Python hooks around each module); a pass lasts at least its kernel count
  times this;
- `gemm_efficiency`: the fraction of the per-SM dense peak a full GEMM tile sustains;
- `flash_attention_efficiency` (only when a run uses `costs.flash_attention`, `FLASH_FITTED`): the
  same for FlashAttention-2's fused kernel (a run's other implementation, `costs.flash_attention_kernel`,
  keeps its published ratio to it).
The catalogue's own ceilings for the runs' GPUs join their grids (`CATALOGUE_POINTS`), so a fit
can always keep the datasheet. Everything else stays at the catalogue's sourced values. The search
is a grid refined around its best point: every row is simulated at each point of the coarse grid;
the best point (least MAPE) is then searched again among the points half-way to its neighbours in
each `REFINED` parameter, and that `REFINEMENTS` times, so the final spacing is a quarter of the
coarse one (a step is never taken beyond the grid's bounds). Each fold runs this search on its training rows and is scored on its
held-out rows (k-fold cross-validation; the folds are a seeded shuffle); points are simulated once
and shared by the folds. The written parameters are the search's result on all rows; their
uncertainty is the spread of the folds' choices. Each run's held-out prediction is printed with
`--json` and drawn against its measurement with `--plot FILE.png` (`simulator.fit_plot`).

A parameter fitted to an end of its grid (`at_grid_bounds`) may want a value beyond it: the fit of
it is not trustworthy, and `ghpsim fit` says so (a warning line on stderr per parameter, and
`at_grid_bound` in the profile's `fit` and the --json output). A grid end that is a physical
limit (`PHYSICAL_ENDS`: no host time per kernel) is no such warning. On a terminal a bar counts
the simulations (runs x grid points, the total growing as the refinement adds points), with the
elapsed time and an estimate of the time left; off a terminal nothing is drawn.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.fit_csv import read_rows

FITTED = {
    "host_overhead_s": (0.0, 5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6, 100e-6),
    "gemm_efficiency": (0.65, 0.75, 0.822, 0.9),
}
"""Coarse grid per fitted parameter (bounds: host overhead 0-100 us, GEMM ceiling 0.65-0.9)."""
FLASH_FITTED = {"flash_attention_efficiency": (0.15, 0.25, 0.35, 0.5, 0.65)}
"""Added to `FITTED` for runs with flash attention (the catalogue's FlashAttention-2 figures: A100
0.575, H100 0.332 of the dense peak)."""
REFINEMENTS = 2
"""Rounds of refinement around the best point (module docstring): a host time per kernel sets
many runs' pace, so 5-10 us steps are too coarse for it."""
REFINED = ("host_overhead_s",)
"""The parameters refined between grid points. The GEMM ceiling stays on its grid, whose middle is
the measured cuBLASLt figure: refined on the published single-node A100 rows it rose to 0.861,
which made the held-out cluster-scale runs 2.7 points worse (`reports/ACCURACY.md`)."""
PHYSICAL_ENDS = {"host_overhead_s": 0.0}
"""Grid ends that are physical limits, not truncations of the search (`at_grid_bounds`)."""


@dataclass(frozen=True)
class Run:
    """One measured run: its scenario document and measured step time."""

    document: dict
    measured_s: float
    where: str
    base_dir: str = "."
    """The base scenario's folder: a relative model.file or cluster.topology_file is read from it."""
    base_file: str = ""


def read_runs(path: str | Path, base: str | Path | None = None) -> list[Run]:
    """The rows of a RUNS.csv as scenario documents (module docstring), each checked before any
    fitting: its cells against the header, its measured time (`simulator.fit_csv`) and its scenario.
    One-line ScenarioErrors naming the file, row (line of the file) and column, and the bad value."""
    return _read_runs(path, base)[0]


def _read_runs(path: str | Path, base: str | Path | None) -> tuple[list[Run], bool]:
    """`read_runs`, and whether a row used `base` (`simulator.fit_csv.read_rows`)."""
    rows, base_used = read_rows(path, base)
    return [Run(*row) for row in rows], base_used


def grid_points(grid: dict[str, tuple[float, ...]] | None = None) -> list[dict[str, float]]:
    """Every combination of the grid's values (default `FITTED`)."""
    grid = FITTED if grid is None else grid
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[name] for name in names))]


CATALOGUE_POINTS = ("gemm_efficiency", "flash_attention_efficiency")
"""Ceilings whose catalogue value (for the runs' GPUs and dtypes) joins their grid, so the search
can always keep the datasheet's figure."""


def fitted_grid(runs: list[Run]) -> dict[str, tuple[float, ...]]:
    """`FITTED`, and `FLASH_FITTED` when a run's scenario turns `costs.flash_attention` on; each
    `CATALOGUE_POINTS` ceiling with the catalogue's values of the runs' GPUs added."""
    from simulator.kernel_costs import device_for
    from simulator.scenario import scenario_from_dict
    flash = any((run.document.get("costs") or {}).get("flash_attention") for run in runs)
    grid = {name: set(values) for name, values in ({**FITTED, **FLASH_FITTED} if flash else FITTED).items()}
    scenarios = (scenario_from_dict(run.document, run.where, run.base_dir) for run in runs)
    distinct = {(scenario.cluster.gpu.name, scenario.training.dtype): (scenario.cluster.gpu, scenario.training.dtype)
                for scenario in scenarios}
    for gpu, dtype in distinct.values():
        catalogue = device_for(gpu, dtype).parameters
        for name in CATALOGUE_POINTS:
            if name in grid:
                grid[name].add(round(getattr(catalogue, name), 3))
    return {name: tuple(sorted(values)) for name, values in grid.items()}


def predict_s(run: Run, point: dict[str, float] | None) -> float:
    """The run's simulated step time with the kernel model's parameters replaced by `point`."""
    from simulator.kernel_costs import KernelCosts, device_for
    from simulator.model_source import resolve_workload
    from simulator.scenario import scenario_from_dict
    from simulator.simulate import scenario_kernel_parameters, simulate
    scenario = scenario_from_dict(run.document, run.where, run.base_dir)
    if point is None:
        return simulate(scenario).step_time_s
    if "host_overhead_s" in point:  # the fitted value, not a costs.host_overhead_s of the base scenario
        scenario = scenario.model_copy(update={"costs": scenario.costs.model_copy(update={"host_overhead_s": None})})
    workload = resolve_workload(scenario.model, scenario.base_dir)
    training, gpu = scenario.training, scenario.cluster.gpu
    base = scenario_kernel_parameters(scenario) or device_for(gpu, training.dtype).parameters  # costs.kernel_profile's
    parameters = replace(base, **point)
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
    held_out: list[float]
    """Per row, the prediction from the point its fold chose without it."""
    in_sample_mape_pct: float
    held_out_mape_pct: float


class PointCache:
    """Each run's predictions at a point, simulated once (`simulate_points(points)` -> one list of
    predictions per point) and shared by the folds' searches."""

    def __init__(self, simulate_points):
        self.simulate_points = simulate_points
        self.predictions: dict[tuple, list[float]] = {}

    def __call__(self, points: list[dict[str, float]]) -> list[list[float]]:
        new = list({_key(point): point for point in points if _key(point) not in self.predictions}.values())
        for point, predictions in zip(new, self.simulate_points(new) if new else ()):
            self.predictions[_key(point)] = predictions
        return [self.predictions[_key(point)] for point in points]


def _key(point: dict[str, float]) -> tuple:
    return tuple(sorted(point.items()))


def refined_search(evaluate, measured: list[float], rows: list[int],
                   grid: dict[str, tuple[float, ...]] | None = None) -> dict[str, float]:
    """The point of least MAPE on `rows`: the coarse grid's best, refined `REFINEMENTS` times among
    the points half-way to its neighbours (module docstring). `evaluate(points)` -> predictions."""
    grid = FITTED if grid is None else grid
    coarse = grid_points(grid)

    def best_of(points: list[dict[str, float]]) -> dict[str, float]:  # ties: the earliest point
        predicted = evaluate(points)
        target = [measured[r] for r in rows]
        return points[min(range(len(points)), key=lambda p: mape_pct([predicted[p][r] for r in rows], target))]

    best = best_of(coarse)
    spacing = {}
    for name, values in grid.items():
        if name not in REFINED:
            spacing[name] = (0.0, 0.0)
            continue
        ordered, at = sorted(values), sorted(values).index(best[name])
        spacing[name] = (ordered[at] - ordered[at - 1] if at > 0 else 0.0,
                         ordered[at + 1] - ordered[at] if at + 1 < len(ordered) else 0.0)
    for _ in range(REFINEMENTS):
        spacing = {name: (below / 2, above / 2) for name, (below, above) in spacing.items()}
        axes = [[best[name]] + [float(f"{best[name] + step:.10g}") for step in (-below, above) if step]
                for name, (below, above) in spacing.items()]
        best = best_of([dict(zip(spacing, values)) for values in itertools.product(*axes)])
    return best


def fit_refined(evaluate, measured: list[float], k: int = 5, seed: int = 0,
                grid: dict[str, tuple[float, ...]] | None = None) -> FitResult:
    """k-fold cross-validation of `refined_search`: each fold's point chosen on its training rows
    predicts its held-out rows; the result's `best` is the search on all rows."""
    if len(measured) < k:
        raise ScenarioError(f"--folds: {k} folds need at least {k} runs, got {len(measured)}")
    held_out, choices = [math.nan] * len(measured), []
    for fold in folds(len(measured), k, seed):
        chosen = refined_search(evaluate, measured, sorted(set(range(len(measured))) - set(fold)), grid)
        choices.append(chosen)
        predicted = evaluate([chosen])[0]
        for row in fold:
            held_out[row] = predicted[row]
    best = refined_search(evaluate, measured, list(range(len(measured))), grid)
    spread = {name: statistics.pstdev(choice[name] for choice in choices) for name in best}
    return FitResult(best, spread, held_out, mape_pct(evaluate([best])[0], measured),
                     mape_pct(held_out, measured))


def at_grid_bounds(best: dict[str, float], grid: dict[str, tuple[float, ...]]) -> list[dict]:
    """The fitted parameters at an end of their (several-valued) grid other than a physical limit
    (`PHYSICAL_ENDS`): {parameter, value, bound ("smallest" or "largest"), grid [low, high]} each."""
    found = []
    for name, value in best.items():
        low, high = min(grid[name]), max(grid[name])
        if low == high or PHYSICAL_ENDS.get(name) == value:
            continue
        if value in (low, high):
            found.append({"parameter": name, "value": value, "bound": "largest" if value == high else "smallest",
                          "grid": [low, high]})
    return found


def bound_warning(bound: dict) -> str:
    """The warning line of one `at_grid_bounds` entry."""
    beyond = "above" if bound["bound"] == "largest" else "below"
    return (f"ghpsim: warning: {bound['parameter']} = {bound['value']:.4g} is the {bound['bound']} value of its "
            f"search grid ({bound['grid'][0]:.4g} to {bound['grid'][1]:.4g}): the runs may want a value {beyond} "
            "it, so this fitted value is not trustworthy (check the runs and their base scenario)")


class FitProgress:
    """Counts simulations on a `simulator.progress` bar: `expect(n)` as a batch of points is
    announced (the total grows as the refinement adds points), `advance()` after each simulation."""

    def __init__(self, bar, description: str):
        self.bar, self.total = bar, 0
        self.task = bar.add_task(description, total=0)

    def expect(self, count: int) -> None:
        self.total += count
        self.bar.update(self.task, total=self.total)

    def advance(self) -> None:
        self.bar.advance(self.task)


def predict_grid(runs: list[Run], points: list[dict[str, float]], progress=None) -> list[list[float]]:
    """Every run simulated at every point (one list of predictions per point); `progress()` after
    each run. Runs of the same scenario (a log's repeated configurations) are simulated once a point."""
    keys = [json.dumps([run.document, run.base_dir], sort_keys=True, default=str) for run in runs]
    out = []
    for point in points:
        predicted: dict[str, float] = {}
        for run, key in zip(runs, keys):
            if key not in predicted:
                predicted[key] = predict_s(run, point)
            if progress is not None:
                progress()
        out.append([predicted[key] for key in keys])
    return out


def fit_runs(runs: list[Run], k: int = 5, seed: int = 0, progress: FitProgress | None = None) -> tuple[FitResult, dict]:
    """Fit `runs` (all on one GPU architecture) and the kernel profile document to write."""
    from simulator.kernel_catalogue import gpu_architecture
    from simulator.profile import FORMAT
    from simulator.scenario import scenario_from_dict
    scenarios = [scenario_from_dict(run.document, run.where, run.base_dir) for run in runs]
    for run, scenario in zip(runs, scenarios):  # the kernel model is what is fitted and what predicts
        if scenario.costs.model == "analytic":
            raise ScenarioError(f"{run.where}: costs.model analytic (the base scenario's): fit fits the kernel "
                                "model's parameters and predicts every run with it; set costs.model kernel or auto")
    architectures = {gpu_architecture(scenario.cluster.gpu) for scenario in scenarios}
    if len(architectures) != 1:
        raise ScenarioError(f"cluster.gpu: the runs mix GPU architectures {sorted(architectures)}; fit one at a time")
    measured, grid = [run.measured_s for run in runs], fitted_grid(runs)

    def simulate_points(points: list[dict[str, float]]) -> list[list[float]]:
        if progress is None:
            return predict_grid(runs, points)
        progress.expect(len(points) * len(runs))
        return predict_grid(runs, points, progress.advance)
    result = fit_refined(PointCache(simulate_points), measured, k, seed, grid)
    document = {"format": FORMAT, "kind": "kernel", "architecture": architectures.pop(),
                "parameters": result.best,
                "fit": {"runs": len(runs), "folds": k, "seed": seed,
                        "held_out_mape_pct": result.held_out_mape_pct,
                        "in_sample_mape_pct": result.in_sample_mape_pct,
                        "spread_over_folds": result.spread, "grid": {n: list(v) for n, v in grid.items()},
                        "refinements": REFINEMENTS, "refined": list(REFINED),
                        "at_grid_bound": at_grid_bounds(result.best, grid)}}
    return result, document
