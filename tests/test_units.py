"""parse_quantity: readable quantity strings -> SI floats."""

from __future__ import annotations

import pytest

from simulator.units import (UNIT_KINDS, format_bytes, format_count, format_flops_per_s, format_number,
                             format_seconds, parse_quantity, plural, time_unit)


@pytest.mark.parametrize(("text", "expected"), [
    ("1 kB", 1e3), ("1 KB", 1e3), ("1 MB", 1e6), ("32 GB", 32e9), ("2 TB", 2e12), ("7 B", 7.0),
    ("1 KiB", 2**10), ("1 MiB", 2**20), ("80 GiB", 80 * 2**30), ("1 TiB", 2**40),
])
def test_bytes_decimal_and_binary_prefixes(text, expected):
    assert parse_quantity(text, "bytes") == pytest.approx(expected)


def test_binary_differs_from_decimal():
    assert parse_quantity("1 GiB", "bytes") > parse_quantity("1 GB", "bytes")
    assert parse_quantity("1 GiB", "bytes") / parse_quantity("1 GB", "bytes") == pytest.approx(1.073741824)


@pytest.mark.parametrize(("text", "expected"), [
    ("25 GB/s", 25e9), ("2 TB/s", 2e12), ("900 GBps", 900e9), ("1 GiB/s", 2**30),
    ("200 Gb/s", 25e9), ("100 Gbps", 12.5e9), ("10 Gbit/s", 1.25e9), ("8 b/s", 1.0),
])
def test_bytes_and_bits_per_second(text, expected):
    assert parse_quantity(text, "bytes_per_s") == pytest.approx(expected)


def test_bits_are_an_eighth_of_bytes():
    assert parse_quantity("100 Gb/s", "bytes_per_s") * 8 == pytest.approx(parse_quantity("100 GB/s", "bytes_per_s"))


@pytest.mark.parametrize(("text", "expected"), [
    ("2 s", 2.0), ("3 ms", 3e-3), ("2 us", 2e-6), ("2 \u00b5s", 2e-6), ("500 ns", 5e-7),
    (".5 us", 5e-7), ("1.5e-3 s", 1.5e-3),
])
def test_time_units(text, expected):
    assert parse_quantity(text, "s") == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("312 TFLOP/s", 312e12), ("19.5 TFLOPS", 19.5e12), ("160 GFLOP/s", 160e9),
    ("1 PFLOP/s", 1e15), ("2 Tflop/s", 2e12),
])
def test_flops(text, expected):
    assert parse_quantity(text, "flops_per_s") == pytest.approx(expected)


@pytest.mark.parametrize("kind", UNIT_KINDS)
@pytest.mark.parametrize(("value", "expected"), [(5, 5.0), (2.5, 2.5), (0, 0.0), (-1, -1.0),
                                                 ("42", 42.0), (" 1e3 ", 1000.0)])
def test_plain_numbers_pass_through(kind, value, expected):
    result = parse_quantity(value, kind)
    assert result == expected and isinstance(result, float)


def test_whitespace_tolerated():
    assert parse_quantity("  25GB/s  ", "bytes_per_s") == pytest.approx(25e9)


@pytest.mark.parametrize(("value", "kind"), [
    ("fast", "bytes_per_s"), ("", "s"), ("GB/s", "bytes_per_s"), ("1..2 GB", "bytes"),
    ("25 GB / s", "bytes_per_s"), ("1,000 B", "bytes"), ("1 XB", "bytes"), ("1 iB", "bytes"),
    ("2 min", "s"),
])
def test_bad_strings_raise(value, kind):
    with pytest.raises(ValueError):
        parse_quantity(value, kind)


@pytest.mark.parametrize(("value", "kind"), [
    ("2 us", "bytes"), ("25 GB/s", "bytes"), ("80 GiB", "bytes_per_s"), ("80 GiB", "s"),
    ("312 TFLOP/s", "bytes_per_s"), ("25 GB/s", "flops_per_s"), ("1 GB", "flops_per_s"),
    ("100 Gb", "bytes"), ("5 ms", "flops_per_s"),
])
def test_wrong_kind_unit_raises(value, kind):
    with pytest.raises(ValueError, match="not a unit of"):
        parse_quantity(value, kind)


@pytest.mark.parametrize("value", [True, False])
def test_booleans_rejected(value):
    with pytest.raises(ValueError):
        parse_quantity(value, "s")


@pytest.mark.parametrize("value", [None, [1], {"a": 1}, b"1 s"])
def test_other_types_rejected(value):
    with pytest.raises(ValueError):
        parse_quantity(value, "s")


def test_unknown_kind_with_unit_raises():
    with pytest.raises(ValueError):
        parse_quantity("1 GB", "watts")


# ----------------------------------------------------------------------------- printing

@pytest.mark.parametrize(("value", "expected"), [
    (0, "0 B"), (512, "512 B"), (1500, "1.5 kB"), (9_498_704, "9.5 MB"), (37.534e9, "37.5 GB"),
    (4_864_239_441.3e6, "4.9 PB"),
])
def test_format_bytes_picks_a_decimal_prefix(value, expected):
    assert format_bytes(value) == expected


@pytest.mark.parametrize(("value_s", "expected"), [
    (0.04741, "47.41 ms"), (9.950606, "9.951 s"), (37_719_183.389, "10,478 h"), (2.5e-7, "250.0 ns"),
    (0, "0 ms"),
])
def test_format_seconds_picks_a_unit_and_keeps_four_digits(value_s, expected):
    assert format_seconds(value_s) == expected


def test_format_seconds_rounds_to_the_digits_asked():
    assert format_seconds(32.7848e-6, 3) == "32.8 us"
    assert time_unit(18.26) == ("s", 1.0) and time_unit(0.5) == ("ms", 1e-3) and time_unit(7200) == ("h", 3600.0)


@pytest.mark.parametrize(("value", "expected"), [
    (1349.94, "1,349.9"), (25.7, "25.7"), (0.738, "0.738"), (0.0173, "0.0173"), (1.7e-6, "1.70e-06"),
])
def test_format_number_keeps_three_significant_digits(value, expected):
    assert format_number(value, 3, 1) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (425.8e12, "425.8 TFLOP/s"), (30.1e9, "30.1 GFLOP/s"), (9.8e3, "9.8 kFLOP/s"), (0.0, "0.0 FLOP/s"),
])
def test_format_flops_per_s_picks_a_decimal_prefix(value, expected):
    assert format_flops_per_s(value) == expected


def test_plural():
    assert [plural(1, "node"), plural(2, "node"), plural(1.0, "sample"), plural(0.5, "sample")] == \
        ["1 node", "2 nodes", "1 sample", "0.5 samples"]


@pytest.mark.parametrize("count, expected", [(354.8e6, "354.8M"), (174.6e9, "174.6B"), (12_345, "12.3k"),
                                             (512, "512"), (1.2e12, "1.2T")])
def test_counts_take_a_decimal_prefix(count, expected):
    assert format_count(count) == expected
