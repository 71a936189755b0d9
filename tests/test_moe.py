"""Mixture-of-experts models: published parameter counts, the block's FLOPs and parameters in closed
form, Hugging Face config.json MoE keys, and the kernel expansion (router, permute, grouped GEMMs)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simulator.errors import ScenarioError
from simulator.kernels import layer_kernels
from simulator.model_source import resolve_workload
from simulator.scenario import ModelConfig
from simulator.zoo import MODELS, build_model
from simulator.zoo.moe import capacity_padding_flops_per_sample, moe_block

MIXTRAL_CONFIG = {  # mistralai/Mixtral-8x7B-v0.1 config.json (the keys we read)
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "num_local_experts": 8, "num_experts_per_tok": 2}
DEEPSEEK_CONFIG = {  # deepseek-ai/deepseek-moe-16b-base config.json
    "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "vocab_size": 102400,
    "max_position_embeddings": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "moe_layer_freq": 1}


def routed_expert_params(workload) -> int:
    return sum(3 * l.spec["hidden_size"] * l.spec["expert_ffn_hidden_size"] * l.spec["num_experts"]
               for l in workload.layers if l.spec.get("kind") == "moe_block")


@pytest.mark.parametrize("name,published,active", [("mixtral-8x7b", 46.7e9, 12.9e9),
                                                   ("deepseek-moe-16b", 16.4e9, None)])
def test_parameter_counts_match_the_published_ones(name, published, active):
    workload = build_model(name)
    assert workload.num_params == pytest.approx(published, rel=0.01)
    if active is not None:  # Mixtral: 2 of 8 experts per token
        inactive = routed_expert_params(workload) * 6 / 8
        assert workload.num_params - inactive == pytest.approx(active, rel=0.01)
    assert {"mixtral-8x7b", "deepseek-moe-16b", "moe"} <= set(MODELS)


def test_deepseek_has_one_dense_layer_then_shared_and_routed_experts():
    layers = build_model("deepseek-moe-16b").layers
    assert layers[1].spec["kind"] == "transformer_block" and layers[1].spec["ffn_hidden_size"] == 10944
    assert [l.spec["kind"] for l in layers[2:-1]] == ["moe_block"] * 27
    assert layers[2].spec["shared_ffn_hidden_size"] == 2 * 1408 and layers[2].spec["top_k"] == 6


@pytest.mark.parametrize("shared,capacity", [(0, 1.0), (96, 1.0), (96, 1.25)])
def test_block_flops_and_params_closed_form(shared, capacity):
    s, h, a, g, num_experts, k, f = 128, 256, 8, 2, 16, 4, 64
    d = h // a
    layer = moe_block("b", h, a, g, s, num_experts=num_experts, top_k=k, expert_ffn=f, shared_ffn=shared,
                      capacity_factor=capacity)
    attention = 4 * s * h + 2 * s * h * (h + 2 * g * d) + 3 * s * (h + g * d) + 4 * s * s * h + 5 * a * s * s \
        + 2 * s * h * h + s * h
    router = 4 * s * h + 2 * s * h * num_experts + 5 * s * num_experts
    experts = capacity * k * s * (6 * h * f + 6 * f + 2 * h)  # routed tokens only: k of E experts
    shared_flops = (6 * s * h * shared + 6 * s * shared + s * h) if shared else 0
    residual = s * h
    assert layer.forward_flops_per_sample == pytest.approx(attention + router + experts + shared_flops + residual,
                                                           rel=1e-12)
    assert layer.backward_flops_per_sample == 2 * layer.forward_flops_per_sample
    assert layer.num_params == 2 * h * h + 2 * h * g * d + h * num_experts + 3 * h * f * num_experts \
        + 3 * h * shared + 2 * h


def test_mixtral_flops_per_token_are_twice_the_active_parameters():
    """Without attention's s^2 terms, forward FLOPs per token ~ 2 x active parameters (Kaplan et al.)."""
    workload = build_model("mixtral-8x7b", seq_len=128)
    active = workload.num_params - routed_expert_params(workload) * 6 / 8
    assert workload.forward_flops_per_sample / 128 == pytest.approx(2 * active, rel=0.02)


def _hf(tmp_path, config, params=None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return resolve_workload(ModelConfig(hf_config="config.json", params=params or {}), str(tmp_path))


def test_hf_config_reads_mixtral_and_deepseek_moe_keys(tmp_path):
    assert _hf(tmp_path, MIXTRAL_CONFIG, {"seq_len": 4096}).layers == build_model("mixtral-8x7b").layers
    assert _hf(tmp_path, {**MIXTRAL_CONFIG, "head_dim": 128}, {"seq_len": 4096}).layers == \
        build_model("mixtral-8x7b").layers  # a head_dim equal to hidden / heads is the same model
    assert _hf(tmp_path, DEEPSEEK_CONFIG).layers == build_model("deepseek-moe-16b").layers
    override = _hf(tmp_path, MIXTRAL_CONFIG, {"seq_len": 256, "capacity_factor": 1.5, "num_layers": 2})
    assert override.layers[1].spec["capacity_factor"] == 1.5 and override.num_layers == 4


@pytest.mark.parametrize("change,key", [
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    ({"kv_lora_rank": 512}, "kv_lora_rank"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"n_shared_experts": -1}, "n_shared_experts"),
    ({"head_dim": 256}, "head_dim: 256 x num_attention_heads 16 is not hidden_size 2048"),  # Qwen3-style heads
    ({"model_type": "gpt2", "num_hidden_layers": None}, "model_type: 'gpt2' is not supported (supported: llama, mistral"),
])
def test_hf_config_moe_errors_name_the_key(tmp_path, change, key):
    config = {**DEEPSEEK_CONFIG, **change}
    config = {name: value for name, value in config.items() if value is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ScenarioError) as error:
        resolve_workload(ModelConfig(hf_config="config.json"), str(tmp_path))
    message = str(error.value)
    assert key in message and "\n" not in message and message.startswith("model.hf_config")


@pytest.mark.parametrize("config, change, params, wording", [
    (DEEPSEEK_CONFIG, {"first_k_dense_replace": 100}, {}, "first_k_dense_replace 100 exceeds num_hidden_layers 28"),
    (DEEPSEEK_CONFIG, {"num_experts_per_tok": 65}, {}, "num_experts_per_tok 65 exceeds n_routed_experts 64"),
    (MIXTRAL_CONFIG, {"num_experts_per_tok": 9}, {}, "num_experts_per_tok 9 exceeds num_local_experts 8"),
    (MIXTRAL_CONFIG, {"num_key_value_heads": 5}, {}, "hidden_size 4096, num_attention_heads 32, "
     "num_key_value_heads 5: heads must divide hidden_size and kv heads the heads"),
    (MIXTRAL_CONFIG, {}, {"top_k": 9}, "model.params.top_k 9 exceeds num_local_experts 8"),
])
def test_hf_config_dimension_errors_use_the_file_s_keys(tmp_path, config, change, params, wording):
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ScenarioError) as error:
        resolve_workload(ModelConfig(hf_config="config.json", params=params), str(tmp_path))
    assert str(error.value) == f"model.hf_config: {str(tmp_path / 'config.json')!r}: {wording}"


def test_zoo_params_are_type_checked_by_name():
    with pytest.raises(ScenarioError, match="model.params.num_experts"):
        resolve_workload(ModelConfig(name="mixtral-8x7b", params={"num_experts": "eight"}))
    with pytest.raises(ScenarioError, match="model.params.top_k 9 exceeds model.params.num_experts 8"):
        resolve_workload(ModelConfig(name="mixtral-8x7b", params={"top_k": 9}))


# --- kernel expansion ---------------------------------------------------------------------------

def _block(ep=1, capacity=1.0):
    layer = build_model("mixtral-8x7b", seq_len=512, num_layers=1, capacity_factor=capacity).layers[1]
    return layer if ep == 1 else replace(layer, spec={**layer.spec, "expert_parallel_degree": ep})


def test_forward_kernels_execute_the_layers_flops():
    layer = _block()
    kernels = layer_kernels(layer, "F", 2, dtype="bf16")
    assert sum(k.flops for k in kernels) == pytest.approx(2 * layer.forward_flops_per_sample, rel=1e-12)
    names = [k.name for k in kernels]
    assert names.index("router") < names.index("moe.permute") < names.index("experts.fc1") \
        < names.index("experts.fc2") < names.index("moe.unpermute")


@pytest.mark.parametrize("ep,tp", [(1, 1), (4, 1), (8, 1), (4, 2)])
def test_grouped_expert_gemms_per_local_expert(ep, tp):
    b, s, h, f, num_experts, k = 2, 512, 4096, 14336, 8, 2
    kernels = {kern.name: kern for kern in layer_kernels(_block(ep), "F", b, dtype="bf16", tp_degree=tp,
                                                         sequence_parallel=tp > 1)}
    fc1, fc2 = kernels["experts.fc1"], kernels["experts.fc2"]
    tokens_per_expert = k * b * s * ep / num_experts  # balanced: every EP rank's tokens for its E / ep experts
    assert (fc1.m, fc1.n, fc1.k, fc1.batch_count) == (tokens_per_expert, 2 * f / tp, h, num_experts / ep)
    assert (fc2.m, fc2.n, fc2.k, fc2.batch_count) == (tokens_per_expert, h, f / tp, num_experts / ep)
    assert fc1.flops + fc2.flops == pytest.approx(k * b * s * 6 * h * f / tp, rel=1e-12)  # independent of ep
    permute = kernels["moe.permute"]
    rows = b * s / tp  # sequence-parallel rows of this rank
    assert permute.bytes_read == permute.bytes_written == pytest.approx(k * rows * h * 2)


def test_backward_doubles_the_gemms_and_capacity_scales_the_experts():
    layer, padded = _block(), _block(capacity=1.25)
    forward = {k.name: k for k in layer_kernels(layer, "F", 1, dtype="bf16")}
    backward = {k.name: k for k in layer_kernels(layer, "B", 1, dtype="bf16")}
    for name in ("experts.fc1", "experts.fc2", "router", "qkv"):
        gradients = backward[f"{name}.dgrad"].flops + backward[f"{name}.wgrad"].flops
        assert gradients == pytest.approx(2 * forward[name].flops)
    grown = {k.name: k for k in layer_kernels(padded, "F", 1, dtype="bf16")}
    assert grown["experts.fc1"].flops == pytest.approx(1.25 * forward["experts.fc1"].flops)
    assert grown["router"].flops == forward["router"].flops


def test_tp_or_ep_not_dividing_is_refused_by_name():
    with pytest.raises(ValueError, match="ep_degree 3 does not divide num_experts 8"):
        layer_kernels(_block(3), "F", 1, dtype="bf16")
    with pytest.raises(ValueError, match="tp_degree 3 does not divide num_heads 32"):
        layer_kernels(_block(), "F", 1, dtype="bf16", tp_degree=3)


@pytest.mark.parametrize("capacity", [1.0, 1.5, 4.0, 0.5])
def test_capacity_padding_flops_are_the_routed_copies_beyond_k(capacity):
    """Forward + backward FLOPs of (c - 1) k s extra routed copies: what c adds to the block (negative
    below 1: dropped tokens), 0 at c = 1 and for layers that are not MoE blocks."""
    s, h, f, k = 128, 256, 64, 4
    blocks = {c: moe_block("b", h, 8, 2, s, num_experts=16, top_k=k, expert_ffn=f, capacity_factor=c)
              for c in (1.0, capacity)}
    padding = capacity_padding_flops_per_sample(blocks[capacity])
    assert padding == pytest.approx(3 * (capacity - 1) * k * s * (6 * h * f + 6 * f + 2 * h), rel=1e-12)
    assert blocks[capacity].flops_per_sample - padding == pytest.approx(blocks[1.0].flops_per_sample, rel=1e-12)
    dense = build_model("deepseek-moe-16b", seq_len=128, num_layers=2).layers[1]
    assert dense.spec["kind"] == "transformer_block" and capacity_padding_flops_per_sample(dense) == 0
