"""End to end on this machine: calibrate from microbenchmarks, then validate real dp and mp runs
against the prediction. A quick version with a loose bound (CI machines are noisy); the real
figures come from benchmarks/bench_validation.py and are quoted in the README."""

import json

import pytest

pytest.importorskip("torch")

from validator.cli import main  # noqa: E402

SCENARIO = "scenarios/validation/mlp_cpu.yaml"
SMALL = ["--set", "cluster.gpus_per_node=2", "--set", "model.params.hidden_dim=256",
         "--set", "model.params.num_hidden_layers=3"]


def test_calibrate_then_validate_reports_errors_within_a_loose_bound(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    assert main(["calibrate", "--scenario", SCENARIO, *SMALL, "--world-size", "2", "--out", str(profile),
                 "--batch-sizes", "8,32", "--repeats", "5"]) == 0
    capsys.readouterr()
    out = tmp_path / "validation"
    assert main(["validate", SCENARIO, *SMALL, "--profile", str(profile), "--strategies", "dp,mp",
                 "--steps", "4", "--warmup", "2", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [row["kind"] for row in report["rows"]] == ["dp", "mp"]
    for row in report["rows"]:
        assert row["measured_s"] > 0 and row["predicted_s"] > 0
        assert abs(row["error_pct"]) < 75, row
    assert (out / "mlp_cpu.csv").is_file() and (out / "mlp_cpu.png").is_file()
    assert len(list((out / "traces").glob("*.trace.json"))) == 4


def test_validate_with_a_profile_of_another_model_is_a_one_line_error(tmp_path, capsys):
    profile = tmp_path / "other.json"
    profile.write_text(json.dumps({"format": "something-else"}))
    code = main(["validate", SCENARIO, *SMALL, "--profile", str(profile)])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(profile) in error and "Traceback" not in error
