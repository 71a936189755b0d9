"""Hugging Face configs: which model types are read, Qwen2's QKV biases, the pre-training context of
a RoPE-extended model, and the exact parameter count in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.kernels import num_param_tensors
from simulator.model_source import HF_MODEL_TYPES, resolve_workload
from simulator.scenario import ModelConfig, load_scenario
from simulator.simulate import simulate
from simulator.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_8B = json.loads((ROOT / "scenarios" / "models" / "llama3_8b_config.json").read_text())
QWEN2_7B = {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
            "max_position_embeddings": 32768, "num_attention_heads": 28, "num_hidden_layers": 28,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "use_sliding_window": False, "vocab_size": 152064}
"""Qwen/Qwen2-7B's config.json (the keys read); its model card gives 7,615,616,512 parameters."""


def _workload(tmp_path, config, params=None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return resolve_workload(ModelConfig(hf_config="config.json", params=params or {}), str(tmp_path))


def _error(tmp_path, config) -> str:
    with pytest.raises(ScenarioError) as error:
        _workload(tmp_path, config)
    message = str(error.value)
    assert "\n" not in message and message.startswith("model.hf_config")
    return message


@pytest.mark.parametrize("model_type", ["recurrent_gemma", "mamba", "gemma2", "falcon", "gpt_neox", "deepseek_v3"])
def test_a_type_not_read_is_refused_by_name_whatever_its_keys(tmp_path, model_type):
    message = _error(tmp_path, {**LLAMA3_8B, "model_type": model_type})
    assert f"model_type: {model_type!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)}" in message


def test_a_config_without_model_type_is_read_as_llama_style(tmp_path):
    untyped = {key: value for key, value in LLAMA3_8B.items() if key != "model_type"}
    assert _workload(tmp_path, untyped).layers == build_model("llama3-8b").layers


def test_gemmas_activation_key_is_read_too(tmp_path):
    untyped = {key: value for key, value in LLAMA3_8B.items() if key not in ("model_type", "hidden_act")}
    message = _error(tmp_path, {**untyped, "hidden_activation": "gelu_pytorch_tanh"})
    assert message.endswith("hidden_activation: 'gelu_pytorch_tanh': only silu (a SwiGLU MLP) is supported")


def test_qwen2_counts_its_qkv_biases_to_the_published_size(tmp_path):
    qwen = _workload(tmp_path, QWEN2_7B)
    assert qwen.num_params == 7_615_616_512
    as_llama = _workload(tmp_path, {**QWEN2_7B, "model_type": "llama"})
    kv_width = 4 * 3584 // 28
    assert qwen.num_params - as_llama.num_params == 28 * (3584 + 2 * kv_width)
    assert qwen.forward_flops_per_sample == as_llama.forward_flops_per_sample  # a bias add: no GEMM FLOPs
    block = qwen.layers[1]
    assert block.spec["qkv_bias"] is True and "qkv_bias" not in as_llama.layers[1].spec
    assert num_param_tensors(block) == num_param_tensors(as_llama.layers[1]) + 1


def test_a_rope_extended_model_trains_at_its_pre_training_context(tmp_path):
    extended = {**LLAMA3_8B, "max_position_embeddings": 131072, "rope_scaling": {
        "factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192}}  # LLaMA-3.1 8B
    workload = _workload(tmp_path, extended)
    assert workload.input_spec["shape"] == [8192] and workload.layers[0].spec["max_positions"] == 131072
    assert _workload(tmp_path, extended, {"seq_len": 32768}).input_spec["shape"] == [32768]  # params override
    message = _error(tmp_path, {**extended, "rope_scaling": {"original_max_position_embeddings": 10**6}})
    assert "rope_scaling.original_max_position_embeddings: expected a positive integer up to " \
           "max_position_embeddings (131072), got 1000000" in message


def test_the_summary_gives_the_exact_parameter_count():
    summary = simulate(load_scenario(ROOT / "scenarios" / "llama3_8b_dgx_h100.yaml")).summary
    assert summary["model_params"] == build_model("llama3-8b").num_params == 8_030_261_248
