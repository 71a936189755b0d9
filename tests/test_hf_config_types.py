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


def test_phi3s_top_level_pre_training_context_is_read(tmp_path):
    # microsoft/Phi-3-mini-128k-instruct: LongRoPE from 4,096 to 131,072 tokens, the original at the top level
    phi3 = {**LLAMA3_8B, "model_type": "phi3", "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}
    assert _workload(tmp_path, phi3).input_spec["shape"] == [4096]
    message = _error(tmp_path, {**phi3, "original_max_position_embeddings": 10**6})
    assert "original_max_position_embeddings: expected a positive integer up to max_position_embeddings " \
           "(131072), got 1000000" in message and "rope_scaling." not in message


def test_a_null_kv_head_count_means_one_per_head_as_in_transformers(tmp_path):
    assert _workload(tmp_path, {**LLAMA3_8B, "num_key_value_heads": None, "num_attention_heads": 32}).num_params \
        == _workload(tmp_path, {**LLAMA3_8B, "num_key_value_heads": 32}).num_params
    assert _error(tmp_path, {**LLAMA3_8B, "hidden_size": None}).endswith(
        "hidden_size: expected a positive integer, got null")


@pytest.mark.parametrize("change, named", [
    ({"model_type": "qwen2", "num_local_experts": 8, "num_experts_per_tok": 2},
     "model_type: 'qwen2' with experts: a mixture of experts with Q, K and V biases is not supported yet"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2},
     "n_shared_experts: 2 is read only with n_routed_experts (DeepSeekMoE); this config has none"),
    ({"moe_intermediate_size": 1408}, "moe_intermediate_size: 1408 is read only with n_routed_experts"),
    ({"head_dim": "128"}, "head_dim: expected a positive integer, got '128'"),
    ({"hidden_size": [4096]}, "hidden_size: expected a positive integer, got [4096]"),
    ({"use_sliding_window": "false", "sliding_window": 4096}, "use_sliding_window: expected true or false, got 'false'"),
    ({"rope_scaling": [1, 2]}, "rope_scaling: expected an object or null, got [1, 2]"),
])
def test_a_key_that_would_change_the_model_is_never_dropped_or_misread(tmp_path, change, named):
    assert named in _error(tmp_path, {**LLAMA3_8B, **change})
