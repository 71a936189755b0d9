"""Ranking quality against real runs (validator/rank_check.py): Kendall's tau, top-1 regret, the
choice of cases, and the `ghpsim validate --rank` plumbing (real runs replaced by a stand-in)."""

from __future__ import annotations

import json
import os
import math

import pytest

pytest.importorskip("torch")

from ghpsim.cli import main  # noqa: E402
import validator.validate  # noqa: E402
from simulator.planner import _profile_costs, rank_candidates  # noqa: E402
from simulator.profile import FORMAT  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from simulator.zoo import build_model  # noqa: E402
from validator.rank_check import (checked_kinds, distinct_predictions, kendall_tau, pick_cases,  # noqa: E402
                                  rank_check, top1_regret_pct)

PARAMS = dict(input_dim=64, hidden_dim=64, num_hidden_layers=3, num_classes=10)
SCENARIO = {
    "name": "tiny_cpu",
    "cluster": {"num_nodes": 1, "gpus_per_node": 4, "gpu": "cpu", "intra_node_link": "loopback",
                "inter_node_link": "loopback"},
    "model": {"name": "mlp", "params": PARAMS},
    "training": {"global_batch_size": 16},
}


@pytest.mark.parametrize("x, y, expected", [
    ([1, 2, 3], [10, 20, 30], 1.0),
    ([1, 2, 3], [3, 2, 1], -1.0),
    ([1, 2, 3, 4], [1, 3, 2, 4], (5 - 1) / 6),            # one discordant pair of six
    ([1, 1, 2], [1, 2, 3], 2 / math.sqrt((3 - 1) * 3)),   # a tie in x: tau-b
    ([5, 1, 4, 2, 3], [2, 1, 5, 3, 4], (7 - 3) / 10),
])
def test_kendall_tau_by_hand(x, y, expected):
    assert kendall_tau(x, y) == pytest.approx(expected)
    assert math.isnan(kendall_tau([1, 1], [2, 3]))


def test_kendall_tau_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    x, y = [3.1, 1.0, 2.2, 2.2, 5.0, 4.4, 0.3], [2.0, 1.5, 2.5, 3.0, 4.0, 4.0, 0.1]
    assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def test_top1_regret_and_case_choice():
    # predicted fastest (index 0) measured 12, the fastest measured 10: 20 % regret
    assert top1_regret_pct([1.0, 2.0, 3.0], [12.0, 10.0, 15.0]) == pytest.approx(20.0)
    assert top1_regret_pct([1.0, 2.0], [5.0, 9.0]) == 0.0
    ranked = list(range(10))
    assert pick_cases(ranked, 3, 2) == [0, 1, 2, 6, 9]   # 7 left: the 4th and the 7th (last) of them
    assert pick_cases(ranked, 3, 1) == [0, 1, 2, 9]
    assert pick_cases(ranked[:4], 3, 5) == [0, 1, 2, 3]
    assert distinct_predictions([1.0, 1.01, 1.03, 1.5, 1.52], 2.0) == [0, 2, 3]
    assert distinct_predictions([1.0, 1.01], 0.0) == [0, 1]


@pytest.fixture
def profile(tmp_path):
    """A synthetic 4-rank CPU profile of the tiny MLP (the format of simulator/profile.py)."""
    workload = build_model("mlp", **PARAMS)
    fit = {"latency_s": 1e-4, "bandwidth_bytes_per_s": 1e9}
    document = {
        "format": FORMAT, "device": {"kind": "cpu", "name": "test", "num_threads": 1}, "backend": "gloo",
        "world_size": 4,
        "model": {"name": "mlp", "params": PARAMS, "layer_names": [layer.name for layer in workload.layers],
                  "num_params": workload.num_params},
        "layers": [{"name": layer.name,
                    "forward": {"intercept_s": 1e-4, "per_sample_s": 2e-5 * (i + 1)},
                    "backward": {"intercept_s": 2e-4, "per_sample_s": 4e-5 * (i + 1)}}
                   for i, layer in enumerate(workload.layers)],
        "optimizer": {"name": "sgd", "intercept_s": 1e-5, "per_param_s": 1e-9},
        "p2p": fit, "allreduce": {"2": fit, "4": fit},
        "compute_slowdown": {"1": 1.0, "2": 1.5, "4": 2.0},
        "shared_processors": {"parallelism": 2.0, "measured_ranks": 4},
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    return str(path)


def stand_in(measure):
    """A `validator.validate.validate` that measures `measure(predicted_s)` instead of running."""
    def fake(scenario, profile_path, specs, options, launch_timeout_s=0.0, progress=None, on_case=None):
        (kind, groups), = specs
        workload = build_model("mlp", **PARAMS)
        predicted = simulate(scenario, costs=_profile_costs(profile_path, workload), workload=workload)
        assert predicted.plan.strategy == kind
        return {"rows": [{"strategy": kind, "kind": kind, "predicted_s": predicted.step_time_s,
                          "measured_s": measure(predicted.step_time_s)}]}
    return fake


def test_rank_check_runs_top_and_spread_and_scores_them(monkeypatch, profile):
    scenario = load_scenario(SCENARIO)
    ranking = rank_candidates(scenario, 4, kinds=checked_kinds(), profile_path=profile, workers=1, show_progress=False)
    expected = [ranking.rows[i]["label"] for i in pick_cases(
        distinct_predictions([row["step_time_s"] for row in ranking.rows], 2.0), 2, 2)]
    monkeypatch.setattr(validator.validate, "validate", stand_in(lambda predicted: 1.0 / predicted))
    report = rank_check(scenario, profile, 4, top=2, others=2)
    rows = report["rows"]
    assert [row["strategy"] for row in rows] == expected and report["num_cases"] == 4
    for row in rows:  # the validator's prediction (profile costs) is the planner's
        assert row["predicted_s"] == pytest.approx(row["planner_s"], rel=1e-12)
    predicted = [row["predicted_s"] for row in rows]
    assert predicted == sorted(predicted)
    # measured = 1 / predicted: the order is reversed, the predicted best is measured slowest
    assert report["kendall_tau"] == pytest.approx(-1.0)
    assert report["top1_regret_pct"] == pytest.approx(100 * (predicted[-1] / predicted[0] - 1))
    assert [row["measured_rank"] for row in rows] == [4, 3, 2, 1]
    monkeypatch.setattr(validator.validate, "validate", stand_in(lambda predicted: 2 * predicted))
    report = rank_check(scenario, profile, 4, top=2, others=2)
    assert report["kendall_tau"] == pytest.approx(1.0) and report["top1_regret_pct"] == 0.0


def test_validate_rank_cli(monkeypatch, profile, tmp_path, capsys):
    path = tmp_path / "tiny_cpu.yaml"
    path.write_text(json.dumps(SCENARIO))
    monkeypatch.setattr(validator.validate, "validate", stand_in(lambda predicted: 3 * predicted))
    out = tmp_path / "out"
    code = main(["validate", str(path), "--profile", profile, "--rank", "--gpus", "4", "--top", "1",
                 "--others", "1", "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_cases"] == 2 and report["kendall_tau"] == pytest.approx(1.0)
    assert report["rows"][0]["predicted_rank"] == 1 and (out / "tiny_cpu_rank.csv").is_file()
    code = main(["validate", str(path), "--profile", profile, "--rank", "--gpus", "2", "--out", str(out)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "--gpus: 2: the profile" in error and "world size 4" in error and len(error.splitlines()) == 1
    code = main(["validate", str(path), "--profile", profile, "--rank", "--repeats", "3", "--out", str(out)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.startswith("ghpsim: error: --repeats: 3") and len(error.splitlines()) == 1
    code = main(["validate", str(path), "--profile", profile, "--rank", "--step-spans", "--out", str(out / "spans")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.startswith("ghpsim: error: --step-spans: not with --rank") and len(error.splitlines()) == 1
    assert not (out / "spans").exists()


def test_an_empty_ranking_is_one_error_naming_the_kinds_and_ranks(monkeypatch, profile):
    import types

    import validator.rank_check
    from simulator.errors import ScenarioError

    scenario = load_scenario(SCENARIO)
    empty = types.SimpleNamespace(rows=[], skipped=[], scenario=scenario)
    monkeypatch.setattr(validator.rank_check, "rank_candidates", lambda *args, **kwargs: empty)
    with pytest.raises(ScenarioError, match=r"no allocation of the checked kinds \(dp, .*\) exists on 4 ranks"):
        rank_check(scenario, profile, 4)
    skipped = types.SimpleNamespace(rows=[], scenario=scenario,
                                    skipped=[{"label": "mp (G=1 x M=4)", "reason": "out of memory"}])
    monkeypatch.setattr(validator.rank_check, "rank_candidates", lambda *args, **kwargs: skipped)
    with pytest.raises(ScenarioError, match=r"no candidate could be simulated on 4 ranks \(mp \(G=1 x M=4\): out of memory\)"):
        rank_check(scenario, profile, 4)


def test_a_stop_while_the_ranking_is_written_waits_for_the_file(monkeypatch, profile, tmp_path, capsys,
                                                                fresh_stop_handlers):
    import signal

    import validator.report
    path = tmp_path / "tiny_cpu.yaml"
    path.write_text(json.dumps(SCENARIO))
    monkeypatch.setattr(validator.validate, "validate", stand_in(lambda predicted: 3 * predicted))
    write = validator.report.write_rows_csv

    def stopped_mid_write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return write(*args, **kwargs)

    monkeypatch.setattr(validator.report, "write_rows_csv", stopped_mid_write)
    out = tmp_path / "out"
    code = main(["validate", str(path), "--profile", profile, "--rank", "--gpus", "4", "--top", "1",
                 "--others", "1", "--out", str(out), "--json"])
    err = capsys.readouterr().err
    assert code == 130 and err == f"ghpsim: interrupted; the ranking of every candidate run is in {out / 'tiny_cpu_rank.csv'}\n"
    assert len((out / "tiny_cpu_rank.csv").read_text().splitlines()) == 3
