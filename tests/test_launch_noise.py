"""The measurement-noise figures of a validation: the standard error of a case's figure from its
launches' scatter, and the MAPE that noise alone would give a perfect model."""

from __future__ import annotations

import math
import random
import statistics

import pandas as pd
import pytest

from validator.report import launch_spread_summary, noise_only_mape_pct
from validator.validate import launch_noise_pct


def test_launch_noise_is_the_standard_error_of_the_launch_medians_in_percent():
    medians = [0.010, 0.012, 0.014, 0.012]
    expected = 100 * statistics.stdev(medians) / 2 / 0.012
    assert launch_noise_pct(medians, 0.012) == pytest.approx(expected)
    assert launch_noise_pct([0.010, 0.010, 0.010], 0.010) == 0.0
    assert math.isnan(launch_noise_pct([0.010], 0.010))


def test_noise_only_mape_matches_a_simulated_perfect_model():
    """Draw figures with a known standard error around a true value, predict the true value exactly:
    the MAPE observed approaches the half-normal mean the formula gives."""
    rng = random.Random(3)
    noise = pd.Series([4.0, 8.0, 12.0] * 4000)
    observed = statistics.mean(abs(rng.gauss(0.0, se)) for se in noise)
    assert noise_only_mape_pct(noise) == pytest.approx(8.0 * math.sqrt(2 / math.pi))
    assert observed == pytest.approx(noise_only_mape_pct(noise), rel=0.03)


def test_summary_counts_the_cases_within_two_standard_errors():
    frame = pd.DataFrame({"error_pct": [3.0, -15.0, 9.0], "launches": [8, 8, 8],
                          "launch_spread_pct": [10.0, 12.0, 20.0], "launch_noise_pct": [2.0, 5.0, 5.0]})
    summary = launch_spread_summary(frame)
    assert "cases with |error| <= 2 standard errors: 2/3" in summary
    assert "median 5.0 %, max 5.0 %" in summary
    assert f"about {4.0 * math.sqrt(2 / math.pi):.1f} %" in summary
    # an older table without the column: the spread line only
    assert "standard error" not in launch_spread_summary(frame.drop(columns="launch_noise_pct"))
