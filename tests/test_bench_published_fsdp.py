"""benchmarks/bench_published_fsdp.py and its runs (scenarios/runs/mpt_fsdp_llm_foundry.csv): every
row is the published MPT model (its parameter count to the parameter), layout and batch, a few rows
are predicted and scored, and bad input is one line with exit code 2; the torchtitan rows
(scenarios/runs/torchtitan_fsdp2_a100.csv) are the published FSDP2 layouts and throughputs."""

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_published_fsdp import RUNS_CSV, TORCHTITAN_CSV, error_table, main  # noqa: E402

from simulator.fit import predict_s, read_runs  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402

VOCABULARY = 50368
NUM_RUNS = len(RUNS_CSV.read_text().splitlines()) - 1
"""The table's rows (a header line, then a run a line): counted, not compiled, when tests are collected."""


@functools.cache
def published_runs():
    """The runs, read once by the worker whose tests use them (each row compiles its plan)."""
    return read_runs(RUNS_CSV)


def test_the_runs_are_the_two_published_tables():
    gpus = [run.document["cluster"]["gpu"] for run in published_runs()]
    assert len(gpus) == NUM_RUNS and (gpus.count("H100-SXM"), gpus.count("A100-80GB")) == (52, 59)


@pytest.mark.parametrize("index", range(0, NUM_RUNS, 7))
def test_each_run_is_an_fsdp_layout_of_the_published_model(index):
    run = published_runs()[index]
    scenario = scenario_from_dict(run.document, run.where)
    strategy, params = scenario.strategy, scenario.model.params
    assert (strategy.kind, strategy.tp_degree, strategy.pp_degree, strategy.zero_stage) == ("megatron", 1, 1, 3)
    assert scenario.costs.flash_attention and scenario.training.dtype == "bf16"
    assert scenario.costs.flash_attention_kernel == "triton"  # LLM Foundry's attn_impl: triton
    micro_batch = scenario.training.global_batch_size / (scenario.num_gpus * strategy.num_microbatches)
    assert micro_batch == int(micro_batch) >= 1
    # MPT's parameters: 12 L d^2 + 13 L d (biases, LayerNorms) + 2 d + (vocabulary + positions) d, which
    # reproduces the table's NumParams column for every row
    d, layers, seq = params["hidden_size"], params["num_layers"], params["seq_len"]
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert workload.num_params == 12 * layers * d * d + 13 * layers * d + 2 * d + (VOCABULARY + seq) * d
    assert params["dropout"] == 0.0  # LLM Foundry's MPTConfig: resid_pdrop, emb_pdrop, attn_pdrop default to 0


@pytest.mark.parametrize("index", [20, 75])  # H100 7B and A100 3B, 2,048 tokens
def test_small_runs_are_predicted_within_a_factor_of_two(index):
    run = published_runs()[index]
    assert 0.5 * run.measured_s < predict_s(run, None) < 2 * run.measured_s


def test_error_table_groups_by_sequence_and_width():
    runs = published_runs()[:2]
    table = error_table(runs, [1.1 * run.measured_s for run in runs])
    assert table["mape_pct"] == pytest.approx(10.0) and table["rows"] == 2
    assert set(table["mean_signed_by_seq_len_pct"].values()) == {10.0}


def test_a_bad_figure_format_is_one_line_exit_2(tmp_path, capsys):
    assert main(["--no-fit", "--plot", str(tmp_path / "fsdp.xyz")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--plot" in error[0] and not list(tmp_path.iterdir())


TORCHTITAN_WPS = {("llama3-70b", "full"): 331, ("llama2-13b", "none"): 2162, ("llama2-70b", "full"): 353}
"""torchtitan docs/performance.md (commit 0413364): tokens a second a GPU on 64 A100 80 GB."""


def test_torchtitan_rows_are_the_published_fsdp2_runs():
    runs = read_runs(TORCHTITAN_CSV)
    assert len(runs) == len(TORCHTITAN_WPS)
    for run in runs:
        scenario = scenario_from_dict(run.document, run.where)
        strategy = scenario.strategy
        assert (scenario.num_gpus, strategy.fsdp_sharding, strategy.fsdp_reduce_dtype) == (64, "full_shard", "fp32")
        assert scenario.training.dtype == "bf16" and scenario.costs.flash_attention
        assert scenario.costs.flash_attention_kernel == "flash2"  # PyTorch SDPA's FlashAttention-2
        local_tokens = scenario.training.global_batch_size / 64 * scenario.model.params["seq_len"]
        wps = TORCHTITAN_WPS[scenario.model.name, scenario.training.recompute]
        assert run.measured_s == pytest.approx(local_tokens / wps, rel=1e-5)
