"""Measured peak memory of real 2-stage GPipe and 1F1B runs against the prediction (issue 6's 15 %
target), and the schedule effect the model claims: with m > p micro-batches, 1F1B keeps at most
p - k of them on stage k where GPipe keeps all m, so stage 0's peak is lower.
(The full figures come from benchmarks/bench_memory.py.)"""

import pytest

pytest.importorskip("torch")

from simulator.scenario import load_scenario  # noqa: E402
from validator.memory_measure import measure_memory  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

# activation-heavy MLP (wide hidden layers, narrow input, large batch): the schedule's term is a
# large part of the peak, the data batch (whole on stage 0 in the runtime) a small one
SMALL = ["cluster.gpus_per_node=2", "model.params.input_dim=32", "model.params.hidden_dim=512",
         "model.params.num_hidden_layers=3", "training.global_batch_size=512"]
M = 8


@pytest.fixture(scope="module")
def rows():
    scenario = load_scenario("scenarios/validation/mlp_cpu.yaml", SMALL)
    found = measure_memory(scenario, [(f"gpipe:{M}", None), (f"1f1b:{M}", None)], timeout_s=120)
    return {(row["strategy"].split(":")[0], row["rank"]): row for row in found}


def test_measured_pipeline_peaks_are_within_15_percent_of_the_prediction(rows):
    assert sorted(rows) == [("1f1b", 0), ("1f1b", 1), ("gpipe", 0), ("gpipe", 1)]
    for row in rows.values():
        assert abs(row["error_pct"]) < 15, row


def test_1f1b_holds_fewer_microbatches_than_gpipe_on_stage_0(rows):
    gpipe, one_f_one_b = rows[("gpipe", 0)], rows[("1f1b", 0)]
    predicted_drop = gpipe["predicted_bytes"] - one_f_one_b["predicted_bytes"]
    measured_drop = gpipe["measured_bytes"] - one_f_one_b["measured_bytes"]
    # stage 0 of p = 2: GPipe keeps m = 8 micro-batches' activations, 1F1B 2: the prediction drops by
    # at least half GPipe's activations (6 of 8 micro-batches), and the measurement drops as much
    activations = gpipe["breakdown_bytes"]["activations"]
    assert predicted_drop >= 0.5 * activations > 0
    assert measured_drop == pytest.approx(predicted_drop, rel=0.25)

