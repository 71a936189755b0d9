"""`ghpsim fit` (simulator.fit): reading a cluster's runs, k-fold cross-validation over the
parameter grid, and the kernel profile it writes (read back by `simulate --profile`)."""

from __future__ import annotations

import json

import pytest

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.fit import PointCache, fit_refined, folds, read_runs, refined_search
from simulator.profile import KernelProfile, load_profile

BASE = """\
name: tiny_gpt
cluster: {num_nodes: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node_link: nvlink3-a100}
model: {name: transformer, params: {num_layers: 2, hidden_size: 256, num_heads: 4, seq_len: 128, vocab_size: 1000}}
strategy: {kind: megatron, tp_degree: 2, num_microbatches: 1}
training: {global_batch_size: 2, dtype: fp16, optimizer: adam}
"""


def test_folds_partition_the_rows_and_are_seeded():
    parts = folds(10, 3, seed=1)
    assert sorted(i for part in parts for i in part) == list(range(10))
    assert parts == folds(10, 3, seed=1) and parts != folds(10, 3, seed=2)


def test_cross_validation_picks_the_point_that_predicts_held_out_rows():
    measured = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    grid = {"host_overhead_s": (0.0, 1e-5)}
    evaluate = PointCache(lambda points: [[m * (0.5 if p["host_overhead_s"] == 0.0 else 1.02) for m in measured]
                                          for p in points])
    result = fit_refined(evaluate, measured, k=3, grid=grid)  # refined points tie with 10 us: it stays
    assert result.best == {"host_overhead_s": 1e-5} and result.spread == {"host_overhead_s": 0.0}
    assert result.held_out_mape_pct == pytest.approx(2.0)
    assert result.in_sample_mape_pct == pytest.approx(2.0)
    with pytest.raises(ScenarioError, match="--folds: 7 folds need at least 7 runs"):
        fit_refined(evaluate, measured, k=7, grid=grid)


def _synthetic(best_host_s: float, best_gemm: float, measured: list[float], calls: list[int]):
    """Predictions off by the distance of a point from (best_host_s, best_gemm)."""
    def simulate_points(points):
        calls.append(len(points))
        return [[m * (1 + 1e3 * abs(p["host_overhead_s"] - best_host_s) + abs(p["gemm_efficiency"] - best_gemm))
                 for m in measured] for p in points]
    return PointCache(simulate_points)


def test_the_search_refines_host_time_between_grid_points_and_simulates_each_point_once():
    measured, calls = [1.0, 2.0, 3.0, 4.0], []
    evaluate = _synthetic(52.5e-6, 0.861, measured, calls)
    # coarse best (50 us, 0.822); host half-way to its neighbours (45, 55 us), then 52.5 us; the GEMM
    # ceiling stays on its grid (REFINED)
    assert refined_search(evaluate, measured, [0, 1, 2, 3]) == {"host_overhead_s": 52.5e-6, "gemm_efficiency": 0.822}
    assert calls == [40, 2, 2]
    result = fit_refined(evaluate, measured, k=2)  # every fold walks the same points: none simulated again
    assert calls == [40, 2, 2]
    assert result.spread == {"host_overhead_s": 0.0, "gemm_efficiency": 0.0}


def test_the_search_stays_inside_the_grid():
    measured, calls = [1.0, 2.0], []
    evaluate = _synthetic(200e-6, 0.99, measured, calls)  # optimum beyond both bounds
    assert refined_search(evaluate, measured, [0, 1]) == {"host_overhead_s": 100e-6, "gemm_efficiency": 0.9}
    assert all(0.0 <= p["host_overhead_s"] <= 100e-6 and 0.65 <= p["gemm_efficiency"] <= 0.9
               for p in (dict(key) for key in evaluate.predictions))


def _write(tmp_path, rows: str, base: str = BASE):
    (tmp_path / "tiny.yaml").write_text(base)
    path = tmp_path / "runs.csv"
    path.write_text(rows)
    return path


def test_runs_override_their_base_scenario(tmp_path):
    runs = read_runs(_write(tmp_path, "base,training.global_batch_size,measured_step_s\n"
                                      "tiny.yaml,2,0.01\ntiny.yaml,4,0.02\n"))
    assert [run.document["training"]["global_batch_size"] for run in runs] == [2, 4]
    assert [run.measured_s for run in runs] == [0.01, 0.02]


@pytest.mark.parametrize("rows, message", [
    ("base,x\ntiny.yaml,1\n", "missing column 'measured_step_s'"),
    ("base,measured_step_s\ntiny.yaml,fast\n", "runs.csv:2: measured_step_s: 'fast' is not a number"),
    ("base,measured_step_s\ntiny.yaml,-1\n", "runs.csv:2: measured_step_s: -1.0 must be > 0"),
    ("measured_step_s\n0.1\n", "runs.csv:2: base: no scenario file"),
    ("base,measured_step_s\n", "no runs"),
])
def test_bad_runs_are_one_line_errors(tmp_path, rows, message):
    with pytest.raises(ScenarioError) as error:
        read_runs(_write(tmp_path, rows))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_fit_writes_a_kernel_profile_that_simulate_reads(tmp_path, capsys, monkeypatch):
    import simulator.fit as fit_module
    monkeypatch.setattr(fit_module, "FITTED", {"host_overhead_s": (0.0, 2e-5), "gemm_efficiency": (0.822,)})
    rows = "base,training.global_batch_size,measured_step_s\n" + "".join(
        f"tiny.yaml,{b},{0.004 * b}\n" for b in (2, 2, 4, 4, 8, 8))
    out = tmp_path / "kernel.json"
    assert main(["fit", str(_write(tmp_path, rows)), "--out", str(out), "--folds", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["runs"] == 6 and printed["folds"] == 3 and printed["held_out_mape_pct"] >= 0
    profile = load_profile(out)
    assert isinstance(profile, KernelProfile) and profile.architecture == "ampere"
    assert main(["simulate", str(tmp_path / "tiny.yaml"), "--profile", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


def test_fit_draws_and_prints_each_runs_held_out_prediction(tmp_path, capsys, monkeypatch):
    import simulator.fit as fit_module
    monkeypatch.setattr(fit_module, "FITTED", {"host_overhead_s": (0.0, 2e-5), "gemm_efficiency": (0.822,)})
    rows = "base,training.global_batch_size,measured_step_s\n" + "".join(
        f"tiny.yaml,{b},{0.004 * b}\n" for b in (2, 2, 4, 4, 8, 8))
    runs_csv, out, plot = _write(tmp_path, rows), tmp_path / "kernel.json", tmp_path / "fit.png"
    assert main(["fit", str(runs_csv), "--out", str(out), "--folds", "3", "--plot", str(plot), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    predictions = printed["predictions"]
    assert [p["run"] for p in predictions] == [f"{runs_csv}:{line}" for line in range(2, 8)]
    for p in predictions:
        assert p["held_out_step_s"] > 0
        assert p["error_pct"] == pytest.approx(100 * (p["held_out_step_s"] / p["measured_step_s"] - 1))
    mape = sum(abs(p["error_pct"]) for p in predictions) / len(predictions)
    assert mape == pytest.approx(printed["held_out_mape_pct"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_file_matplotlib_cannot_write_is_refused_before_fitting(tmp_path, capsys):
    rows = "base,training.global_batch_size,measured_step_s\ntiny.yaml,2,0.01\ntiny.yaml,4,0.02\n"
    out, plot = tmp_path / "kernel.json", tmp_path / "fit.xyz"
    assert main(["fit", str(_write(tmp_path, rows)), "--out", str(out), "--plot", str(plot)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--plot" in error and "'xyz' is not supported" in error
    assert not out.exists() and not plot.exists()


def test_a_kernel_profile_for_another_architecture_is_refused(tmp_path, capsys):
    profile = {"format": "ghpsim-profile/2", "kind": "kernel", "architecture": "hopper",
               "parameters": {"host_overhead_s": 1e-5}}
    (tmp_path / "k.json").write_text(json.dumps(profile))
    (tmp_path / "tiny.yaml").write_text(BASE)
    assert main(["simulate", str(tmp_path / "tiny.yaml"), "--profile", str(tmp_path / "k.json")]) == 2
    assert "fitted on 'hopper' GPUs" in capsys.readouterr().err


def test_the_fitted_host_time_wins_over_the_base_scenarios_own():
    """A base scenario that sets costs.host_overhead_s is still fitted over the host time grid."""
    import yaml

    from simulator.fit import Run, predict_s
    from simulator.kernel_catalogue import ARCHITECTURES
    document = {**yaml.safe_load(BASE), "costs": {"host_overhead_s": 0}}
    run, gemm = Run(document, 0.01, "row 1"), ARCHITECTURES["ampere"].parameters.gemm_efficiency
    fast, slow = (predict_s(run, {"host_overhead_s": host, "gemm_efficiency": gemm}) for host in (0.0, 100e-6))
    assert slow > fast == pytest.approx(predict_s(run, None))


def test_the_flash_attention_ceiling_is_fitted_only_for_runs_that_use_it():
    import yaml

    from simulator.fit import FITTED, FLASH_FITTED, Run, fitted_grid, predict_s
    from simulator.kernel_costs import device_for
    from simulator.scenario import scenario_from_dict
    document = yaml.safe_load(BASE)
    plain = [Run(document, 0.01, "row 1")]
    catalogue = device_for(scenario_from_dict(document).cluster.gpu, document["training"]["dtype"]).parameters
    gemm = tuple(sorted({*FITTED["gemm_efficiency"], round(catalogue.gemm_efficiency, 3)}))
    assert fitted_grid(plain) == {**FITTED, "gemm_efficiency": gemm}  # the datasheet ceiling is a grid point
    flash_document = {**document, "model": {"name": "transformer", "params": {
        "num_layers": 2, "hidden_size": 256, "num_heads": 4, "seq_len": 4096, "vocab_size": 1024}},
        "training": {**document["training"], "global_batch_size": 16}, "costs": {"flash_attention": True}}
    flash = Run(flash_document, 0.01, "row 2")
    flash_grid = tuple(sorted({*FLASH_FITTED["flash_attention_efficiency"], round(catalogue.flash_attention_efficiency, 3)}))
    assert fitted_grid([*plain, flash]) == {**FITTED, "gemm_efficiency": gemm, "flash_attention_efficiency": flash_grid}
    assert len(flash_grid) == len(FLASH_FITTED["flash_attention_efficiency"]) + 1
    slow, fast = (predict_s(flash, {"host_overhead_s": 0.0, "flash_attention_efficiency": e}) for e in (0.15, 0.65))
    assert slow > fast  # the parameter reaches the attention kernels


def test_a_parameter_on_an_end_of_its_grid_is_reported():
    from simulator.fit import at_grid_bounds, bound_warning
    grid = {"host_overhead_s": (0.0, 5e-5, 1e-4), "gemm_efficiency": (0.65, 0.822, 0.9), "x": (0.5,)}
    bounds = at_grid_bounds({"host_overhead_s": 1e-4, "gemm_efficiency": 0.65, "x": 0.5}, grid)
    assert bounds == [
        {"parameter": "host_overhead_s", "value": 1e-4, "bound": "largest", "grid": [0.0, 1e-4]},
        {"parameter": "gemm_efficiency", "value": 0.65, "bound": "smallest", "grid": [0.65, 0.9]}]
    assert bound_warning(bounds[0]).startswith("ghpsim: warning: host_overhead_s = 0.0001 is the largest value of "
                                               "its search grid (0 to 0.0001): the runs may want a value above it")
    # no host time per kernel is a physical limit, an interior point is none, a one-value grid no search
    assert at_grid_bounds({"host_overhead_s": 0.0, "gemm_efficiency": 0.822, "x": 0.5}, grid) == []


def test_fit_warns_of_a_bound_and_prints_its_files_in_json(tmp_path, capsys, monkeypatch):
    import simulator.fit as fit_module
    monkeypatch.setattr(fit_module, "FITTED", {"host_overhead_s": (0.0, 2e-5), "gemm_efficiency": (0.822,)})
    monkeypatch.setattr(fit_module, "predict_s", lambda run, point: run.measured_s * (1.2 - 1e4 * point["host_overhead_s"]))
    rows = "base,measured_step_s\n" + "tiny.yaml,0.01\n" * 4
    out, plot = tmp_path / "kernel.json", tmp_path / "fit.png"
    assert main(["fit", str(_write(tmp_path, rows)), "--out", str(out), "--plot", str(plot), "--folds", "2",
                 "--json"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert printed["out"] == str(out) and printed["plot"] == str(plot)
    assert printed["at_grid_bound"] == [{"parameter": "host_overhead_s", "value": 2e-5, "bound": "largest",
                                         "grid": [0.0, 2e-5]}]
    assert json.loads(out.read_text())["fit"]["at_grid_bound"] == printed["at_grid_bound"]
    assert captured.err.startswith("ghpsim: warning: host_overhead_s = 2e-05 is the largest value")
    assert captured.err.count("\n") == 1


def test_the_progress_counts_every_simulation_against_a_growing_total(tmp_path, monkeypatch):
    import simulator.fit as fit_module

    class Bar:
        def __init__(self):
            self.total, self.done, self.totals = None, 0, []

        def add_task(self, _description, total):
            self.total = total
            return 0

        def update(self, _task, total):
            self.total = total
            self.totals.append(total)

        def advance(self, _task):
            self.done += 1
            assert self.done <= self.total  # M of N: never past the total announced
    monkeypatch.setattr(fit_module, "predict_s", lambda run, point: run.measured_s * (1 + point["host_overhead_s"]))
    runs = read_runs(_write(tmp_path, "base,measured_step_s\n" + "tiny.yaml,0.01\n" * 3))
    bar = Bar()
    fit_module.fit_runs(runs, k=3, progress=fit_module.FitProgress(bar, "fitting"))
    coarse = len(fit_module.grid_points(fit_module.fitted_grid(runs)))
    assert bar.totals[0] == coarse * len(runs) and bar.totals == sorted(bar.totals)
    assert bar.done == bar.total > bar.totals[0]  # the refinement added points, all simulated


def test_repeated_runs_are_simulated_once_a_point(monkeypatch):
    """A log's repeated configurations cost one simulation a grid point, not one a row."""
    import yaml

    import simulator.fit as fit
    document = yaml.safe_load(BASE)
    other = {**document, "training": {**document["training"], "global_batch_size": 2 * document["training"]["global_batch_size"]}}
    runs = [fit.Run(document, 0.01, f"row {i}") for i in range(4)] + [fit.Run(other, 0.02, "row 4")]
    calls, real = [], fit.predict_s
    monkeypatch.setattr(fit, "predict_s", lambda run, point: calls.append(run.where) or real(run, point))
    ticks = []
    predicted = fit.predict_grid(runs, [{"host_overhead_s": 0.0}, {"host_overhead_s": 50e-6}], lambda: ticks.append(1))
    assert calls == ["row 0", "row 4"] * 2 and len(ticks) == 10
    assert [len(set(row[:4])) for row in predicted] == [1, 1] and predicted[1][0] > predicted[0][0]


def test_the_runs_readme_says_what_its_fit_example_prints(tmp_path, capsys, monkeypatch):
    """scenarios/runs/README.md's `ghpsim fit` example, run as written (its files moved to tmp_path):
    the held-out MAPE and worst run the README quotes are the ones the command prints."""
    import re
    import shlex
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    text = (root / "scenarios" / "runs" / "README.md").read_text(encoding="utf-8")
    command = next(line.strip() for line in text.splitlines() if "ghpsim fit scenarios/runs/vtrain" in line)
    quoted = re.search(r"held-out MAPE \(([\d.]+ %)\) and the worst run \(([+-][\d.]+ %)\)", text.replace("\n", " "))
    assert quoted, "the README no longer quotes the example's MAPE and worst run"
    argv = shlex.split(command)[1:]
    argv = [str(tmp_path / Path(arg).name) if arg.startswith("/tmp/") else arg for arg in argv]
    monkeypatch.chdir(root)
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()[0]
    assert f"held-out MAPE {quoted[1]} " in printed and f"worst {quoted[2]} " in printed, printed
