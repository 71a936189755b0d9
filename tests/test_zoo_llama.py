"""LLaMA family (simulator/zoo/llama.py): published parameter counts, the block's closed forms, its
kernel expansion (GQA, SwiGLU, RMSNorm, rotary) and `model.hf_config`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.kernels import layer_kernels, num_param_tensors
from simulator.model_source import resolve_workload
from simulator.scenario import ModelConfig, load_scenario
from simulator.zoo import MODELS, build_model
from simulator.zoo.llama import PRESETS, default_ffn_hidden_size, llama_block

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scenarios" / "models" / "llama3_8b_config.json"


@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6.74e9), ("llama2-13b", 13.0e9), ("llama2-70b", 69.0e9),
    ("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)])
def test_preset_parameter_counts_match_the_published_within_one_percent(name, published):
    assert name in MODELS
    assert build_model(name).num_params == pytest.approx(published, rel=0.01)


def test_llama2_7b_is_exactly_the_hugging_face_count():
    assert build_model("llama2-7b").num_params == 6_738_415_616  # LlamaForCausalLM, untied


def test_block_closed_forms():
    s, h, a, g, f = 64, 256, 8, 2, 688
    d = h // a
    block = llama_block("b", h, a, g, s, f)
    assert block.num_params == 2 * h * h + 2 * h * g * d + 3 * h * f + 2 * h
    gemms = 2 * s * h * (h + 2 * g * d) + 2 * s * h * h + 2 * s * h * 2 * f + 2 * s * f * h
    elementwise = 2 * 4 * s * h + 3 * s * (h + g * d) + 5 * a * s * s + 6 * s * f + 2 * s * h
    assert block.forward_flops_per_sample == gemms + 4 * s * s * h + elementwise
    assert block.saved_elements_per_sample == 6 * s * h + 2 * s * g * d + 3 * s * f + a * s * s


def test_multi_query_and_tied_variants():
    mqa = build_model("llama", num_layers=1, hidden_size=256, num_heads=8, num_kv_heads=1, seq_len=32,
                      vocab_size=1000)
    tied = build_model("llama", num_layers=1, hidden_size=256, num_heads=8, num_kv_heads=1, seq_len=32,
                       vocab_size=1000, tie_embeddings=True)
    assert mqa.num_params - tied.num_params == 1000 * 256
    assert mqa.layers[1].spec["num_kv_heads"] == 1
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_model("llama", num_heads=32, num_kv_heads=5)


def test_default_ffn_follows_metas_rule():
    assert default_ffn_hidden_size(4096) == 11008


def _kernels(layer, phase="F", tp=1, flash=False):
    return layer_kernels(layer, phase, 2, dtype="bf16", tp_degree=tp, flash_attention=flash)


def test_block_forward_kernel_flops_equal_the_zoo():
    block = build_model("llama3-8b", num_layers=1, seq_len=512).layers[1]
    assert sum(k.flops for k in _kernels(block)) == pytest.approx(2 * block.forward_flops_per_sample, rel=1e-12)
    backward = sum(k.flops for k in _kernels(block, "B"))
    assert backward == pytest.approx(2 * block.backward_flops_per_sample, rel=0.005)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_kernel_shapes_under_tensor_parallelism(tp):
    h, g, d, f = 4096, 8, 128, 14336
    block = build_model("llama3-8b", num_layers=1, seq_len=512).layers[1]
    kernels = {k.name: k for k in _kernels(block, tp=tp)}
    assert kernels["qkv"].n == (h + 2 * g * d) / tp and kernels["qkv"].k == h
    assert kernels["fc1"].n == 2 * f / tp and kernels["fc2"].k == f / tp
    assert kernels["swiglu"].flops == 6 * 2 * 512 * f / tp
    assert kernels["rotary_k"].flops == 3 * 2 * 512 * g * d / tp
    assert kernels["norm1"].kind == "norm" and "ln1" not in kernels
    assert "attn.kv_repeat" in kernels and "bias_gelu" not in kernels
    assert "attn.kv_repeat" not in {k.name for k in _kernels(block, tp=tp, flash=True)}


def test_tp_must_divide_the_kv_heads():
    block = build_model("llama2-70b", num_layers=1, seq_len=128).layers[1]
    with pytest.raises(ValueError, match="^tp_degree 16 does not divide num_kv_heads 8$"):
        _kernels(block, tp=16)


def test_gpt_expansion_has_no_grouped_query_kernels():
    names = {k.name for k in _kernels(build_model("gpt2-small").layers[1])}
    assert "attn.kv_repeat" not in names and "ln1" in names


def test_parameter_tensors_and_embedding_without_position_table():
    workload = build_model("llama2-7b", num_layers=1, seq_len=128)
    assert [num_param_tensors(layer) for layer in workload.layers] == [1, 6, 2]
    names = {k.name for k in _kernels(workload.layers[0], "B")}
    assert "token_scatter_add" in names and "position_scatter_add" not in names


# --- model.hf_config ------------------------------------------------------------------------------

def test_hf_config_builds_the_preset():
    workload = resolve_workload(ModelConfig(hf_config="models/llama3_8b_config.json", params={"seq_len": 8192}),
                                str(ROOT / "scenarios"))
    preset = build_model("llama3-8b")
    assert workload.name == "llama3_8b_config"
    assert workload.layers == preset.layers


def test_hf_config_path_is_relative_to_the_scenario(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scenario = load_scenario(ROOT / "scenarios" / "llama3_8b_dgx_h100.yaml")
    assert resolve_workload(scenario.model, scenario.base_dir).num_params == build_model("llama3-8b").num_params


def _error(tmp_path, config, params=None, text=None) -> str:
    path = tmp_path / "config.json"
    path.write_text(text if text is not None else json.dumps(config))
    with pytest.raises(ScenarioError) as error:
        resolve_workload(ModelConfig(hf_config="config.json", params=params or {}), str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and message.startswith("model.")
    return message


def test_hf_config_errors_name_the_key_and_its_value_only(tmp_path):
    base = json.loads(CONFIG.read_text())
    assert "missing key intermediate_size" in _error(tmp_path, {k: v for k, v in base.items()
                                                                 if k != "intermediate_size"})
    message = _error(tmp_path, {**base, "hidden_act": "some_gelu"})
    assert message.endswith("hidden_act: 'some_gelu': only silu (a SwiGLU MLP) is supported")
    assert _error(tmp_path, {**base, "hidden_act": "x" * 100}).count("x") == 36  # a long value is cut
    assert "num_local_experts" in _error(tmp_path, {**base, "num_local_experts": 8})
    assert "rms_norm_eps" in _error(tmp_path, {k: v for k, v in base.items() if k != "rms_norm_eps"})
    assert "hidden_size: expected a positive integer" in _error(tmp_path, {**base, "hidden_size": "big"})
    # the file's own keys, not the factory's (num_heads, num_kv_heads), and the file's path
    message = _error(tmp_path, {**base, "num_key_value_heads": 5})
    assert message.endswith("num_attention_heads 32 not divisible by num_key_value_heads 5")
    assert str(tmp_path / "config.json") in message and "num_kv_heads" not in message
    assert _error(tmp_path, {**base, "num_attention_heads": 33}).endswith(
        "hidden_size 4096 not divisible by num_attention_heads 33")
    # a model.params override is named as such
    assert _error(tmp_path, base, params={"seq_len": 10**5}).endswith(
        "max_position_embeddings 8192 < model.params.seq_len 100000")
    message = _error(tmp_path, None, text='{"secret": ')
    assert "not valid JSON" in message and "secret" not in message
    assert "model.params.bogus" in _error(tmp_path, base, params={"bogus": 1})


def test_presets_are_all_registered():
    assert set(PRESETS) <= set(MODELS)


def test_megatron_refuses_tp_not_dividing_the_kv_heads_with_either_cost_model():
    from simulator.errors import ScenarioError
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate
    for model in ("kernel", "analytic"):
        scenario = load_scenario("scenarios/llama3_8b_dgx_h100.yaml",
                                 overrides=["strategy.tp_degree=16", "cluster.gpus_per_node=16", f"costs.model={model}"])
        with pytest.raises(ScenarioError, match="does not divide the 8 key-value heads"):
            simulate(scenario)
