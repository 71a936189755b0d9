"""Field types of the scenario schema (`simulator.scenario`): counts, factors and switches that
refuse what pydantic's lax mode would coerce (a boolean as 1 / 0, a number or word as a switch).

Values follow YAML 1.2 (`simulator.yaml_loading`): `true` and `false` are the only booleans, so
`yes`, `on` or `1` given for a switch are refused, not read as true."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from simulator.limits import MAX_GPUS, MAX_LAYERS
from simulator.units import parse_quantity


def _reject_bool(value: Any) -> Any:
    """pydantic's lax mode reads true/false as 1/0 and '8' as 8; a count or factor given as a boolean
    or as text is a mistake."""
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    if isinstance(value, (str, bytes)):
        raise ValueError("expected a number, not text")
    return value


NoBool = BeforeValidator(_reject_bool)


def _index_key(value: Any) -> Any:
    """A device or node index as a mapping key: an int, or its decimal text (JSON's keys are text)
    without a leading zero ("02": 2, or octal in YAML 1.1; `_no_leading_zero`)."""
    if isinstance(value, str) and value.isdecimal() and value.isascii():
        return int(_no_leading_zero(value, value))
    return _reject_bool(value)


def _no_leading_zero(digits: str, written: str, field: str = "") -> str:
    """`digits` of a number the user wrote as `written`; "0" alone, else no leading zero, which reads
    two ways ("02": 2 or an octal number; "node02": node2 or a vertex of that name)."""
    if len(digits) > 1 and digits.startswith("0"):
        prefix = f"{field}: {written!r}: " if field else ""
        raise ValueError(f"{prefix}a leading zero is ambiguous; write {written[:-len(digits)]}{int(digits)}")
    return digits


def _link_name(name: str) -> str:
    """A `cluster.degraded_links` key: "node<n>" and "gpu<d>" write n and d without a leading zero
    (`simulator.topology.degraded_links` reads the names)."""
    match = re.fullmatch(r"(?:node|gpu)([0-9]+)", name)
    if match:
        _no_leading_zero(match[1], name, "cluster.degraded_links")
    return name


def _strict_bool(value: Any) -> Any:
    """A switch is YAML's `true` or `false`: pydantic's lax mode would read 'yes', 'on' or 1 as true."""
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _slowdown(factor: float) -> float:
    """A straggler computes `factor` times slower: a factor below 1 would make it faster than its GPU."""
    if factor < 1:
        raise ValueError("a straggler's factor is a slowdown, at least 1 (1: full speed, 2: twice as slow)")
    return factor


IndexKey = Annotated[int, BeforeValidator(_index_key), Field(ge=0)]
Int = Annotated[int, NoBool]
GpuCount = Annotated[int, NoBool, Field(gt=0, le=MAX_GPUS)]
LayerCount = Annotated[int, NoBool, Field(gt=0, le=MAX_LAYERS)]
Float = Annotated[float, NoBool, Field(allow_inf_nan=False)]
Bool = Annotated[bool, BeforeValidator(_strict_bool)]
Slowdown = Annotated[Float, AfterValidator(_slowdown)]
LinkName = Annotated[str, AfterValidator(_link_name)]
PositiveBytes = Annotated[float, BeforeValidator(lambda v: parse_quantity(v, "bytes")), Field(gt=0)]
