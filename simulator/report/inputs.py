"""What a report is made from: the INPUT of `ghpsim report`, detected and loaded into one shape.

INPUT kinds: a scenario YAML (simulated here with dp, mp and ghp, or a megatron scenario with its own
strategy, unless --strategies says otherwise), a `ghpsim compare --json` or
`ghpsim simulate --json` result, a sweep table (`ghpsim sweep`'s results.csv, or its folder) and a
validation table (`ghpsim validate`'s reports/validation/<scenario>.csv, or its `--json` output).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from simulator.compare import compare, default_strategies, parse_strategy_specs, ranking_key
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.profile_costs import scenario_profile_costs
from simulator.report.cost_models import sweep_costs
from simulator.report.input_checks import check_summary, checked_sweep, checked_validation, validation_frame
from simulator.scenario import Scenario, load_scenario, read_yaml
from simulator.simulate import SimulationResult, naming_source, simulate
from simulator.tables import strategy_label
from simulator.yaml_loading import load_json_text

SWEEP_COLUMNS = ("step_time_s", "throughput_samples_per_s", "speedup", "num_gpus", "strategy", "status")
VALIDATION_COLUMNS = ("strategy", "predicted_s", "measured_s", "error_pct")
KINDS_HELP = ("a scenario (.yaml), a compare/simulate result (.json), a sweep table (.csv or its folder) "
              "or a validation table (.csv)")


@dataclass
class ReportInput:
    """Everything a report can show; `kind` is scenario, compare, simulate, sweep or validation."""

    kind: str
    source: str
    title: str
    scenario: Scenario | None = None
    summaries: list[dict] = field(default_factory=list)
    spans: dict[str, pd.DataFrame] = field(default_factory=dict)
    """Span table per strategy label (only when simulated here)."""
    table: pd.DataFrame | None = None
    """Sweep or validation rows."""
    num_params: int | None = None
    num_layers: int | None = None
    profile: str | None = None
    sweep_costs: Counter | None = None
    """A sweep's cost model text -> number of simulated points, from its store (`cost_models.sweep_costs`)."""


def load_report_input(path: str | Path, overrides: list[str] | tuple[str, ...] = (),
                      strategies: str | None = None, profile: str | None = None) -> ReportInput:
    """Detect INPUT's kind from its extension and content; ScenarioError (one line) if neither."""
    path = Path(path)
    if path.is_dir():
        if not (path / "results.csv").is_file():
            raise ScenarioError(f"INPUT: {path} is a folder without a results.csv (expected {KINDS_HELP})")
        path = path / "results.csv"
    if not path.exists():
        raise ScenarioError(f"INPUT: {path}: file not found")
    suffix = path.suffix.lower()
    for option, given in (("--set", overrides), ("--profile", profile), ("--strategies", strategies)):
        if (given or given == "") and suffix not in (".yaml", ".yml"):
            raise ScenarioError(f"{option}: applies to a scenario INPUT only, not {path}")
    if profile == "":
        raise ScenarioError("--profile: needs a file name (got '')")
    if suffix in (".yaml", ".yml"):
        return _from_scenario(path, overrides, strategies, profile)
    if suffix == ".json":
        return _from_json(path)
    if suffix == ".csv":
        return _from_csv(path)
    raise ScenarioError(f"INPUT: {path} is not {KINDS_HELP}")


def _from_scenario(path: Path, overrides, strategies: str | None, profile: str | None) -> ReportInput:
    default = strategies is None  # an empty --strategies is refused (`parse_strategy_specs`), as by compare
    if {"base", "axes"} & set(read_yaml(path)):  # not "model: missing required field"
        raise ScenarioError(f"INPUT: {path} is a sweep file (base and axes), not a scenario: run "
                            f"`ghpsim sweep {path} --out DIR`, then `ghpsim report DIR`")
    scenario = load_scenario(path, overrides)
    specs = parse_strategy_specs(default_strategies(scenario) if default else strategies)
    if scenario.strategy.kind == "megatron" and default:
        results = [simulate_own_strategy(scenario, profile)]
    else:
        try:
            results = compare(scenario, specs) if profile is None else compare_with_profile(scenario, specs, profile)
        except ScenarioError as error:
            _blame_strategies(error, scenario, path, strategies)
            raise
    workload = results[0].workload
    return ReportInput(
        kind="scenario", source=str(path), title=scenario.name, scenario=scenario,
        summaries=[result.summary for result in results],
        spans={strategy_label(result.summary): result.spans for result in results},
        num_params=workload.num_params, num_layers=workload.num_layers, profile=profile)


def _blame_strategies(error: ScenarioError, scenario: Scenario, path: Path, strategies: str | None) -> None:
    """A megatron scenario turned into a --strategies kind that fails the scenario's checks on a
    strategy field (e.g. cp_degree 2: kind megatron only): one line naming --strategies, not the file."""
    if scenario.strategy.kind == "megatron" and str(error).startswith(f"{scenario.source}: strategy."):
        reason = str(error).removeprefix(f"{scenario.source}: ")
        raise ScenarioError(f"--strategies {strategies}: the megatron scenario {path} does not convert to these "
                            f"kinds (leave --strategies out to report its own strategy): {reason}") from None


def simulate_own_strategy(scenario: Scenario, profile_path: str | None) -> SimulationResult:
    """The scenario as written (a megatron layout), with analytic costs or a profile's."""
    with naming_source(scenario):
        workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = None if profile_path is None else scenario_profile_costs(profile_path, scenario, workload)
    return simulate(scenario, costs=costs, workload=workload)


def compare_with_profile(scenario: Scenario, specs, profile_path: str) -> list[SimulationResult]:
    """`simulator.compare.compare` with a calibration profile's costs (as `ghpsim compare --profile`
    and `ghpsim validate` predict): ghp without G takes the scenario's G, else the fastest feasible G."""
    with naming_source(scenario):
        workload = resolve_workload(scenario.model, scenario.base_dir)
    return compare(scenario, specs, costs=scenario_profile_costs(profile_path, scenario, workload))


def _from_json(path: Path) -> ReportInput:
    try:
        text = path.read_text()
    except UnicodeDecodeError as error:
        raise ScenarioError(f"INPUT: {path}: not valid JSON ({str(error).splitlines()[0]})") from None
    # a summary may hold > MAX_VALUES values; `ghpsim validate --json` writes NaN for a figure not measured
    document = load_json_text(text, f"INPUT: {path}", check=False, allow_nan=True)
    if isinstance(document, dict) and isinstance(document.get("summaries"), list) and document["summaries"]:
        for index, summary in enumerate(document["summaries"]):
            check_summary(summary, path, f"summaries[{index}]")
        return ReportInput(kind="compare", source=str(path), title=str(document.get("scenario", path.stem)),
                           summaries=sorted(document["summaries"], key=ranking_key))
    if isinstance(document, dict) and "step_time_s" in document and "devices" in document:
        check_summary(document, path, "")
        return ReportInput(kind="simulate", source=str(path), title=str(document.get("scenario", path.stem)),
                           summaries=[document])
    if isinstance(document, dict) and isinstance(document.get("rows"), list) and document["rows"]:
        frame = validation_frame(document["rows"], path)
        _require_columns(frame, VALIDATION_COLUMNS, path, "validation result")
        return ReportInput(kind="validation", source=str(path), title=str(document.get("scenario", path.stem)),
                           table=checked_validation(frame, path, strict=True))
    raise ScenarioError(f"INPUT: {path}: JSON is neither a compare result (keys scenario, results, summaries), "
                        "a simulate result (keys step_time_s, devices) nor a validation result (key rows)")


def _from_csv(path: Path) -> ReportInput:
    try:  # only an empty cell is missing: a `nan`, `NA` or `null` cell is text, checked as a value
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ScenarioError(f"INPUT: {path}: not a readable CSV table ({str(error).splitlines()[0]})") from None
    columns = set(frame.columns)
    if set(VALIDATION_COLUMNS) <= columns:
        kind = "validation"
    elif set(SWEEP_COLUMNS) <= columns:
        kind = "sweep"
    else:
        raise ScenarioError(f"INPUT: {path}: CSV has neither the sweep columns ({', '.join(SWEEP_COLUMNS)}) "
                            f"nor the validation columns ({', '.join(VALIDATION_COLUMNS)})")
    if frame.empty:
        raise ScenarioError(f"INPUT: {path}: the {kind} table has no rows")
    title = path.parent.name if path.name == "results.csv" else path.stem
    if kind == "validation":
        return ReportInput(kind=kind, source=str(path), title=title,
                           table=checked_validation(frame, path, strict=False))
    frame = checked_sweep(frame, path)
    costs = sweep_costs(path, [str(key) for key in frame.loc[sweep_ok(frame), "key"]]) \
        if "key" in frame.columns else None
    return ReportInput(kind=kind, source=str(path), title=title, table=frame, sweep_costs=costs)


def _require_columns(frame: pd.DataFrame, columns, path: Path, what: str) -> None:
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ScenarioError(f"INPUT: {path}: {what} rows lack {', '.join(missing)}")


def value_text(value, missing: str = "") -> str:
    """A table cell as text: an integer-valued float as an integer (pandas reads an integer column
    with missing values, e.g. `strategy.num_groups` null for dp, as floats: 4.0), `missing` for NaN."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return missing if pd.isna(value) else str(value)


def sweep_axes(table: pd.DataFrame) -> list[str]:
    """The swept fields: the dotted-name columns (`cluster.num_nodes`)."""
    return [column for column in table.columns if "." in column]


def sweep_ok(table: pd.DataFrame) -> pd.Series:
    """Rows that were simulated: status ok and a step time."""
    return (table["status"].astype(str).str.lower() == "ok") & table["step_time_s"].notna()
