"""Sweep results as a pandas DataFrame (one row per point), written as CSV and, when a Parquet
engine (pyarrow or fastparquet) is installed, Parquet. Columns: see scenarios/README.md, "Sweeps"."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from simulator.output import write_text_atomic
from simulator.sweep.columns import INTEGER_FIGURES, MEMORY_FIGURES, SUMMARY_FIGURES, result_columns
from simulator.sweep.spec import integer_field
from simulator.units import whole

CSV_NAME = "results.csv"
PARQUET_NAME = "results.parquet"


def parquet_engine() -> str | None:
    """The Parquet engine pandas would use, or None when neither pyarrow nor fastparquet is installed."""
    for engine in ("pyarrow", "fastparquet"):
        if importlib.util.find_spec(engine) is not None:
            return engine
    return None


def results_frame(sweep, points, rows: dict[str, dict]) -> pd.DataFrame:
    """One row per point: point, axis columns, status, error, key, summary figures, sim_wall_s."""
    axis_columns = sweep.columns()
    records = []
    for point in points:
        record = {"point": point.index, **{column: _cell(point.values[column]) for column in axis_columns}}
        stored = rows.get(point.key) if point.key else None
        if point.key is None:
            record.update(status="invalid", error=point.error)
        elif stored is None:
            record.update(status="pending", error=None)
        else:
            record.update(status=stored["status"], error=stored["error"])
        record["key"] = point.key
        record.update((stored or {}).get("figures") or summary_figures(None))
        record["sim_wall_s"] = stored["sim_wall_s"] if stored else None
        records.append(record)
    integer_columns = {*INTEGER_FIGURES, *(column for column in axis_columns if integer_field(column))}
    for record in records:  # an integer field given as 4.0 (e.g. `factor: 2.0`) is the count 4
        record.update((column, whole(record[column])) for column in integer_columns
                      if isinstance(record.get(column), float))
    frame = pd.DataFrame.from_records(records, columns=result_columns(axis_columns))
    for column in frame.columns:  # integers stay integers beside missing values (not 8.0)
        values = [record.get(column) for record in records if record.get(column) is not None]
        if (values or column in INTEGER_FIGURES) and all(_integer(value) for value in values):
            frame[column] = frame[column].astype("Int64")
    return frame


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def summary_figures(summary: dict | None) -> dict:
    """The key figures of a simulation summary (None everywhere for a point without one)."""
    summary = summary or {}
    figures = {name: summary.get(name) for name in SUMMARY_FIGURES}
    tiers = summary.get("bytes_per_tier") or {}
    figures.update(intra_node_bytes=tiers.get("intra"), inter_node_bytes=tiers.get("inter"))
    for name in MEMORY_FIGURES:
        figures[name] = _memory_figure(summary, name)
    return figures


def _memory_figure(summary: dict, name: str):
    """From the summary's top level, its `memory` mapping, or its per-device rows (max / all)."""
    if name in summary:
        return summary[name]
    memory = summary.get("memory")
    if isinstance(memory, dict) and name in memory:
        return memory[name]
    values = [row[name] for row in summary.get("devices") or () if isinstance(row, dict) and name in row]
    if not values:
        return None
    return all(values) if name == "fits_in_memory" else max(values)


def _cell(value):
    """Scalars as they are; lists and mappings as compact JSON so that CSV cells stay one value."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict, tuple)) else value


def export_frame(frame: pd.DataFrame, out_dir: Path) -> dict[str, str | None]:
    """Write results.csv (always) and results.parquet (if an engine is installed), atomically."""
    csv_path = write_text_atomic(out_dir / CSV_NAME, frame.to_csv(index=False))
    engine = parquet_engine()
    parquet_path = None
    if engine is not None:
        parquet_path = out_dir / PARQUET_NAME
        handle, temporary = tempfile.mkstemp(dir=out_dir, prefix=f".{PARQUET_NAME}.", suffix=".tmp")
        os.close(handle)
        try:
            frame.to_parquet(temporary, engine=engine, index=False)
            os.replace(temporary, parquet_path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    return {"csv": str(csv_path), "parquet": None if parquet_path is None else str(parquet_path)}
