"""benchmarks/bench_published.py on a few rows of the published table's format: each row becomes the
scenario of its layout, the figures are scored, `--plot` draws predicted against measured, and bad
input is one line with exit code 2 and no figure written."""

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_published import COLUMNS, JOB_COLUMNS, error_table, layout_choice, main, read_rows, row_scenario  # noqa: E402

from simulator.scenario import scenario_from_dict  # noqa: E402

ROWS = [  # the first rows of vtrain_a100_single_node.csv (GPUs, global batch, micro batch, hidden, heads,
    # layers, sequence, TP, DP, PP, iteration ms)
    (2, 16, 8, 1024, 16, 24, 1024, 1, 1, 2, 372.160408),
    (8, 32, 4, 1024, 16, 24, 1024, 2, 2, 2, 219.732754),
    (8, 8, 2, 2048, 16, 20, 1024, 4, 1, 2, 160.6027),
    (8, 32, 2, 1024, 16, 24, 1024, 1, 8, 1, 186.469067),  # a later row: the second row's job, another layout
]


@pytest.fixture
def published_csv(tmp_path):
    path = tmp_path / "published.csv"
    pd.DataFrame(ROWS, columns=list(COLUMNS)).to_csv(path, index=False)
    return path


def test_each_row_is_the_scenario_of_its_layout(published_csv):
    for row in read_rows(published_csv).itertuples(index=False):
        scenario = scenario_from_dict(row_scenario(row))
        strategy = scenario.strategy
        assert scenario.num_gpus == row.num_gpus == row.tp * row.pp * row.dp
        assert (strategy.tp_degree, strategy.pp_degree) == (row.tp, row.pp)
        assert strategy.num_microbatches * row.micro_batch * row.dp == row.global_batch


def test_error_table_groups_the_signed_error():
    frame = pd.DataFrame({"measured_ms": [100.0, 200.0], "predicted_ms": [110.0, 180.0], "tp": [1, 8],
                          "pp": [1, 1], "micro_batch": [1, 1], "hidden": [1024, 1024]})
    table = error_table(frame)
    assert table["mape_pct"] == pytest.approx(10.0) and table["mean_signed_pct"] == pytest.approx(0.0)
    assert table["mean_signed_by_group_pct"]["tp"] == {"1": 10.0, "8": -10.0}


def test_layout_choice_scores_the_pick_of_each_job_against_its_measured_fastest():
    job = dict.fromkeys(JOB_COLUMNS, 1)
    layouts = [  # (job, measured ms, predicted ms): job 1 picks its 120 ms layout, job 2 its fastest
        (1, 100.0, 90.0), (1, 120.0, 80.0), (1, 150.0, 95.0), (2, 50.0, 40.0), (2, 60.0, 45.0), (3, 70.0, 70.0)]
    frame = pd.DataFrame([{**job, "layers": number, "measured_ms": measured} for number, measured, _ in layouts])
    choice = layout_choice(frame, [predicted for *_, predicted in layouts])
    assert choice["jobs"] == 2  # job 3 has one layout: nothing to choose
    assert choice["fastest_picked_share"] == 0.5
    assert choice["worst_regret_pct"] == pytest.approx(20.0) and choice["mean_regret_pct"] == pytest.approx(10.0)
    assert choice["random_pick_mean_regret_pct"] == pytest.approx(((20 + 50) / 3 + 20 / 2) / 2)
    assert choice["median_spearman"] == pytest.approx(0.5)  # job 1's ranks 2, 1, 3 against 1, 2, 3


def test_plot_of_predicted_against_measured(published_csv, tmp_path, capsys):
    figure = tmp_path / "out" / "accuracy.png"
    assert main(["--csv", str(published_csv), "--no-fit", "--plot", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "kernel model, catalogue" in out and "layout choice over 1 job:" in out


@pytest.mark.parametrize("arguments, named", [
    (["--plot", "{tmp}/accuracy.xyz"], "--plot"),
    (["--csv", "{tmp}/missing.csv"], "missing.csv"),
])
def test_bad_input_is_one_line_exit_2_and_no_figure(arguments, named, tmp_path, capsys):
    arguments = [argument.format(tmp=tmp_path) for argument in arguments]
    assert main(["--no-fit", *arguments]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and named in error[0]
    assert not list(tmp_path.iterdir())
