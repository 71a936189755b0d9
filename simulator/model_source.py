"""Turn a scenario's `model` section into a Workload: a zoo name, an inline table or a table file.

A layer-table file is YAML (a list of rows, or a mapping with `name`, `layers` and optional
`input_spec`) or CSV with the columns of `simulator.workload.LAYER_TABLE_COLUMNS`. Missing
`backward_flops_per_sample` defaults to 2x forward for layers with parameters and 1x otherwise;
missing `saved_elements_per_sample` defaults to the layer's input elements.
"""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path

import pandas as pd
import yaml
from pydantic import ValidationError

from simulator.errors import ScenarioError
from simulator.scenario import LayerRow, ModelConfig
from simulator.workload import Layer, Workload
from simulator.zoo import MODELS, build_model


def resolve_workload(model: ModelConfig, base_dir: str = ".") -> Workload:
    if model.name is not None:
        return _from_zoo(model.name, model.params)
    if model.layers is not None:
        return workload_from_rows("inline", model.layers)
    return load_layer_table(Path(base_dir) / model.file)


def _from_zoo(name: str, params: dict) -> Workload:
    key = name.lower()
    if key not in MODELS:
        near = difflib.get_close_matches(key, MODELS, n=3, cutoff=0.5)
        hint = f"nearest: {', '.join(near)}" if near else f"known: {', '.join(sorted(MODELS))}"
        raise ScenarioError(f"model.name: unknown model {name!r}; {hint}")
    _check_param_types(name, MODELS[key], params)
    try:
        workload = build_model(key, **params)
    except TypeError as error:
        raise ScenarioError(f"model.params: {params!r} not accepted by model {name!r}: {error}") from None
    except (ValueError, ZeroDivisionError) as error:
        raise ScenarioError(f"model.params: {params!r}: {error}") from None
    for layer in workload.layers:
        counts = (layer.num_params, layer.input_elements_per_sample, layer.output_elements_per_sample)
        if min(counts) < 0 or layer.output_elements_per_sample == 0:
            raise ScenarioError(f"model.params: {params!r} gives layer {layer.name!r} non-positive sizes")
    return workload


def _check_param_types(name: str, factory, params: dict) -> None:
    """ScenarioError naming `model.params.<key>` when a value is not of the kind of the factory's
    default: a number where it takes a number (a YAML `true` is not a count), a name where a name."""
    defaults = {key: parameter.default for key, parameter in inspect.signature(factory).parameters.items()
                if parameter.default is not inspect.Parameter.empty}

    def is_number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    for key, value in params.items():
        if key not in defaults:
            continue  # an unknown key: the factory's TypeError names it (`_from_zoo`)
        default = defaults[key]
        if is_number(default) and not is_number(value):
            expected = "a number"
        elif isinstance(default, str) and not isinstance(value, str):
            expected = "a name"
        elif isinstance(value, bool):
            expected = "a number or a name"
        else:
            continue
        raise ScenarioError(f"model.params.{key}: expected {expected} for model {name!r}, got {value!r}")


def load_layer_table(path: Path) -> Workload:
    """Read a layer table file (YAML or CSV)."""
    if not path.is_file():
        raise ScenarioError(f"model.file: {str(path)!r}: file not found")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        try:
            frame = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
            raise ScenarioError(f"model.file: {str(path)!r}: not a readable CSV layer table ({error})") from None
        rows = [{key: value for key, value in row.items() if not pd.isna(value)}
                for row in frame.to_dict(orient="records")]
        name, input_spec = path.stem, {}
    elif suffix in (".yaml", ".yml"):
        data = _read_table_yaml(path)
        if isinstance(data, list):
            data = {"layers": data}
        rows, name, input_spec = data.get("layers"), data.get("name", path.stem), data.get("input_spec", {})
        if not isinstance(rows, list):
            raise ScenarioError(f"{path}: layers: expected a list of layer rows")
    else:
        raise ScenarioError(f"model.file: {str(path)!r}: expected a .yaml, .yml or .csv layer table")
    try:
        validated = tuple(LayerRow.model_validate(row) for row in rows)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ScenarioError(f"{path}: layers.{field}: {first['msg']} (got {first.get('input')!r})") from None
    return workload_from_rows(name, validated, input_spec)


def _read_table_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{path}: not a readable YAML layer table ({type(error).__name__})") from None


def workload_from_rows(name: str, rows: tuple[LayerRow, ...], input_spec: dict | None = None) -> Workload:
    if not rows:
        raise ScenarioError("model.layers: the layer table is empty")
    layers = []
    for row in rows:
        backward = row.backward_flops_per_sample
        if backward is None:
            backward = row.forward_flops_per_sample * (2 if row.num_params else 1)
        saved = row.saved_elements_per_sample
        layers.append(Layer(
            name=row.name, kind=row.kind, forward_flops_per_sample=row.forward_flops_per_sample,
            backward_flops_per_sample=backward, num_params=row.num_params,
            input_elements_per_sample=row.input_elements_per_sample,
            output_elements_per_sample=row.output_elements_per_sample,
            saved_elements_per_sample=row.input_elements_per_sample if saved is None else saved))
    return Workload(name, tuple(layers), input_spec or {})
