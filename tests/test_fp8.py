"""FP8 training as Transformer Engine runs it (`training.fp8_recipe`, simulator/kernels_fp8.py): which
GEMMs run in FP8 and at what rate, the casts it adds, the scenario checks, memory, and the published
DGX H100 runs of `benchmarks/bench_published_fp8.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.hardware import GPUS
from simulator.kernel_costs import device_for, kernel_s
from simulator.kernel_ops import gemm
from simulator.kernels import layer_kernels, optimizer_kernels
from simulator.kernels_fp8 import FP8_LINEARS
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

LLAMA_BLOCK = next(layer for layer in build_model("llama3-8b").layers if layer.spec.get("kind") == "transformer_block")
LINEARS = ("qkv", "proj", "fc1", "fc2")


def expand(phase: str, recipe: str | None, tp: int = 1):
    return layer_kernels(LLAMA_BLOCK, phase, 1, dtype="bf16", tp_degree=tp, flash_attention=True,
                         sequence_parallel=tp > 1, fp8_recipe=recipe)


@pytest.mark.parametrize("phase", ["F", "B", "R"])
def test_only_the_blocks_linear_gemms_run_in_fp8_with_one_byte_operands(phase):
    plain, fp8 = expand(phase, None), expand(phase, "delayed")
    plain_gemms = {k.name: k for k in plain if k.kind == "gemm"}
    fp8_gemms = {k.name: k for k in fp8 if k.kind == "gemm"}
    assert plain_gemms.keys() == fp8_gemms.keys()
    for name, kernel in fp8_gemms.items():
        linear = name.removesuffix(".dgrad").removesuffix(".wgrad") in FP8_LINEARS
        assert kernel.fp8 == linear, name
        expected = plain_gemms[name].bytes_read / 2 if linear else plain_gemms[name].bytes_read
        assert kernel.bytes_read == pytest.approx(expected), name
        assert kernel.flops == plain_gemms[name].flops and kernel.bytes_written == plain_gemms[name].bytes_written
    assert not any(k.fp8 for k in plain)
    flash = [[k for k in kernels if k.kind == "flash_attention"] for kernels in (plain, fp8)]
    assert flash[0] == flash[1]  # the attention core stays 16-bit


@pytest.mark.parametrize("phase, tensor", [("F", "input"), ("B", "output_grad")])
def test_each_linear_casts_one_tensor_a_pass_and_current_scaling_reads_it_once_more(phase, tensor):
    delayed, current = expand(phase, "delayed"), expand(phase, "current")
    casts = {k.name: k for k in delayed if k.name.endswith(".fp8_cast_transpose")}
    assert sorted(casts) == sorted(f"{name}.{tensor}.fp8_cast_transpose" for name in LINEARS)
    gemms = {k.name: k for k in delayed if k.kind == "gemm"}
    for name in LINEARS:  # x [m, k] forward; dy [m, n] backward: e bytes read, value + transpose written
        first = gemms[name] if phase == "F" else gemms[f"{name}.dgrad"]
        elements = first.m * first.k
        cast = casts[f"{name}.{tensor}.fp8_cast_transpose"]
        assert (cast.bytes_read, cast.bytes_written) == pytest.approx((2 * elements, 2 * elements))
    amax = [k for k in current if k.name.endswith(".amax")]
    assert len(amax) == len(LINEARS) and len(current) == len(delayed) + len(LINEARS)
    assert sum(k.bytes_read for k in amax) == pytest.approx(sum(k.bytes_read for k in casts.values()))


def test_a_compute_bound_fp8_gemm_takes_half_the_bf16_time_on_h100():
    """Same tile efficiency, twice the peak (H100-SXM: 1979 against 989.5 TFLOP/s dense)."""
    gpu = GPUS["H100-SXM"]
    bf16 = device_for(gpu, "bf16")
    fp8_device = device_for(gpu, "fp8", bf16.parameters)
    from dataclasses import replace
    device = replace(bf16, fp8=fp8_device)
    big = gemm("fc1", 16384, 16384, 16384, 2)
    launch = bf16.parameters.launch_overhead_s
    half = (kernel_s(big, device) - launch) / 2
    assert kernel_s(replace(big, fp8=True, bytes_read=big.bytes_read / 2), device) - launch == pytest.approx(half)
    assert kernel_s(replace(big, fp8=True), bf16) == kernel_s(big, bf16)  # no FP8 device: the pass's rate


def test_the_optimizer_step_casts_each_weight_once():
    plain = optimizer_kernels("adam", 1e9, 100, "bf16")
    delayed = optimizer_kernels("adam", 1e9, 100, "bf16", "delayed")
    current = optimizer_kernels("adam", 1e9, 100, "bf16", "current")
    casts = [k for k in delayed if k.name == "fp8_weight_cast"]
    assert len(delayed) == len(plain) + len(casts) and casts
    assert sum(k.bytes_read for k in casts) == pytest.approx(2e9)
    assert sum(k.bytes_written for k in casts) == pytest.approx(2e9)
    assert sum(k.bytes_read for k in current if k.name == "fp8_weight_cast") == pytest.approx(4e9)


LLAMA_8B = {"name": "l8", "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM",
                                      "intra_node_link": "nvlink4-h100"},
            "model": {"name": "llama3-8b"},
            "strategy": {"kind": "megatron", "tp_degree": 2, "pp_degree": 1, "sequence_parallel": True,
                         "num_microbatches": 2},
            "training": {"global_batch_size": 8, "dtype": "bf16", "optimizer": "adam"},
            "costs": {"flash_attention": True}}


def scenario(**training):
    return load_scenario({**LLAMA_8B, "training": {**LLAMA_8B["training"], **training}})


def test_fp8_speeds_a_step_by_less_than_its_gemms_and_adds_the_weight_copies():
    bf16, fp8 = simulate(scenario()).summary, simulate(scenario(fp8_recipe="delayed")).summary
    assert 0.5 < fp8["step_time_s"] / bf16["step_time_s"] < 0.9
    weights = [summary["devices"][0]["memory_breakdown_bytes"]["weights"] for summary in (bf16, fp8)]
    block_params = sum(layer.num_params for layer in build_model("llama3-8b").layers
                       if layer.spec.get("kind") == "transformer_block")
    # 2 bytes a block parameter, over TP 2 (the norms' few weights are whole on each rank)
    assert weights[1] - weights[0] == pytest.approx(2 * block_params / 2, rel=1e-4)
    assert fp8["mfu"] == pytest.approx(fp8["achieved_tflops_per_gpu"] * 1e12 / GPUS["H100-SXM"].peak_for("fp8"))


@pytest.mark.parametrize("change, words", [
    ({"training": {"dtype": "fp32", "fp8_recipe": "delayed"}}, "needs training.dtype bf16 or fp16"),
    ({"cluster": {"gpu": "A100-80GB", "intra_node_link": "nvlink3-a100"}, "training": {"fp8_recipe": "delayed"}},
     "needs FP8 tensor cores; cluster.gpu 'A100-80GB'"),
    ({"costs": {"model": "analytic"}, "training": {"fp8_recipe": "current"}}, "kernel cost model only"),
    ({"training": {"fp8_recipe": "mxfp8"}}, "training.fp8_recipe"),
])
def test_fp8_where_it_cannot_run_is_one_error_naming_the_field(change, words):
    document = {key: ({**value, **change[key]} if key in change else value) for key, value in LLAMA_8B.items()}
    with pytest.raises(ScenarioError, match="fp8_recipe") as caught:
        load_scenario(document)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_published_runs_are_the_tables_rows():
    """Each row's step is its table's tokens a second a GPU, back from the transcribed step time."""
    from bench_published_fp8 import RUNS_CSV, label
    from simulator.fit import read_runs
    published = {"gpt3-5b on 64": 23406, "gpt3-20b on 64": 5851, "gpt3-175b on 128": 716, "gpt3-175b on 512": 825,
                 "llama2-7b on 8": 16934, "llama2-13b on 16": 8715, "llama2-70b on 64": 1728,
                 "llama3-8b on 8": 12273, "llama3-70b on 64, tp4xpp4": 1524,
                 "llama3-70b on 64, tp4xpp8xcp1, batch 128": 1602, "llama3-405b on 1024, tp8xpp8xcp2, batch 512": 292,
                 "llama3-70b on 64, tp4xpp8xcp1, batch 256": 1621, "llama3-405b on 1024, tp8xpp8xcp2, batch 1536": 311}
    runs = read_runs(RUNS_CSV)
    assert len(runs) == len(published)
    for run in runs:
        name = label(run.document)
        tokens = [value for key, value in published.items() if name.startswith(key)]
        assert len(tokens) == 1, name
        document = run.document
        gpus = document["cluster"]["num_nodes"] * 8
        seq = document["model"].get("params", {}).get("seq_len") or (4096 if "llama2" in name else 8192)
        step_s = document["training"]["global_batch_size"] * seq / (tokens[0] * gpus)
        assert run.measured_s == pytest.approx(step_s, abs=1e-4), name


def test_fp8_saves_the_linear_layers_inputs_in_one_byte():
    """GPT block with sequence parallelism at TP t (Korthikanti et al. eq. 4, flash attention, no dropout,
    so without its two 1-byte masks): 32 s b h / t bytes in bf16; FP8 saves QKV's, fc1's, the
    out-projection's (s h each) and fc2's (4 s h) inputs at 1 byte, 7 s b h / t less; the softmax's
    logsumexp is unchanged."""
    from simulator.memory_activations import Sharding, block_bytes
    from simulator.zoo.transformer import transformer_block
    s, h, heads, t = 2048, 4096, 32, 4
    spec = {**transformer_block("b", h, heads, s, 4 * h, causal=True, pre_norm=True).spec, "dropout": 0.0}
    bf16 = block_bytes(spec, 2, Sharding(t, True, True))
    fp8 = block_bytes(spec, 2, Sharding(t, True, True, fp8=True))
    assert bf16[0] - fp8[0] == pytest.approx(7 * s * h / t)
    assert bf16[0] == pytest.approx(32 * s * h / t + 4 * heads * s / t)
    assert bf16[1] == fp8[1] == 0


def test_grad_reduce_dtype_sets_megatrons_gradient_buffer():
    """Megatron-Core's grad_reduce_in_fp32 off: a bf16 buffer, half the fp32 one Megatron-LM keeps under bf16."""
    fp32 = simulate(scenario()).summary["devices"][0]["memory_breakdown_bytes"]["weight_gradients"]
    document = {**LLAMA_8B, "strategy": {**LLAMA_8B["strategy"], "grad_reduce_dtype": "bf16"}}
    bf16 = simulate(load_scenario(document)).summary["devices"][0]["memory_breakdown_bytes"]["weight_gradients"]
    assert bf16 == pytest.approx(fp32 / 2)
    with pytest.raises(ScenarioError, match="strategy.grad_reduce_dtype: bf16 applies to Megatron's gradient buffer"):
        load_scenario({**document, "strategy": {**document["strategy"], "zero_stage": 3, "pp_degree": 1}})


def test_validate_refuses_fp8_in_one_line(tmp_path, capsys):
    """The validator's ranks are plain torch: an FP8 scenario is refused before any profile is read."""
    import yaml

    from ghpsim.cli import main
    path = tmp_path / "fp8.yaml"
    path.write_text(yaml.safe_dump({**LLAMA_8B, "training": {**LLAMA_8B["training"], "fp8_recipe": "delayed"}}))
    code = main(["validate", str(path), "--profile", str(tmp_path / "absent.json"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "training.fp8_recipe: delayed" in err, err
    assert not (tmp_path / "out").exists()


def test_fp8_on_a_model_without_blocks_is_one_error():
    """Transformer Engine's FP8 applies to blocks' linear layers: a CNN would run unchanged."""
    document = {"name": "r", "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "H100-SXM",
                                         "intra_node_link": "nvlink4-h100"},
                "model": {"name": "resnet50"}, "strategy": {"kind": "dp"},
                "training": {"global_batch_size": 64, "dtype": "bf16", "fp8_recipe": "delayed"}}
    with pytest.raises(ScenarioError, match="training.fp8_recipe: 'delayed' runs the linear layers of transformer"):
        simulate(load_scenario(document))
