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


def swept_together(table: pd.DataFrame, columns: list[str]) -> list[list[str]]:
    """`columns` in groups, each group one axis of the sweep: fields a sweep file lists as one
    combined axis (`strategy.kind,strategy.num_groups: [[dp, null], [ghp, 4]]`) determine one
    another, so the distinct pairs of two of them number no more than the distinct values of one,
    while independent axes multiply. A field of one value stands alone. In `columns`' order."""
    counts = {column: table[column].nunique(dropna=False) for column in columns}
    group_of = {column: [column] for column in columns}
    for index, first in enumerate(columns):
        for second in columns[index + 1:]:
            together = len(table[[first, second]].drop_duplicates()) == max(counts[first], counts[second])
            if counts[first] > 1 and counts[second] > 1 and together and group_of[first] is not group_of[second]:
                merged = group_of[first] + group_of[second]
                for column in merged:
                    group_of[column] = merged
    groups = list({id(group): group for group in group_of.values()}.values())
    return [sorted(group, key=columns.index) for group in groups]


def combined_values(frame: pd.DataFrame, group: list[str]) -> pd.Series:
    """Each row's values of the fields of one combined axis, as one label ("ghp / 4 / stage_per_node")."""
    from simulator.report.inputs import value_text
    return frame[group].apply(lambda row: " / ".join(value_text(value, MISSING) for value in row), axis=1)
