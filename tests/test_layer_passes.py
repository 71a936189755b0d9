"""Layer timings in several passes spread over a calibration (validator/layer_passes.py)."""

import pytest

from validator.layer_passes import median_over_passes, pass_slots, pass_spread, pass_totals_s


def _rows(scale: float) -> list[dict]:
    """time_layers-shaped rows: 2 layers, 2 batch sizes, 2 rounds; every figure times `scale`."""
    rows = []
    for index in range(2):
        rounds = [{"forward_s": [scale * (index + 1), scale * (index + 2)],
                   "backward_s": [2 * scale * (index + 1), 2 * scale * (index + 2)]},
                  {"forward_s": [scale * 10], "backward_s": [scale * 20]}]
        rows.append({"index": index, "name": f"l{index}", "batch_sizes": [4, 16], "rounds": rounds,
                     "forward_s": rounds[0]["forward_s"], "backward_s": rounds[0]["backward_s"]})
    return rows


def test_passes_spread_from_start_to_end_between_phases():
    assert pass_slots(1, 4) == [0]
    assert pass_slots(2, 4) == [0, 4]
    assert pass_slots(3, 4) == [0, 2, 4]
    assert pass_slots(5, 4) == [0, 1, 2, 3, 4]
    assert pass_slots(6, 2) == [0, 0, 1, 1, 2, 2]  # more passes than slots: back to back
    with pytest.raises(ValueError, match="layer passes must be >= 1, got 0"):
        pass_slots(0, 4)


def test_one_slow_pass_out_of_three_does_not_move_the_figures():
    merged = median_over_passes([_rows(1.0), _rows(1.5), _rows(1.1)])  # the second caught a slow spell
    assert merged == _rows(1.1)  # every figure: the middle pass's
    assert merged[1]["forward_s"] == pytest.approx([2.2, 3.3])
    assert merged[1]["rounds"][1]["backward_s"] == pytest.approx([22.0])


def test_median_over_one_pass_is_that_pass():
    assert median_over_passes([_rows(2.0)]) == _rows(2.0)
    with pytest.raises(ValueError):
        median_over_passes([])


def test_pass_totals_and_their_spread():
    # per pass: round 0 sums (1+2 + 2+3) + 2 x that = 24, round 1 sums 2 x (10 + 20) = 60 -> 84 x scale
    assert pass_totals_s([_rows(1.0), _rows(2.0)]) == pytest.approx([84.0, 168.0])
    spread = pass_spread([[1.0, 1.2, 1.5], [1.0, 1.0, 1.5]])  # two ranks' totals per pass
    assert spread["passes"] == 3
    assert spread["relative_totals"] == pytest.approx([2.0 / 2.2, 1.0, 3.0 / 2.2])
    assert spread["spread_pct"] == pytest.approx(50.0)
