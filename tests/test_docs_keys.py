"""scenarios/README.md documents the scenario schema (simulator/scenario.py) as it is: every key in
its key tables is a field of the schema, every field is documented, each backticked default is the
field's default (and `**required**` a required field), and the first row of a key lists every
value of a choice (Literal) field. The checker runs on mutated copies of the README as well, so
that it is seen to catch each kind of drift."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from simulator.hardware import GpuSpec, LinkSpec
from simulator.scenario import (ClusterConfig, CostConfig, LayerRow, ModelConfig, Scenario, StrategyConfig,
                                TrainingConfig)

README = Path(__file__).resolve().parent.parent / "scenarios" / "README.md"

BARE_KEY_TABLES = {"Top-level keys": Scenario, "Inline GPU spec": GpuSpec, "Inline link spec": LinkSpec,
                   "Layer tables": LayerRow}
"""Tables whose keys are field names of one model, found by the heading they sit under (its start);
every other key table writes dotted paths from the scenario's top level (`cluster.num_nodes`)."""
DOCUMENTED_MODELS = (Scenario, ClusterConfig, ModelConfig, StrategyConfig, TrainingConfig, CostConfig, GpuSpec,
                     LinkSpec, LayerRow)
"""Models every (user-settable) field of which must appear in a key table."""


# ----------------------------------------------------------------------------- the README's tables

def key_tables(markdown: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, header cells, rows) of every table whose first header cell is `key`, and of the
    layer-table columns (header `column` under "Layer tables")."""
    tables, heading, lines = [], "", markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and index + 1 < len(lines) and re.match(r"^\|\s*-{3}", lines[index + 1]):
            header = _cells(line)
            rows = []
            index += 2
            while index < len(lines) and lines[index].startswith("|"):
                rows.append(_cells(lines[index]))
                index += 1
            if header[0] == "key" or (header[0] == "column" and heading.startswith("Layer tables")):
                tables.append((heading, header, rows))
            continue
        index += 1
    return tables


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row (`\\|` inside a cell is not a separator)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _unwrap(annotation) -> list:
    """The alternatives of a field's annotation, Annotated and Optional/Union removed."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) for alt in _unwrap(arg)]
    return [annotation]


def _nested_model(annotation) -> type[BaseModel] | None:
    """The model a field holds (directly, optionally, or as a tuple of rows)."""
    for alternative in _unwrap(annotation):
        if isinstance(alternative, type) and issubclass(alternative, BaseModel):
            return alternative
        if typing.get_origin(alternative) is tuple:
            nested = [_nested_model(arg) for arg in typing.get_args(alternative) if arg is not Ellipsis]
            if nested and nested[0] is not None:
                return nested[0]
    return None


def _choices(annotation) -> tuple | None:
    """The values of a choice field (a Literal, possibly beside other alternatives), else None."""
    values = [value for alternative in _unwrap(annotation) if typing.get_origin(alternative) is typing.Literal
              for value in typing.get_args(alternative)]
    return tuple(values) or None


def resolve(key: str, heading: str) -> tuple[type[BaseModel], str] | str:
    """(model, field name) a documented key names, or why it names none."""
    model = next((model for start, model in BARE_KEY_TABLES.items() if heading.startswith(start)), None)
    parts = key.split(".")
    if model is None:
        if len(parts) < 2:
            return f"bare key under a heading the checker does not know ({heading!r}): register it in BARE_KEY_TABLES"
        model = Scenario
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None or field.exclude:
            return f"{'.'.join(parts[:depth + 1])} is not a field of {model.__name__}"
        if depth == len(parts) - 1:
            return model, part
        nested = _nested_model(field.annotation)
        if nested is None:
            return f"{'.'.join(parts[:depth + 1])} has no sub-keys"
        model = nested
    raise AssertionError(key)


def _default(model: type[BaseModel], name: str):
    field = model.model_fields[name]
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def problems(markdown: str) -> list[str]:
    """Every disagreement between the README text `markdown` and the schema."""
    found, documented, first_rows = [], set(), set()
    for heading, header, rows in key_tables(markdown):
        default_column = header.index("default") if "default" in header else None
        required_column = header.index("required") if "required" in header else None
        for row in rows:
            match = re.fullmatch(r"`([^`]+)`", row[0])
            if not match:
                found.append(f"{heading}: row {row[0]!r}: the key is not one backticked name")
                continue
            key = match.group(1)
            target = resolve(key, heading)
            if isinstance(target, str):
                found.append(f"{heading}: `{key}`: {target}")
                continue
            model, name = target
            field = model.model_fields[name]
            documented.add((model, name))
            if required_column is not None and (row[required_column] == "yes") != field.is_required():
                found.append(f"{heading}: `{key}`: documented required {row[required_column]!r}, "
                             f"schema {'required' if field.is_required() else 'optional'}")
            elif default_column is not None and not (required_column is not None and field.is_required()):
                found += [f"{heading}: `{key}`: {problem}"
                          for problem in _default_problems(row[default_column], model, name)]
            choices = _choices(field.annotation)
            if choices and (model, name) not in first_rows:
                quoted = set(re.findall(r"`([^`]+)`", " ".join(row[1:])))
                missing = [value for value in choices if str(value) not in quoted]
                if missing:
                    found.append(f"{heading}: `{key}`: allowed values {missing} of the schema not listed")
            first_rows.add((model, name))
    for model in DOCUMENTED_MODELS:
        for name, field in model.model_fields.items():
            if not field.exclude and (model, name) not in documented:
                found.append(f"{model.__name__}.{name}: a schema field no key table documents")
    return found


def _default_problems(cell: str, model: type[BaseModel], name: str) -> list[str]:
    field = model.model_fields[name]
    if "**required**" in cell:
        return [] if field.is_required() else [f"documented as required, but the default is {_default(model, name)!r}"]
    if field.is_required():
        return [f"required in the schema, documented default {cell!r}"]
    match = re.fullmatch(r"`([^`]*)`(?:\s*\([^)]*\))?", cell)
    if not match:  # prose ("most nearly square"), "-" or "none": not checked
        return []
    documented, actual = yaml.safe_load(match.group(1)), _default(model, name)
    if documented == actual or (actual is None and isinstance(documented, str) and documented in model.model_fields):
        return []  # None standing for another field's value (`saved_elements_per_sample`: the input's)
    return [f"documented default {documented!r}, schema default {actual!r}"]


# ----------------------------------------------------------------------------- the tests

def test_every_documented_key_is_a_schema_field_and_every_field_is_documented():
    assert problems(README.read_text(encoding="utf-8")) == []


def test_the_readme_has_key_tables_for_every_section():
    headings = {heading for heading, _, _ in key_tables(README.read_text(encoding="utf-8"))}
    for expected in ("Top-level keys", "`cluster`", "`model`", "`strategy`", "`training`", "`costs`",
                     "Layer tables"):
        assert any(heading.startswith(expected) for heading in headings), expected


def test_the_readme_says_ghpsim_not_python_dash_m():
    assert "python -m simulator" not in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("mutation, expected", [
    (lambda text: text.replace("| `strategy.kind` | string | - | `dp` |", "| `strategy.kind` | string | - | `mp` |"),
     "`strategy.kind`: documented default 'mp', schema default 'dp'"),
    (lambda text: text.replace("| `training.dtype` |", "| `training.dtipe` |"),
     "`training.dtipe`: training.dtipe is not a field of TrainingConfig"),
    (lambda text: re.sub(r"^\| `training\.dtype` \|.*\n", "", text, flags=re.M),
     "TrainingConfig.dtype: a schema field no key table documents"),
    (lambda text: text.replace("`sgd`, `momentum`, `adam`", "`sgd`, `momentum`"),
     "`training.optimizer`: allowed values ['adam'] of the schema not listed"),
    (lambda text: text.replace("| `global_batch_size` | int | **required**", "| `global_batch_size` | int | `1`")
     .replace("| `training.global_batch_size` | int | **required**", "| `training.global_batch_size` | int | `1`"),
     "`training.global_batch_size`: required in the schema, documented default '`1`'"),
    (lambda text: text.replace("| `peak_flops_per_s` |", "| `peak_flops` |"),
     "`peak_flops`: peak_flops is not a field of GpuSpec"),
])
def test_the_checker_catches_drift(mutation, expected):
    """Each mutation of the README is one kind of drift the checker must report."""
    text = README.read_text(encoding="utf-8")
    mutated = mutation(text)
    assert mutated != text, "the mutation no longer matches the README: update it"
    assert any(expected in problem for problem in problems(mutated)), problems(mutated)
