"""Readable quantities in scenario files ("25 GB/s", "2 us", "80 GiB", "312 TFLOP/s") -> SI floats.

The one place where units are converted: everything past the loader is SI base units
(seconds, bytes, bytes/s, FLOP/s). Decimal prefixes are powers of 1000 and binary prefixes
(Ki, Mi, Gi, Ti) powers of 1024. "Gb/s" (bits) is divided by 8. A quantity must be finite and,
unless 0, between `simulator.limits.MIN_MAGNITUDE` and `MAX_MAGNITUDE` in magnitude.
"""

from __future__ import annotations

import math
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


# ----------------------------------------------------------------------------- printing

_BYTE_PREFIXES = ("", "k", "M", "G", "T", "P", "E")
_TIME_UNITS = (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("h", 3600.0))
"""Units a duration is printed in: the largest one the duration is at least 1 of (hours beyond)."""


def format_number(value: float, digits: int = 3, min_decimals: int = 0) -> str:
    """`value` with at least `digits` significant digits and thousands separators ("1,349.9",
    "0.0173"); below 1e-3 in scientific notation ("1.70e-06")."""
    if value == 0 or not math.isfinite(value):
        return f"{value:,.{min_decimals}f}" if value == 0 else f"{value}"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude < -3:
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{max(min_decimals, digits - 1 - magnitude)}f}"


def byte_unit(value_bytes: float) -> tuple[str, float]:
    """(unit, bytes per unit) to print `value_bytes` in: the largest decimal prefix (B, kB, MB, ...
    EB) it is at least 1 of."""
    scale = 1.0
    for prefix in _BYTE_PREFIXES[1:]:
        if abs(value_bytes) < scale * 1e3:
            break
        scale *= 1e3
    return f"{_BYTE_PREFIXES[round(math.log10(scale) / 3)]}B", scale


def format_bytes(value_bytes: float) -> str:
    """Bytes with a decimal prefix and one decimal: "9.5 MB", "4.9 PB"; whole bytes below 1 kB ("512 B")."""
    if value_bytes == 0:
        return "0 B"
    unit, scale = byte_unit(value_bytes)
    return f"{value_bytes:,.0f} B" if unit == "B" else f"{value_bytes / scale:,.1f} {unit}"


def time_unit(value_s: float) -> tuple[str, float]:
    """(unit, seconds per unit) to print `value_s` in (`_TIME_UNITS`); ms for 0."""
    if value_s == 0 or not math.isfinite(value_s):
        return "ms", 1e-3
    chosen = _TIME_UNITS[0]
    for unit in _TIME_UNITS:
        if abs(value_s) >= unit[1]:
            chosen = unit
    return chosen


def format_seconds(value_s: float, digits: int = 4) -> str:
    """A duration in the unit `time_unit` picks, with `digits` significant digits: "47.41 ms",
    "9.951 s", "10,478 h", "32.8 us" (digits 3)."""
    unit, scale = time_unit(value_s)
    return f"{format_number(value_s / scale, digits)} {unit}"


def format_flops_per_s(value_flops_per_s: float) -> str:
    """FLOP/s with a decimal prefix and one decimal: "425.8 TFLOP/s", "60.1 GFLOP/s"."""
    if value_flops_per_s == 0 or not math.isfinite(value_flops_per_s):
        return f"{value_flops_per_s:.1f} FLOP/s"
    unit, scale = byte_unit(value_flops_per_s)
    return f"{value_flops_per_s / scale:,.1f} {unit[:-1]}FLOP/s"


def plural(count: float, noun: str, plural_noun: str | None = None) -> str:
    """"1 node", "2 nodes", "1.5 samples" (`plural_noun`: an irregular plural)."""
    number = f"{int(count):,}" if float(count).is_integer() else f"{count:,g}"  # never 1e+06
    return f"{number} {noun if count == 1 else plural_noun or noun + 's'}"


def format_count(value: float) -> str:
    """A count with a decimal prefix: "354.8M", "1.2B", "12.3k", "512" (parameters)."""
    for scale, prefix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.1f}{prefix}"
    return f"{value:,.0f}"


def whole(value: float) -> float | int:
    """A count as an int when it is whole (8, not 8.0, in JSON), else unchanged."""
    return int(value) if float(value).is_integer() else value
