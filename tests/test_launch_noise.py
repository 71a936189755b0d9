"""The measurement-noise figure of a validation row: the standard error of a case's figure from
its launches' scatter."""

from __future__ import annotations

import math
import statistics

import pytest

pytest.importorskip("torch")

from validator.validate import launch_noise_pct  # noqa: E402


def test_launch_noise_is_the_standard_error_of_the_launch_medians_in_percent():
    medians = [0.010, 0.012, 0.014, 0.012]
    expected = 100 * statistics.stdev(medians) / 2 / 0.012
    assert launch_noise_pct(medians, 0.012) == pytest.approx(expected)
    assert launch_noise_pct([0.010, 0.010, 0.010], 0.010) == 0.0
    assert math.isnan(launch_noise_pct([0.010], 0.010))
