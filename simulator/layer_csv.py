"""Reading a CSV layer table (`model.file: x.csv`, `simulator.model_source.load_layer_table`) into
rows, one dict per layer, cell by cell: a cell's type is its own (a text cell in one row leaves the
other rows' numbers numbers), so an error names the row that holds the bad cell.

The header names the columns (`simulator.workload.LAYER_TABLE_COLUMNS`; names stripped); an empty
cell, or a row shorter than the header, leaves the column out of that row (its default applies); a
row with more fields than the header, a column named twice and a value in an unnamed column are
refused. Numbers are read as Python reads them (`12`, `1.5e9`); `nan` and `inf` are refused as not
finite. The `name` and `kind` columns are text whatever they hold. Errors name the file, the row
(counted from 0 among the non-blank rows, as a YAML table's rows are) and the column (by number
where its name is not a layer-table column), and quote a number but never the file's text (SECURITY.md).
"""

from __future__ import annotations

import csv
import io
import math
import re

from simulator.errors import ScenarioError
from simulator.workload import LAYER_TABLE_COLUMNS

TEXT_COLUMNS = ("name", "kind")
"""Columns read as text: a layer named `1` is a name, not a number."""
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE)


def read_layer_csv(text: str, what: str) -> list[dict]:
    """The rows of a CSV layer table's `text` (module docstring); ScenarioError naming `what`."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")), strict=True)
    try:
        records = [cells for cells in reader if any(cell.strip() for cell in cells)]
    except csv.Error as error:  # its reason quotes no content
        raise ScenarioError(f"{what}: not a readable CSV layer table (csv: {error}, "
                            f"at line {reader.line_num})") from None
    if not records:
        raise ScenarioError(f"{what}: the file is empty (expected a header of layer-table columns and a row per layer)")
    header, rows = [name.strip() for name in records[0]], []
    for index, name in enumerate(header):
        if name and name in header[:index]:
            raise ScenarioError(f"{what}: the header names a column twice (columns {header.index(name) + 1} "
                                f"and {index + 1})")
    for index, cells in enumerate(records[1:]):
        if len(cells) > len(header):
            raise ScenarioError(f"{what}: layers row {index}: {len(cells)} fields where the header has {len(header)}")
        row = {}
        for column, (name, cell) in enumerate(zip(header, cells), start=1):
            if not cell.strip():
                continue
            if not name:
                raise ScenarioError(f"{what}: layers row {index}: column {column} has no name in the header "
                                    "but holds a value")
            where = f"{what}: layers row {index}: {name if name in LAYER_TABLE_COLUMNS else f'column {column}'}"
            row[name] = cell if name in TEXT_COLUMNS else _cell_value(cell.strip(), where)
        rows.append(row)
    return rows


def _cell_value(cell: str, where: str) -> int | float | str:
    """A number where the cell is one (finite, else ScenarioError), else the text."""
    if _INTEGER.fullmatch(cell):
        try:
            return int(cell)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise ScenarioError(f"{where}: an integer of {len(cell.lstrip('+-'))} digits") from None
    if not _DECIMAL.fullmatch(cell):
        return cell
    value = float(cell)
    if not math.isfinite(value):
        raise ScenarioError(f"{where}: {value!r} is not a finite number")
    return value
