"""Readable quantities in scenario files ("25 GB/s", "2 us", "80 GiB", "312 TFLOP/s") -> SI floats.

The one place where units are converted: everything past the loader is SI base units
(seconds, bytes, bytes/s, FLOP/s). Decimal prefixes are powers of 1000 and binary prefixes
(Ki, Mi, Gi, Ti) powers of 1024. "Gb/s" (bits) is divided by 8. A quantity must be finite and,
unless 0, between `simulator.limits.MIN_MAGNITUDE` and `MAX_MAGNITUDE` in magnitude.
"""

from __future__ import annotations

import numbers
import re

from simulator.limits import check_quantity

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ns": 1e-9}
_PATTERN = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z\u00b5\u03bc/]*)\s*$")

UNIT_KINDS = ("s", "bytes", "bytes_per_s", "flops_per_s")


def parse_quantity(value: object, kind: str) -> float:
    """Convert a number or a readable string of the given kind to SI; ValueError if it does not parse.

    kind: "s" (time), "bytes", "bytes_per_s" (also accepts bits per second "b/s"),
    "flops_per_s". Plain numbers are taken as already in SI units.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a quantity string, got {value!r}")
    if kind not in UNIT_KINDS:
        raise ValueError(f"unknown unit kind {kind!r}")
    if isinstance(value, numbers.Real):
        return check_quantity(float(value), str(value))
    if not isinstance(value, str):
        raise ValueError(f"expected a number or a quantity string, got {value!r}")
    match = _PATTERN.match(value)
    if not match:
        raise ValueError(f"cannot read quantity {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    if unit == "":
        return check_quantity(number, value)
    factor = _unit_factor(unit, kind)
    if factor is None:
        raise ValueError(f"unit {unit!r} in {value!r} is not a unit of {kind}")
    return check_quantity(number * factor, value)


def _unit_factor(unit: str, kind: str) -> float | None:
    if kind == "s":
        return _TIME.get(unit)
    if kind == "bytes":
        return _prefixed(unit, ("B",))
    if kind == "bytes_per_s":
        per_byte = _prefixed(unit, ("B/s", "Bps"))
        if per_byte is not None:
            return per_byte
        per_bit = _prefixed(unit, ("b/s", "bps", "bit/s"))
        return None if per_bit is None else per_bit / 8.0
    if kind == "flops_per_s":
        return _prefixed(unit, ("FLOP/s", "FLOPS", "flop/s", "flops"))
    raise ValueError(f"unknown unit kind {kind!r}")


def _prefixed(unit: str, suffixes: tuple[str, ...]) -> float | None:
    for suffix in suffixes:
        if unit.endswith(suffix):
            prefix = unit[: -len(suffix)]
            if prefix in _PREFIX:
                return _PREFIX[prefix]
    return None
