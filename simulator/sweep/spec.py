"""Sweep files: a base scenario and axes of scenario fields, expanded into points.

    name: resnet50_scaling
    base: ../resnet50_dp_a100.yaml          # or an inline scenario mapping
    mode: product                           # or zip
    axes:
      cluster.num_nodes: {start: 1, stop: 16, factor: 2}       # 1, 2, 4, 8, 16
      strategy.kind,strategy.num_groups: [[dp, null], [ghp, 4]]  # a linked (tuple) axis

An axis is a dotted scenario field (or several, comma-separated, moving together) with a list of
values, an arithmetic range `{start, stop, step}` or a geometric one `{start, stop, factor}`;
`stop` is included when hit. Points that are invalid scenarios keep their one-line error.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from simulator import __version__
from simulator.errors import ScenarioError
from simulator.scenario import Scenario, read_yaml, scenario_from_dict
from simulator.sweep.columns import result_columns
from simulator.validation_errors import format_validation_error

MAX_POINTS = 100_000
"""Points are held in memory (a few kB each) before they run."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RangeAxis(_Frozen):
    """start, start + step, ... up to and including stop."""

    start: int | float
    stop: int | float
    step: Annotated[int | float, Field(gt=0)]

    def values(self) -> list:
        count = math.floor((self.stop - self.start) / self.step + 1e-9) + 1
        if count < 1:
            raise ValueError(f"stop {self.stop!r} is below start {self.start!r}")
        _check_count(count)
        return [_tidy(self.start + index * self.step) for index in range(count)]


class GeometricAxis(_Frozen):
    """start, start x factor, start x factor^2, ... up to and including stop."""

    start: Annotated[int | float, Field(gt=0)]
    stop: int | float
    factor: Annotated[int | float, Field(gt=1)]

    def values(self) -> list:
        if self.stop < self.start:
            raise ValueError(f"stop {self.stop!r} is below start {self.start!r}")
        count = math.floor(math.log(self.stop / self.start) / math.log(self.factor) + 1e-9) + 1
        _check_count(count)
        return [_tidy(self.start * self.factor ** index) for index in range(count)]


def _check_count(count: int) -> None:
    if count > MAX_POINTS:
        raise ValueError(f"{count:,} values (at most {MAX_POINTS:,})")


def _tidy(value):
    return value if isinstance(value, int) else round(value, 12)


def _axis_kind(value) -> str | None:
    """A list is a list of values; a mapping with `factor` is geometric, any other mapping a range."""
    if isinstance(value, dict):
        return "geometric" if "factor" in value else "range"
    return "list" if isinstance(value, (list, tuple)) else None


Axis = Annotated[Union[Annotated[RangeAxis, Tag("range")], Annotated[GeometricAxis, Tag("geometric")],
                       Annotated[Annotated[tuple[Any, ...], Field(min_length=1)], Tag("list")]],
                 Discriminator(_axis_kind, custom_error_type="axis",
                               custom_error_message="expected a list of values, {start, stop, step} "
                                                    "or {start, stop, factor}")]


class SweepSpec(_Frozen):
    name: str = "sweep"
    description: str = ""
    base: str | dict[str, Any]
    """A scenario file (relative to the sweep file) or an inline scenario mapping."""
    mode: Literal["product", "zip"] = "product"
    axes: Annotated[dict[str, Axis], Field(min_length=1)]

    @model_validator(mode="after")
    def _check_axes(self) -> "SweepSpec":
        lengths, axis_of, sections_of = {}, {}, {}  # a field -> its axis; a section -> a field below it
        for name, axis in self.axes.items():
            try:
                values = axis_values(axis)
            except ValueError as error:
                raise ValueError(f"axes.{name}: {error}") from None
            fields = axis_fields(name)
            for index, field in enumerate(fields):
                check_field_path(field)
                if field in fields[:index]:
                    raise ValueError(f"axes.{name}: {field!r} appears twice in this axis")
                if field in axis_of:
                    raise ValueError(f"axes: {field!r} appears in two axes ({axis_of[field]!r} and {name!r})")
                sections = [field.rsplit(".", depth)[0] for depth in range(1, field.count(".") + 1)]
                inside = next((section for section in sections if section in axis_of), None) or sections_of.get(field)
                if inside is not None:
                    raise ValueError(f"axes: {inside!r} and {field!r} overlap (one is a section of the other)")
                axis_of[field] = name
                sections_of.update((section, field) for section in sections if section not in sections_of)
            if len(fields) > 1:
                for value in values:
                    if not isinstance(value, list) or len(value) != len(fields):
                        raise ValueError(f"axes.{name}: each value must be a list of {len(fields)} "
                                         f"(one per field), got {value!r}")
            lengths[name] = len(values)
        _check_result_columns(list(axis_of))
        if self.mode == "zip" and len(set(lengths.values())) > 1:
            raise ValueError(f"mode: zip needs axes of equal length, got {lengths}")
        total = min(lengths.values()) if self.mode == "zip" else math.prod(lengths.values())
        if total > MAX_POINTS:
            raise ValueError(f"axes: {total:,} points (at most {MAX_POINTS:,})")
        return self


def _check_result_columns(fields: list[str]) -> None:
    """ValueError for a swept field named as one of results.csv's own columns (`model`, `strategy`):
    the file would hold that column twice."""
    own_columns = set(result_columns([]))
    for field in fields:
        if field in own_columns:
            section = _inner(Scenario.model_fields[field].annotation)
            example = f" (e.g. '{field}.{next(iter(section.model_fields))}')" if section not in (None, dict) else ""
            raise ValueError(f"axes: {field!r} is also a column of results.csv (the simulated {field}), which "
                             f"would hold it twice: sweep the fields below it instead{example}")


def axis_fields(name: str) -> list[str]:
    return [part.strip() for part in name.split(",")]


def axis_values(axis) -> list:
    return list(axis) if isinstance(axis, tuple) else axis.values()


def check_field_path(dotted: str) -> None:
    """`a.b.c` must name a scenario field; below a free-form mapping (model.params) anything goes."""
    unknown = unknown_field_part(dotted)
    if unknown is not None:
        raise ValueError(f"axes: {dotted!r} is not a scenario field ({unknown} unknown)")


def unknown_field_part(dotted: str) -> str | None:
    """The leading part of `a.b.c` that is not a scenario field (None when it names one; below a
    free-form mapping, model.params, anything goes). Also used for `ghpsim fit`'s column names."""
    node: Any = Scenario
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if node is dict:
            return None
        field = node.model_fields.get(part) if node is not None else None
        if not part or field is None or field.exclude:
            return ".".join(parts[:depth + 1])
        node = _inner(field.annotation)
    return None


def integer_field(dotted: str) -> bool:
    """Whether the scenario field `a.b.c` holds an integer (int or None; False below a free-form
    mapping and for unknown fields)."""
    node: Any = Scenario
    annotation = None
    for part in dotted.split("."):
        field = node.model_fields.get(part) if isinstance(node, type) and issubclass(node, BaseModel) else None
        if field is None:
            return False
        annotation, node = field.annotation, _inner(field.annotation)
    return _leaf_types(annotation) == {int}


def _leaf_types(annotation) -> set:
    """The types a (possibly Optional or Annotated) annotation allows, None left out."""
    if get_origin(annotation) is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return set().union(*(_leaf_types(arg) for arg in get_args(annotation)))
    return set() if annotation is type(None) else {annotation}


def _inner(annotation):
    """A pydantic model class to descend into, `dict` for a free-form mapping, None for a leaf."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return dict if getattr(annotation, "__origin__", annotation) is dict else None


# ----------------------------------------------------------------------------- points

@dataclass(frozen=True)
class Point:
    """One combination of axis values: its scenario and key, or the error that made it invalid."""

    index: int
    values: dict[str, Any]
    scenario: Scenario | None
    key: str | None
    error: str | None


@dataclass(frozen=True)
class Sweep:
    spec: SweepSpec
    source: str
    base: dict
    base_dir: str

    def columns(self) -> list[str]:
        return [field for name in self.spec.axes for field in axis_fields(name)]

    def points(self) -> list[Point]:
        return [self._point(index, values) for index, values in enumerate(self._combinations())]

    def _combinations(self):
        names = list(self.spec.axes)
        values = [axis_values(self.spec.axes[name]) for name in names]
        combine = zip if self.spec.mode == "zip" else itertools.product
        for combination in combine(*values):
            row = {}
            for name, value in zip(names, combination):
                fields = axis_fields(name)
                row.update(zip(fields, value) if len(fields) > 1 else [(fields[0], value)])
            yield row

    def _point(self, index: int, values: dict) -> Point:
        raw = copy.deepcopy(self.base)
        for field, value in values.items():
            set_field(raw, field, value, self.source)
        try:
            scenario = scenario_from_dict(raw, origin=f"point {index}", base_dir=self.base_dir)
        except ScenarioError as error:
            return Point(index, values, None, None, str(error))
        return Point(index, values, scenario, scenario_key(scenario), None)


def set_field(raw: dict, dotted: str, value, source: str) -> None:
    keys = dotted.split(".")
    node = raw
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ScenarioError(f"{source}: axes.{dotted}: the base scenario's "
                                f"{'.'.join(keys[:depth + 1])} is {child!r}, not a mapping")
        node = child
    node[keys[-1]] = copy.deepcopy(value)


def canonical_json(scenario: Scenario) -> str:
    """The resolved scenario (presets expanded) as canonical JSON: sorted keys, no spaces."""
    return json.dumps(scenario.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def scenario_key(scenario: Scenario) -> str:
    """sha256 of the ghpsim version and the resolved scenario's canonical JSON."""
    text = f'{{"ghpsim":{json.dumps(__version__)},"scenario":{canonical_json(scenario)}}}'  # sorted keys
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file and its base scenario: ScenarioError naming the sweep file
    where the base as written is invalid and no point (the base with its axis values) is valid
    either; points are built only in that check."""
    path = Path(path)
    raw = read_yaml(path)
    _check_top_level_keys(raw, path)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        raise ScenarioError(format_validation_error(error, str(path))) from None
    if isinstance(spec.base, str):
        base_path = path.parent / spec.base
        if not base_path.is_file():
            problem = "is a directory, not a scenario file" if base_path.is_dir() else \
                "is not a regular file" if base_path.exists() else "not found"
            raise ScenarioError(f"{path}: base: scenario file {str(base_path)!r} {problem}")
        base, base_dir = read_yaml(base_path), str(base_path.parent)
    else:
        base, base_dir = dict(spec.base), str(path.parent)
    for field in ("base_dir", "source"):
        if field in base:
            raise ScenarioError(f"{path}: base.{field}: unknown key")
    origin = f"{path}: base {str(base_path)!r}" if isinstance(spec.base, str) else f"{path}: base"
    sweep = Sweep(spec, str(path), base, base_dir)
    try:
        scenario_from_dict(copy.deepcopy(base), origin=origin, base_dir=base_dir)
    except ScenarioError:  # the axes may fill in what the base leaves out: refused where no point is valid
        if not any(point.error is None for point in sweep.points()):
            raise
    return sweep


def _check_top_level_keys(raw: dict, path: Path) -> None:
    """ScenarioError for a scenario file given as a sweep, else naming the first unknown top-level
    key (a misspelt `axez` is named, not reported as `axes` missing)."""
    known = list(SweepSpec.model_fields)
    if not {"base", "axes"} & set(raw) and set(raw) & set(Scenario.model_fields):
        raise ScenarioError(f"{path}: a scenario file, not a sweep (a sweep has base and axes): "
                            f"run it with `ghpsim simulate {path}`")
    unknown = [key for key in raw if key not in known]
    if unknown:
        key = " ".join(str(unknown[0]).split())  # as the scenario's unknown keys: unquoted, on one line
        raise ScenarioError(f"{path}: {key if len(key) <= 40 else key[:37] + '...'}: unknown key (a sweep file "
                            f"has {', '.join(known)})")
