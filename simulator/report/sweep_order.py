"""The order of a sweep's values in the report's plots and tables: numbers ascending; other values
(link names, strategy kinds, algorithms) in the order the sweep file lists them, which is their
first appearance in point order (results.csv's `point` column, else its row order). A missing
value of a non-numeric field reads as "-"."""

from __future__ import annotations

import pandas as pd

MISSING = "-"


def point_order(table: pd.DataFrame) -> pd.DataFrame:
    """The rows in point order (the expansion order of the sweep file's axes)."""
    if "point" in table.columns and pd.api.types.is_numeric_dtype(table["point"]):
        return table.sort_values("point", kind="stable", na_position="last")
    return table


def is_numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not isinstance(series.dtype, pd.CategoricalDtype)


def axis_values(table: pd.DataFrame, column: str) -> list:
    """A field's distinct values in sweep order (numbers ascending, missing numbers left out)."""
    values = point_order(table)[column]
    if is_numeric(values):
        return sorted(set(values.dropna()))
    return list(dict.fromkeys(values.fillna(MISSING)))


def in_sweep_order(frame: pd.DataFrame, column: str, table: pd.DataFrame) -> pd.Categorical:
    """A non-numeric `frame[column]` as an ordered categorical, its categories in `table`'s sweep order."""
    return pd.Categorical(frame[column].fillna(MISSING), categories=axis_values(table, column), ordered=True)


def order_rows(frame: pd.DataFrame, columns: list[str], table: pd.DataFrame) -> pd.DataFrame:
    """`frame` sorted by `columns`, each in `table`'s sweep order (see `axis_values`)."""
    def key(series: pd.Series) -> pd.Series:
        if is_numeric(series) or isinstance(series.dtype, pd.CategoricalDtype):
            return series
        position = {value: index for index, value in enumerate(axis_values(table, series.name))}
        return series.fillna(MISSING).map(position)
    return frame.sort_values(columns, key=key, kind="stable", na_position="last") if columns else frame
