"""Checks of the values a report reads from a result file (one helper per input kind), run when
INPUT is loaded: a bad value is one line (`ScenarioError` naming the file, the field or the row
and column, and the value) instead of a traceback half-way through building the report.

Numbers the report does arithmetic on must be finite numbers (JSON: numbers, not strings; CSV:
cells that read as numbers); only an empty CSV cell or a JSON null is missing (a `nan` is a value,
refused where a number is read); CSV rows are counted from 1 after the header. A validation
table's `error_pct` must agree with its `predicted_s` and `measured_s` (`ERROR_TOLERANCE_PCT`).
"""

from __future__ import annotations

import math
import numbers
import reprlib
from pathlib import Path

import pandas as pd

from simulator.errors import ScenarioError

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 40
_REPR.maxlist = _REPR.maxdict = 4

SUMMARY_KEYS = ("strategy", "num_groups", "workers_per_group", "step_time_s", "throughput_samples_per_s",
                "speedup", "bytes_per_tier", "memory", "fits_in_memory", "devices")
DEVICE_TIMES = ("compute_s", "comm_s", "idle_s")
VALIDATION_NUMBERS = {"predicted_s": True, "measured_s": True, "error_pct": False, "world_size": True}
"""The numbers of a validation row the report reads, and whether each must be positive."""
ERROR_TOLERANCE_PCT = 0.1
"""How far (percentage points) a validation row's `error_pct` may sit from 100 x (predicted -
measured) / measured: a table rounded to 0.1 % passes; a row beyond is refused, naming both."""


def shown(value) -> str:
    """A value in an error message: its repr, shortened (reprlib)."""
    return _REPR.repr(value)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _number(value, strict: bool) -> float | None:
    """`value` as a float, or None if it is not a number (JSON, `strict`: a real number, not a bool;
    CSV: also a string that reads as one)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and not strict:
        try:
            return float(value)
        except ValueError:
            return None
    return None


def check_number(value, where: str, *, strict: bool = True, positive: bool = False,
                 integer: bool = False) -> float:
    """`value` as a finite float (> 0 if `positive`, a whole number if `integer`); else
    ScenarioError "`where`: <value> is not ..."."""
    number = _number(value, strict)
    kind = ("a positive " if positive else "a ") + ("whole number" if integer else "finite number")
    if number is None or not math.isfinite(number) or (positive and number <= 0) \
            or (integer and not number.is_integer()):
        raise ScenarioError(f"{where}: {shown(value)} is not {kind}")
    return number


# ----------------------------------------------------------------------------- compare / simulate JSON


def check_summary(summary, path: Path, where: str) -> None:
    """The fields of a `ghpsim simulate --json` summary that the ranking, breakdown and memory
    sections read; `where` names the summary in the file ("summaries[2]", or "" at the top level)."""
    prefix = f"INPUT: {path}: {where + '.' if where else ''}"
    if not isinstance(summary, dict):
        raise ScenarioError(f"INPUT: {path}: {where or 'the summary'}: {shown(summary)} is not a mapping")
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise ScenarioError(f"INPUT: {path}: {where or 'the summary'} lacks {', '.join(missing)}")
    if not isinstance(summary["strategy"], str):
        raise ScenarioError(f"{prefix}strategy: {shown(summary['strategy'])} is not a string")
    grid = [int(check_number(summary[key], f"{prefix}{key}", positive=True, integer=True))
            for key in ("num_groups", "workers_per_group")]
    if 1 not in grid and "placement" not in summary:
        raise ScenarioError(f"INPUT: {path}: {where or 'the summary'} lacks placement")
    check_number(summary["step_time_s"], f"{prefix}step_time_s", positive=True)
    for key in ("throughput_samples_per_s", "speedup"):
        check_number(summary[key], f"{prefix}{key}")
    _check_mapping(summary["bytes_per_tier"], f"{prefix}bytes_per_tier", ("inter",))
    check_number(summary["bytes_per_tier"]["inter"], f"{prefix}bytes_per_tier.inter")
    _check_mapping(summary["memory"], f"{prefix}memory", ("peak_memory_bytes",))
    devices = summary["devices"]
    if not isinstance(devices, list) or not devices or not all(isinstance(device, dict) for device in devices):
        raise ScenarioError(f"{prefix}devices: {shown(devices)} is not a non-empty list of mappings")
    for index, device in enumerate(devices):
        _check_device(device, f"{prefix}devices[{index}]")


def _check_mapping(value, where: str, keys: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: {shown(value)} is not a mapping")
    missing = [key for key in keys if key not in value]
    if missing:
        raise ScenarioError(f"{where}: lacks {', '.join(missing)}")


def _check_device(device: dict, where: str) -> None:
    for key in ("rank", *DEVICE_TIMES):
        if key not in device:
            raise ScenarioError(f"{where}: lacks {key}")
    rank = device["rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ScenarioError(f"{where}.rank: {shown(rank)} is not a rank (a whole number >= 0)")
    for key in DEVICE_TIMES:
        check_number(device[key], f"{where}.{key}")
    if not _missing(device.get("peak_memory_bytes")):  # absent or null: no memory figures
        check_number(device["peak_memory_bytes"], f"{where}.peak_memory_bytes")


# ----------------------------------------------------------------------------- sweep and validation tables


def _cell_name(strict: bool):
    """How a cell is named: JSON `rows[i].column`, CSV `row i+1, column column`."""
    if strict:
        return lambda position, column: f"rows[{position}].{column}"
    return lambda position, column: f"row {position + 1}, column {column}"


def check_column(frame: pd.DataFrame, path: Path, column: str, strict: bool, required=None,
                 positive: bool = False, integer: bool = False) -> pd.Series:
    """The column as numbers (NaN where empty) after checking every cell: empty, or a finite number;
    not empty where `required` (a boolean Series, or True for every row)."""
    name = _cell_name(strict)
    needed = [required] * len(frame) if required is None or isinstance(required, bool) else list(required)
    for position, (value, need) in enumerate(zip(frame[column], needed)):
        where = f"INPUT: {path}: {name(position, column)}"
        if _missing(value):
            if need:
                raise ScenarioError(f"{where}: empty (a number is needed here)")
            continue
        check_number(value, where, strict=strict, positive=positive, integer=integer)
    return pd.to_numeric(frame[column], errors="coerce") if len(frame) else frame[column]


SWEEP_STATUSES = ("ok", "failed", "error", "invalid", "pending")
"""The statuses a sweep's results.csv rows carry (`simulator.sweep.runner`)."""


def checked_sweep(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """A sweep table (`ghpsim sweep`'s results.csv) with its numeric columns checked and numeric;
    a simulated row (status ok, a step time) needs its throughput, speedup and GPU count."""
    frame = frame.copy()
    statuses = frame["status"].astype(str).str.lower()
    unknown = ~statuses.isin(SWEEP_STATUSES)
    if unknown.any():  # a hand-edited table: say so, not count the point as failed
        row = int(unknown.idxmax())
        raise ScenarioError(f"INPUT: {path}: {_cell_name(False)(row, 'status')}: {shown(frame['status'].iloc[row])} "
                            f"is not one of {', '.join(SWEEP_STATUSES)}")
    frame["step_time_s"] = check_column(frame, path, "step_time_s", False, positive=True)
    simulated = (statuses == "ok") & frame["step_time_s"].notna()
    for column in ("throughput_samples_per_s", "speedup"):
        frame[column] = check_column(frame, path, column, False, required=simulated)
    frame["num_gpus"] = check_column(frame, path, "num_gpus", False, required=simulated, positive=True, integer=True)
    for column in ("num_groups", "workers_per_group"):
        if column in frame.columns:
            frame[column] = check_column(frame, path, column, False, positive=True, integer=True)
    if "peak_memory_bytes" in frame.columns:
        frame["peak_memory_bytes"] = check_column(frame, path, "peak_memory_bytes", False)
    return frame


def validation_frame(rows, path: Path) -> pd.DataFrame:
    """The `rows` of a `ghpsim validate --json` result as a table; each row must be a mapping."""
    for position, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ScenarioError(f"INPUT: {path}: rows[{position}]: {shown(row)} is not a mapping")
        for column, positive in VALIDATION_NUMBERS.items():  # a NaN is a value (a table reads it as empty)
            if isinstance(row.get(column), float) and math.isnan(row[column]):
                check_number(row[column], f"INPUT: {path}: rows[{position}].{column}", positive=positive)
    return pd.DataFrame(rows)


def checked_validation(frame: pd.DataFrame, path: Path, strict: bool) -> pd.DataFrame:
    """A validation table (CSV, or the rows of the JSON result when `strict`) with the step times
    (positive) and the error checked on every row, the error against the step times
    (`ERROR_TOLERANCE_PCT`; the table then holds the error computed from them), and `world_size` a
    whole number where given."""
    frame = frame.copy()
    for column in ("predicted_s", "measured_s"):
        frame[column] = check_column(frame, path, column, strict, required=True, positive=True)
    given = check_column(frame, path, "error_pct", strict, required=True)
    frame["error_pct"] = 100.0 * (frame["predicted_s"] - frame["measured_s"]) / frame["measured_s"]
    name = _cell_name(strict)
    for position, (stated, computed) in enumerate(zip(given, frame["error_pct"])):
        if abs(stated - computed) > ERROR_TOLERANCE_PCT:
            raise ScenarioError(f"INPUT: {path}: {name(position, 'error_pct')}: {stated:g} disagrees with "
                                f"predicted_s and measured_s, which give {computed:+.2f} % "
                                "(100 x (predicted - measured) / measured)")
    if "world_size" in frame.columns:
        frame["world_size"] = check_column(frame, path, "world_size", strict, positive=True, integer=True)
    for column in ("strategy", "kind", "model"):
        if column in frame.columns:
            check_names(frame, path, column, strict)
    return frame


def check_names(frame: pd.DataFrame, path: Path, column: str, strict: bool) -> None:
    """Every cell of a label column (a case's strategy, kind or model) is a non-empty text."""
    name = _cell_name(strict)
    for position, value in enumerate(frame[column]):
        where = f"INPUT: {path}: {name(position, column)}"
        if _missing(value) or (isinstance(value, str) and not value.strip()):
            raise ScenarioError(f"{where}: empty (a name is needed here)")
        if not isinstance(value, str):
            raise ScenarioError(f"{where}: {shown(value)} is not a name")
