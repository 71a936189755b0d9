"""The profile's `layer_sweep` section (simulator.layer_sweep): parsing, interpolation over batch
sizes, the one-line errors, and the microbenchmark that measures it (validator.sweep_bench)."""

from __future__ import annotations

import re

import pytest

from simulator.document_reader import DocumentReader
from simulator.errors import ScenarioError
from simulator.layer_sweep import parse_layer_sweep

SECTION = {"batch_sizes": [4, 16, 64], "trials": 5, "passes": 6, "ranks_at_once": 2,
           "forward_ratios": [[1.0, 0.9, 0.8], [1.2, 1.2, 1.2]],
           "backward_ratios": [[1.1, 1.3, 1.0], [2.0, 2.0, 2.0]]}


def test_ratios_are_interpolated_in_the_batch_size_and_held_outside():
    sweep = parse_layer_sweep(DocumentReader("p.json"), {"layer_sweep": SECTION}, 2)
    assert sweep.ratio("B", 0, 4) == pytest.approx(1.1)
    assert sweep.ratio("B", 0, 10) == pytest.approx(1.2)  # half way from 4 to 16
    assert sweep.ratio("B", 0, 40) == pytest.approx(1.15)  # half way from 16 to 64
    assert sweep.ratio("F", 0, 1) == pytest.approx(1.0) and sweep.ratio("F", 0, 128) == pytest.approx(0.8)
    assert sweep.ratio("F", 1, 16) == pytest.approx(1.2)
    assert parse_layer_sweep(DocumentReader("p.json"), {}, 2) is None


@pytest.mark.parametrize("change,field", [
    ({"batch_sizes": []}, "layer_sweep.batch_sizes"),
    ({"batch_sizes": [16, 4, 64]}, "layer_sweep.batch_sizes"),
    ({"batch_sizes": [4, 16.5, 64]}, "layer_sweep.batch_sizes[1]"),
    ({"forward_ratios": [[1.0, 1.0, 1.0]]}, "layer_sweep.forward_ratios"),
    ({"backward_ratios": [[1.0, 1.0], [1.0, 1.0, 1.0]]}, "layer_sweep.backward_ratios[0]"),
    ({"backward_ratios": [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]}, "layer_sweep.backward_ratios[1][1]"),
])
def test_a_bad_section_names_the_field(change, field):
    with pytest.raises(ScenarioError, match=re.escape(f"p.json: {field}: ")):
        parse_layer_sweep(DocumentReader("p.json"), {"layer_sweep": {**SECTION, **change}}, 2)


def test_the_microbenchmark_gives_a_ratio_per_layer_and_batch_size():
    pytest.importorskip("torch")
    from simulator.zoo import build_model
    from validator.sweep_bench import time_layer_sweeps

    workload = build_model("mlp", input_dim=32, hidden_dim=64, num_hidden_layers=2, num_classes=4)
    calls = []
    section = time_layer_sweeps(workload, [4, 8], trials=2, passes=3, barrier=lambda: calls.append(1))
    assert section["batch_sizes"] == [4, 8] and section["trials"] == 2 and section["passes"] == 3
    for phase in ("forward", "backward"):
        rows = section[f"{phase}_ratios"]
        assert len(rows) == workload.num_layers and all(len(row) == 2 and min(row) > 0 for row in rows)
    assert len(calls) == 2 * 2 + 1  # before every trial of every batch size, and once at the end
    idle = []
    assert time_layer_sweeps(workload, [4, 8], trials=2, passes=3, barrier=lambda: idle.append(1), active=False) is None
    assert len(idle) == len(calls)  # an idle rank meets the measuring ranks at every barrier
    with pytest.raises(ValueError, match="passes"):
        time_layer_sweeps(workload, [4], passes=2)
