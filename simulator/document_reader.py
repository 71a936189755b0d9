"""Typed field access for JSON documents (calibration profiles) with one-line errors.

Every failure is a ScenarioError naming the file, the dotted field and the offending value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from simulator.errors import ScenarioError


class DocumentReader:
    """Typed field access that raises one-line ScenarioErrors naming the file and the field."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, problem: str) -> ScenarioError:
        """The error, with the dotted field it names kept as its `field` attribute."""
        error = ScenarioError(f"{self.source}: {where}: {problem}")
        error.field = where
        return error

    def get(self, node: Mapping, key: str, where: str, *, optional: bool = False):
        if not isinstance(node, Mapping):
            raise self.fail(where.rsplit(".", 1)[0] or where, f"expected an object, got {show_value(node)}")
        if key not in node:
            if optional:
                return None
            raise self.fail(where, "missing field")
        return node[key]

    def mapping(self, node, key, where, *, optional=False) -> Mapping | None:
        value = self.get(node, key, where, optional=optional)
        if value is None and optional:
            return None
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected an object, got {show_value(value)}")
        return value

    def number(self, node, key, where, *, minimum: float | None = None, positive: bool = False) -> float:
        value = self.get(node, key, where)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(where, f"expected a finite number, got {show_value(value)}")
        if positive and value <= 0:
            raise self.fail(where, f"expected a number > 0, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(where, f"expected a number >= {minimum:g}, got {value!r}")
        return float(value)

    def optional_number(self, node, key, where) -> float | None:
        if self.get(node, key, where, optional=True) is None:
            return None
        return self.number(node, key, where)

    def integer(self, node, key, where, *, minimum: int | None = None) -> int:
        value = self.get(node, key, where)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, got {show_value(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def string(self, node, key, where, *, choices: tuple[str, ...] | None = None) -> str:
        value = self.get(node, key, where)
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {show_value(value)}")
        if choices is not None and value not in choices:
            raise self.fail(where, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def number_list(self, node, key, where, *, positive: bool = False, optional: bool = False) -> tuple[float, ...]:
        """A list of finite numbers, each checked as `number` and named `where[i]` in an error; () for
        an optional key that is absent."""
        value = self.get(node, key, where, optional=optional)
        if value is None and optional:
            return ()
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list of numbers, got {show_value(value)}")
        return tuple(self.number({"value": item}, "value", f"{where}[{i}]", positive=positive)
                     for i, item in enumerate(value))

    def int_list(self, node, key, where, *, optional: bool = False) -> tuple[int, ...]:
        value = self.get(node, key, where, optional=optional)
        if value is None and optional:
            return ()
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise self.fail(where, f"expected a list of non-negative integers, got {show_value(value)}")
        return tuple(value)


def show_value(value) -> str:
    """A repr cut to 60 characters, for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
