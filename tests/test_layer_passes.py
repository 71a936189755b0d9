"""Layer timings in several passes spread over a calibration (validator/layer_passes.py)."""

import pytest

from validator.layer_passes import (comm_pass_spread, median_comm_over_passes, median_over_passes, pass_slots,
                                   pass_spread, pass_totals_s)


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


def _comm(scale: float) -> dict:
    """_measure_comm-shaped medians: 2 message sizes, allreduce and allgather in groups of 2 and 4."""
    groups = {g: {"times_s": [scale * g, 4 * scale * g], "concurrent_groups": 4 // g} for g in (2, 4)}
    return {"p2p": [scale, 3 * scale], "allreduce": groups, "allgather": {2: dict(groups[2])}}


def test_one_slow_comm_pass_out_of_three_does_not_move_the_fits_inputs():
    merged = median_comm_over_passes([_comm(1.0), _comm(2.0), _comm(1.1)])  # the second caught a slow spell
    assert merged["p2p"] == pytest.approx([1.1, 3.3])
    assert merged["allreduce"][4]["times_s"] == pytest.approx([4.4, 17.6])
    assert merged["allreduce"][2]["concurrent_groups"] == 2
    assert merged["allgather"][2]["times_s"] == pytest.approx([2.2, 8.8])
    spread = comm_pass_spread([_comm(1.0), _comm(2.0), _comm(1.1)])
    assert set(spread) == {"p2p", "allreduce.2", "allreduce.4", "allgather.2"}
    assert spread["allreduce.4"]["relative_totals"] == pytest.approx([1 / 1.1, 2 / 1.1, 1.0])
    assert spread["p2p"]["spread_pct"] == pytest.approx(100.0)


def test_comm_passes_of_a_single_rank_world_have_no_p2p():
    alone = {"p2p": None, "allreduce": {}, "allgather": {}}
    assert median_comm_over_passes([alone, alone]) == alone
    assert comm_pass_spread([alone]) == {}
    with pytest.raises(ValueError):
        median_comm_over_passes([])
