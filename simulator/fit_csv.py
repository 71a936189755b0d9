"""Reading `ghpsim fit`'s RUNS.csv (`simulator.fit`): each row checked before any fitting - its cells
against the header (a column named once), its quoting, its measured step time (`MEASURED_RANGE_S`),
its base scenario, and its scenario with the row's overrides (validated, model built). Errors are
one line naming the file, the row (the line of the file where the row starts), the column and the
offending value, shortened: never more of the file's text (SECURITY.md).

Every column other than `base` and `measured_step_s` must be named by a dotted scenario key
(`unknown_field_part`), whatever its cells hold: a misspelt column is refused even where every
cell of it is empty. An empty cell means "keep the base scenario's value" for that row (as if
the column were absent); an empty `base` cell means --base. The keys the fit cannot honour
(`UNSUPPORTED_COLUMNS`: every run is simulated with the kernel cost model, whose host time it fits)
are refused as columns, and so is a section above one (`costs`), which could set it."""

from __future__ import annotations

import copy
import csv
import io
import math
import re
import reprlib
from pathlib import Path

from simulator.errors import ScenarioError, short_path

MEASURED_COLUMN = "measured_step_s"
MEASURED_RANGE_S = (1e-6, 86_400.0)
"""Bounds of a row's measured_step_s: a training step takes at least a kernel launch (a microsecond)
and, on any cluster a fit is for, less than a day; a value outside is a unit or transcription error
(or `inf`), refused before any fitting."""
UNSUPPORTED_COLUMNS = {
    "costs.model": "every run uses the kernel model it fits",
    "costs.efficiency": "the analytic model's",
    "costs.host_overhead_s": "it is fitted",
}
"""Scenario keys a RUNS.csv column may not set (nor a section above them): `ghpsim fit` would
ignore them (`simulator.fit.predict_s`), so a column of them is refused, not silently dropped."""
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother = 40, 40
"""Quotes an offending cell in a few dozen characters: errors never echo the file beyond it (SECURITY.md)."""


def read_rows(path: str | Path, base: str | Path | None) -> tuple[list[tuple[dict, float, str, str, str]], bool]:
    """Each row's (scenario document, measured step time, "FILE:LINE", its base scenario's folder:
    what a relative model.file or cluster.topology_file is read from, the base scenario file), and
    whether a row used `base` (--base: a missing file is refused even when every row names its own base)."""
    from simulator.scenario import read_yaml
    from simulator.yaml_loading import read_text_file
    path, bases = Path(path), {}
    if base is not None:
        if str(base) == "":
            raise ScenarioError("--base: needs a file name (got '')")
        if not Path(base).is_file():
            raise ScenarioError(f"--base {_SHORT.repr(str(base))}: {_not_a_file(Path(base))}")
        bases[Path(base)] = read_yaml(base)
    header_line, header, records = _csv_records(path, read_text_file(path, str(path)))
    if MEASURED_COLUMN not in header:
        raise ScenarioError(f"{path}:{header_line}: missing column {MEASURED_COLUMN!r} (seconds per training step)")
    if not records:
        raise ScenarioError(f"{path}: no runs (expected a header and one row per run)")
    _check_column_names(header, f"{short_path(path, 60)}:{header_line}")  # a long path cuts no remedy
    runs, base_used = [], False
    for number, cells in records:
        where = f"{path}:{number}"
        if len(cells) != len(header):
            side = "fewer" if len(cells) < len(header) else "more"
            raise ScenarioError(f"{where}: {len(cells)} cells, {side} than the {len(header)} columns of the header")
        row = dict(zip(header, cells))
        own = row.get("base", "").strip()
        if not own and base is None:
            raise ScenarioError(f"{where}: base: no scenario file (give a `base` column or --base)")
        base_path = (path.parent / own) if own else Path(base)
        base_used = base_used or not own
        if base_path not in bases:
            if not base_path.is_file():
                raise ScenarioError(f"{where}: base: {_SHORT.repr(own)}: {_not_a_file(base_path)} "
                                    "(relative to the CSV's folder)")
            try:
                bases[base_path] = read_yaml(base_path)
            except ScenarioError as error:
                raise ScenarioError(f"{where}: base: {error}") from None
        measured_s = _measured_s(row[MEASURED_COLUMN], f"{where}: {MEASURED_COLUMN}")
        overrides = []
        for index, (column, value) in enumerate(zip(header, cells), start=1):
            if column in ("base", MEASURED_COLUMN) or not value.strip():
                continue
            if not column:
                raise ScenarioError(f"{where}: column {index} has no name in the header but holds {_SHORT.repr(value)}")
            overrides.append((column, value))
        base_dir = str(base_path.parent)
        runs.append((_row_document(bases[base_path], overrides, where, base_dir, base_path), measured_s, where,
                     base_dir, str(base_path)))
    return runs, base_used


def _check_column_names(header: list[str], where: str) -> None:
    """ScenarioError naming the first column (other than base, measured_step_s and unnamed ones,
    refused with their cells) that is not a dotted scenario key, or that sets one the fit would
    ignore (`UNSUPPORTED_COLUMNS`, or a section above one)."""
    from simulator.sweep.spec import unknown_field_part
    for column in header:
        unknown = None if column in ("", "base", MEASURED_COLUMN) else unknown_field_part(column)
        if unknown is not None:
            raise ScenarioError(f"{where}: column {_SHORT.repr(column)} is not a scenario key ({_SHORT.repr(unknown)} "
                                f"unknown; columns are base, {MEASURED_COLUMN} and dotted keys such as "
                                "training.global_batch_size)")
        for unsupported, reason in UNSUPPORTED_COLUMNS.items() if column else ():
            if column == unsupported or column.startswith(unsupported + ".") or unsupported.startswith(column + "."):
                why = reason if column.startswith(unsupported) else f"it could set {unsupported}"
                raise ScenarioError(f"{where}: column {_SHORT.repr(column)} is not supported: fit's columns are "
                                    f"base, {MEASURED_COLUMN} and scenario keys other than "
                                    f"{', '.join(UNSUPPORTED_COLUMNS)} ({why})")


def _not_a_file(path: Path) -> str:
    """Why a scenario path that is not a regular file cannot be read."""
    return "is a directory, not a scenario file" if path.is_dir() else (
        "is not a regular file" if path.exists() else "file not found")


def _csv_records(path: Path, text: str) -> tuple[int, list[str], list[tuple[int, list[str]]]]:
    """The header's line and (stripped) names, and each non-blank row's first line and cells; a
    malformed row (an unterminated quote) or a column named twice is a one-line error. A leading
    byte-order mark (a spreadsheet's "CSV UTF-8" export) is dropped, as utf-8-sig decoding does."""
    text = text.removeprefix("\ufeff")
    reader, records, start = csv.reader(io.StringIO(text), strict=True), [], 1
    try:
        for cells in reader:
            if cells:
                records.append((start, cells))
            start = reader.line_num + 1
    except csv.Error as error:  # its reason quotes no content
        if reader.line_num > start or "end of data" in str(error):
            at = f", at line {reader.line_num}" if reader.line_num > start else ""
            raise ScenarioError(f"{path}:{start}: unterminated quote: a quoted field opened in this row "
                                f"does not close in it (csv: {error}{at})") from None
        raise ScenarioError(f"{path}:{start}: malformed row (csv: {error})") from None
    if not records:
        raise ScenarioError(f"{path}: no runs (expected a header and one row per run)")
    (header_line, names), rows = records[0], records[1:]
    header = [name.strip() for name in names]
    first_index: dict[str, int] = {}
    for index, name in enumerate(header):
        if name and first_index.setdefault(name, index) != index:
            raise ScenarioError(f"{path}:{header_line}: column {_SHORT.repr(name)} appears twice in the header "
                                f"(columns {first_index[name] + 1} and {index + 1})")
    return header_line, header, rows


def _measured_s(text: str, where: str) -> float:
    low, high = MEASURED_RANGE_S
    try:
        value = float(text)
    except ValueError:
        raise ScenarioError(f"{where}: {_SHORT.repr(text)} is not a number") from None
    if not math.isfinite(value):
        raise ScenarioError(f"{where}: {_SHORT.repr(text)} is not a finite number of seconds")
    if not value > 0:
        raise ScenarioError(f"{where}: {value} must be > 0")
    if not low <= value <= high:
        raise ScenarioError(f"{where}: {_SHORT.repr(text)} is outside {low:g} to {high:g} s (one training step)")
    return value


def _row_document(base: dict, overrides: list[tuple[str, str]], where: str, base_dir: str, base_path: Path) -> dict:
    """The base scenario with the row's overrides, validated now (scenario and model). When it fails,
    the error names the column without which the row would be valid, or the base scenario file when
    that is refused alone."""
    problem, document = _problem(base, overrides, where, base_dir)
    if problem is None:
        return document
    for column, value in overrides:
        if _problem(base, [o for o in overrides if o[0] != column], where, base_dir)[0] is None:
            old, new = _lookup(base, column), _lookup(document, column)
            if _is_number(old) and not _is_number(new):
                raise ScenarioError(f"{where}: {column}: {_SHORT.repr(value)} is not a number "
                                    f"(the base scenario has {_SHORT.repr(old)})")
            raise ScenarioError(f"{where}: {column}: {_SHORT.repr(value)}: {problem}")
    alone = _problem(base, [], where, base_dir)[0] if overrides else problem
    if alone is not None:
        raise ScenarioError(f"{where}: base {_SHORT.repr(str(base_path))}: {alone}")
    raise ScenarioError(f"{where}: {problem}")


def _problem(base: dict, overrides: list[tuple[str, str]], where: str, base_dir: str) -> tuple[str | None, dict]:
    """(the reason the row's scenario or its plan is refused, without its origin, or None; the document)."""
    from simulator.fabrics import cached_topology
    from simulator.model_source import resolve_workload
    from simulator.scenario import apply_override, scenario_from_dict
    from simulator.simulate import analytic_costs
    from simulator.strategies import compile_plan
    document = copy.deepcopy(base)
    try:
        for column, value in overrides:
            apply_override(document, f"{column}={value}", where)
        scenario = scenario_from_dict(document, where, base_dir)
        workload = resolve_workload(scenario.model, scenario.base_dir)
        # the plan too: its checks (a batch the replicas or micro-batches do not divide) fire here;
        # rows of one cluster share its topology
        compile_plan(scenario, workload, cached_topology(scenario.cluster.model_dump_json()),
                     analytic_costs(scenario, workload))
    except ScenarioError as error:  # a model's parameters are quoted whole: shortened
        return re.sub(r"\{.*\}", "{...}", str(error).removeprefix(f"{where}: ")), document
    return None, document


def _lookup(document: dict, column: str):
    node = document
    for key in (key for key in column.split(".") if key):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
