"""Attention-mask variants of the GPT and LLaMA blocks: causal (the default, the full s x s core as
the kernels run it) and a Mistral-style sliding window W (Jiang et al. 2023, sec. 2), where each
query attends to k = min(s, W) keys: the core's FLOPs are 4skh + 5ask, its softmax output a s k,
and flash attention runs only the band's tiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.kernels import layer_kernels
from simulator.kernels_attention import flash_work_fraction
from simulator.memory_activations import Sharding, saved_bytes
from simulator.model_source import resolve_workload
from simulator.scenario import ModelConfig, load_scenario
from simulator.simulate import simulate
from simulator.zoo import build_model

S, W = 4096, 1024
LLAMA = {"num_layers": 1, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336,
         "seq_len": S, "vocab_size": 32000}
GPT = {"num_layers": 1, "hidden_size": 2048, "num_heads": 16, "seq_len": S, "vocab_size": 50257}
ROOT = Path(__file__).resolve().parent.parent


def _block(name: str, params: dict, window: int = 0):
    return build_model(name, **params, sliding_window=window).layers[1]


@pytest.mark.parametrize(("name", "params"), [("llama", LLAMA), ("transformer", GPT)])
def test_the_window_removes_4h_plus_5a_flops_and_a_saved_elements_per_dropped_key(name, params):
    h, a = params["hidden_size"], params["num_heads"]
    causal, windowed = _block(name, params), _block(name, params, W)
    dropped = S * (S - W)  # (query, key) pairs outside the window
    assert causal.forward_flops_per_sample - windowed.forward_flops_per_sample == (4 * h + 5 * a) * dropped
    assert causal.saved_elements_per_sample - windowed.saved_elements_per_sample == a * dropped
    assert causal.num_params == windowed.num_params and windowed.spec["sliding_window"] == W
    assert "sliding_window" not in causal.spec


def test_a_window_at_least_the_sequence_is_the_causal_mask():
    assert _block("llama", LLAMA, S).forward_flops_per_sample == _block("llama", LLAMA).forward_flops_per_sample
    assert _block("llama", LLAMA, 2 * S).saved_elements_per_sample == _block("llama", LLAMA).saved_elements_per_sample


def test_unfused_kernels_compute_s_by_k_scores_and_their_memory_is_s_by_k():
    block = _block("transformer", GPT, W)
    a, d = GPT["num_heads"], GPT["hidden_size"] // GPT["num_heads"]
    kernels = {k.name: k for k in layer_kernels(block, "F", 1, dtype="bf16")}
    assert (kernels["attn.score"].m, kernels["attn.score"].n, kernels["attn.score"].k) == (S, W, d)
    assert (kernels["attn.value"].m, kernels["attn.value"].n, kernels["attn.value"].k) == (S, d, W)
    core = saved_bytes(block, 2, Sharding()) - saved_bytes(_block("transformer", GPT, S), 2, Sharding())
    assert core == -a * S * (S - W) * (2 + 1 + 2)  # softmax output, dropout mask and output


def test_flash_attention_runs_the_band_of_the_causal_tile_grid():
    assert flash_work_fraction(S, S, causal=True) == 0.5
    assert flash_work_fraction(S, W, causal=True) == pytest.approx(W / S - W * W / (2 * S * S))
    a, d = LLAMA["num_heads"], LLAMA["hidden_size"] // LLAMA["num_heads"]
    flash = next(k for k in layer_kernels(_block("llama", LLAMA, W), "F", 1, dtype="bf16", flash_attention=True)
                 if k.name == "attn.flash")
    assert flash.flops == 4 * a * S * W * d and flash.work_fraction == pytest.approx(7 / 32)


def test_sliding_window_must_be_a_non_negative_integer():
    with pytest.raises(ValueError, match="sliding_window -4"):
        build_model("llama", **LLAMA, sliding_window=-4)
    with pytest.raises(ValueError, match="sliding_window True"):
        build_model("transformer", **GPT, sliding_window=True)


def test_a_scenario_names_the_field_of_a_bad_window():
    scenario = load_scenario("scenarios/gpt2_mp_pcie.yaml", ["model.params.sliding_window=-1"])
    with pytest.raises(ScenarioError, match="model.params: .* sliding_window -1: expected a positive"):
        simulate(scenario)


def test_hf_config_reads_mistrals_sliding_window(tmp_path):
    config = json.loads((ROOT / "scenarios" / "models" / "llama3_8b_config.json").read_text())
    config.update({"sliding_window": 4096, "max_position_embeddings": 32768, "vocab_size": 32000})
    (tmp_path / "config.json").write_text(json.dumps(config))
    workload = resolve_workload(ModelConfig(hf_config="config.json", params={"seq_len": 8192}), str(tmp_path))
    assert workload.layers[1].spec["sliding_window"] == 4096
    assert workload.num_params == 7_241_732_096  # Mistral 7B (Jiang et al. 2023; HF mistralai/Mistral-7B-v0.1)
    config["use_sliding_window"] = False  # Qwen2-style switch
    (tmp_path / "config.json").write_text(json.dumps(config))
    workload = resolve_workload(ModelConfig(hf_config="config.json", params={"seq_len": 8192}), str(tmp_path))
    assert "sliding_window" not in workload.layers[1].spec


@pytest.mark.parametrize("flash", [False, True])
def test_the_kernels_forward_flops_equal_the_zoos_with_a_window(flash):
    """Flash attention's kernel carries the band's 4 s k d FLOPs per head; its softmax is inside."""
    block = _block("llama", LLAMA, W)
    flops = sum(k.flops for k in layer_kernels(block, "F", 1, dtype="bf16", flash_attention=flash))
    softmax = 5 * LLAMA["num_heads"] * S * W
    assert flops == pytest.approx(block.forward_flops_per_sample - (softmax if flash else 0), rel=1e-12)
