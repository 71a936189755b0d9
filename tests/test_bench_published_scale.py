"""benchmarks/bench_published_scale.py: the SC'21 Table 1, Korthikanti et al. Table 5, Megatron-LM
v1.0, MT-NLG and LLaMA-3 405B runs are transcribed consistently, each becomes a valid scenario of its published layout, and
small ones are predicted and scored."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_published_scale import LLAMA3_RUNS, MT_NLG_RUNS, RECOMPUTE_RUNS, SC21_RUNS, V1_RUNS, main, predict_s, run_scenario, score  # noqa: E402

from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402


@pytest.mark.parametrize("run", SC21_RUNS, ids=lambda run: run.label)
def test_each_row_agrees_with_its_own_columns(run):
    # the table's aggregate column is TFLOP/s x GPUs, both rounded (TFLOP/s to the unit, PFLOP/s to
    # 0.1): a mistyped figure breaks this
    assert run.tflops_per_gpu * run.gpus / 1000 == pytest.approx(run.aggregate_pflops, abs=0.5 * run.gpus / 1000 + 0.05)
    scenario = scenario_from_dict(run_scenario(run), ".")
    strategy = scenario.strategy
    data_parallel = run.gpus // (run.tp * run.pp)
    assert scenario.num_gpus == run.gpus and data_parallel * run.tp * run.pp == run.gpus
    assert run.global_batch // (strategy.num_microbatches * data_parallel) == run.micro_batch
    assert strategy.num_virtual_stages * run.pp * (run.layers_per_virtual_stage or run.layers // run.pp) == run.layers
    # the model of the row has the published parameter count (the table rounds to 0.1 B)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert round(workload.num_params / 1e9, 1) == run.params_billion


@pytest.mark.parametrize("run", RECOMPUTE_RUNS, ids=lambda run: run.label)
def test_each_recompute_row_is_its_published_layout(run):
    scenario = scenario_from_dict(run_scenario(run), ".")
    strategy, training = scenario.strategy, scenario.training
    assert run.table == "recompute" and run.gpus == 8 * run.pp and strategy.tp_degree == 8  # TP 8, no DP
    assert strategy.num_microbatches * run.micro_batch == run.global_batch
    assert strategy.num_virtual_stages * run.pp * (run.layers_per_virtual_stage or run.layers // run.pp) == run.layers
    assert (training.recompute, strategy.sequence_parallel) in (("full", False), ("selective", True))
    assert run.measured_s() == run.published_s
    # the model of the row is the one its name says (22B, 175B, 530B, 1T) within 3 %
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert workload.num_params / 1e9 == pytest.approx(run.params_billion, rel=0.03)


@pytest.mark.parametrize("run", V1_RUNS, ids=lambda run: run.label)
def test_each_v1_row_is_its_published_model_on_one_dgx2h(run):
    scenario = scenario_from_dict(run_scenario(run), ".")
    strategy, cluster = scenario.strategy, scenario.cluster
    assert cluster.gpu.name == "V100" and scenario.num_gpus == run.tp == strategy.tp_degree  # one model-parallel group
    assert strategy.pp_degree == strategy.num_microbatches == 1 and scenario.training.global_batch_size == 8
    assert scenario.model.params["seq_len"] == 1024 and run.measured_s() == run.published_s
    # Shoeybi et al. 2019 Table 1's models: 1.2B and 4.2B parameters (vocabulary padded to 51,200)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert round(workload.num_params / 1e9, 1) == run.params_billion
    predicted, _peak_bytes, fits, _wall_s = predict_s((run, None))
    assert 0.5 * run.measured_s() < predicted < 2 * run.measured_s() and fits  # trained on 32 GB V100s


@pytest.mark.parametrize("run", MT_NLG_RUNS, ids=lambda run: run.label)
def test_each_mt_nlg_row_agrees_with_its_published_throughput(run):
    # the paper gives both the iteration time and TFLOP/s a GPU (rounded to three digits): eq. 3 ties them
    assert run.iteration_flops() / (run.gpus * run.tflops_per_gpu * 1e12) == pytest.approx(run.published_s, rel=0.006)
    scenario = scenario_from_dict(run_scenario(run), ".")
    strategy = scenario.strategy
    assert (strategy.tp_degree, strategy.pp_degree, strategy.num_virtual_stages) == (8, 35, 1)
    assert strategy.num_microbatches * (run.gpus // 280) == 1920 and not strategy.overlap_backward
    assert scenario.training.recompute == "full" and run.measured_s() == run.published_s
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert workload.num_params / 1e9 == pytest.approx(530, rel=0.01)


@pytest.mark.parametrize("run", LLAMA3_RUNS, ids=lambda run: run.label)
def test_each_llama3_row_is_meta_s_layout_of_16m_tokens(run):
    scenario = scenario_from_dict(run_scenario(run), ".")
    strategy, cluster = scenario.strategy, scenario.cluster
    assert (strategy.tp_degree, strategy.pp_degree, strategy.cp_degree) == (8, 16, 1)
    assert scenario.num_gpus == run.gpus and cluster.gpu.name == "H100-SXM" and cluster.topology == "fat_tree"
    data_parallel = run.gpus // 128
    assert strategy.num_microbatches * data_parallel == 2048 and scenario.training.dtype == "bf16"
    assert run.global_batch * run.sequence == 2048 * 8192  # Table 4's 16M tokens a step
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert workload.num_params == 405_853_388_800
    # PaLM's count: 6 N a token plus 12 l h s of attention, about 8 % of it at 8K tokens
    per_token = 6 * workload.num_params + 12 * 126 * 16384 * 8192
    assert run.iteration_flops() == pytest.approx(2048 * 8192 * per_token, rel=1e-12)
    assert run.measured_s() == pytest.approx(run.iteration_flops() / (run.gpus * run.tflops_per_gpu * 1e12))


def test_each_model_of_table_5_has_both_modes_and_selective_is_faster():
    full = [run for run in RECOMPUTE_RUNS if run.recompute == "full"]
    selective = [run for run in RECOMPUTE_RUNS if run.recompute == "selective"]
    assert len(full) == len(selective) == 4
    for a, b in zip(full, selective):
        assert (a.layers, a.hidden, a.pp, a.global_batch) == (b.layers, b.hidden, b.pp, b.global_batch)
        assert 0.7 < b.published_s / a.published_s < 0.8  # the paper's 29-32 % throughput gain


def test_measured_time_follows_eq_3():
    trillion = SC21_RUNS[-1]  # 1T on 3,072 GPUs at 163 TFLOP/s: about 103 s an iteration
    assert trillion.measured_s() == pytest.approx(
        96 * 3072 * 2048 * 128 * 25600 ** 2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
        / (3072 * 163e12))
    assert 100 < trillion.measured_s() < 105


@pytest.mark.parametrize("run", (SC21_RUNS[0], *RECOMPUTE_RUNS[:2]), ids=lambda run: run.label)
def test_the_smallest_runs_are_predicted_and_scored(run):
    predicted, peak_bytes, fits, _wall_s = predict_s((run, None))
    assert isinstance(predicted, float) and 0.5 * run.measured_s() < predicted < 2 * run.measured_s()
    assert 0 < peak_bytes < 80e9 and fits  # the published run trained on 80 GB A100s


def test_score():
    rows = [{"run": "a", "error_pct": -10.0}, {"run": "b", "error_pct": 4.0}, {"run": "c", "error_pct": None}]
    assert score(rows) == {"runs": 2, "mape_pct": 7.0, "mean_signed_pct": -3.0, "worst_pct": 10.0, "worst_run": "a"}


def test_a_missing_profile_is_one_line_and_exit_2(capsys):
    assert main(["--profile", "no/such/profile.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no/such/profile.json" in err[0]


def test_plot_of_the_runs_and_a_bad_figure_format(tmp_path, capsys, monkeypatch):
    import bench_published_scale
    monkeypatch.setattr(bench_published_scale, "RUNS", V1_RUNS)  # the two smallest runs: seconds
    figure = tmp_path / "scale.png"
    assert main(["--table", "v1", "--processes", "1", "--plot", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["--plot", str(tmp_path / "scale.xyz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plot" in err[0] and not (tmp_path / "scale.xyz").exists()
