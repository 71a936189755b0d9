"""simulator.kernels_attention: Megatron's fused scale-mask-softmax and its unfused fallback."""

from __future__ import annotations

import pytest

from simulator.kernels import layer_kernels
from simulator.kernels_attention import fused_softmax_available
from simulator.zoo.transformer import transformer_block


@pytest.mark.parametrize("batches, sq, sk, e, causal, available", [
    (4, 1024, 1024, 2, True, True),     # b x heads per rank = 4: the kernel's 4 batches per block
    (2, 1024, 1024, 2, True, False),    # micro-batch 1 x 2 heads (16 heads at TP 8)
    (6, 1024, 1024, 2, True, False),    # a multiple of 2, not of 4
    (4, 1024, 1024, 4, True, False),    # fp32 input: never fused
    (4, 8192, 8192, 2, True, False),    # more than 4096 keys
    (4, 16, 16, 2, True, False),        # 16 keys or fewer
    (4, 64, 64, 2, True, False),        # <= 128 keys: 8 batches per block
    (8, 64, 64, 2, True, True),
    (4, 64, 64, 2, False, True),        # not causal: sq (64) must be a multiple of 8
    (4, 1022, 1022, 2, True, False),    # sq, sk not multiples of 4
])
def test_fused_softmax_availability_follows_megatrons_rule(batches, sq, sk, e, causal, available):
    assert fused_softmax_available(batches, sq, sk, e, causal) is available


def _names(batch: float, tp: int, phase: str) -> list[str]:
    block = transformer_block("block", 1024, 16, 1024, 4096, causal=True, pre_norm=True)
    return [kernel.name for kernel in layer_kernels(block, phase, batch, dtype="fp16", tp_degree=tp)]


@pytest.mark.parametrize("phase", ["F", "R", "B"])
def test_two_attention_batches_per_rank_take_the_five_kernel_torch_path(phase):
    fused, unfused = _names(2, 8, phase), _names(1, 8, phase)
    assert len(unfused) == len(fused) + 4
    assert any(name.startswith("attn.softmax.to_fp32") for name in unfused)
    assert not any(name.startswith("attn.softmax.to_fp32") for name in fused)


def test_the_unfused_softmax_moves_the_fp32_scores_five_times():
    """Forward: 2 + 4 (to fp32), 4 + 4 (scale), 4 + 4 (mask), 4 + 4 (softmax), 4 + 2 (to half)
    = 36 bytes per score, against 2 + 2 for the fused kernel."""
    block = transformer_block("block", 1024, 16, 1024, 4096, causal=True, pre_norm=True)
    softmax = [k for k in layer_kernels(block, "F", 1, dtype="fp16", tp_degree=8) if k.name.startswith("attn.softmax")]
    scores = 1 * 2 * 1024 * 1024  # micro-batch x heads per rank x s x s
    assert sum(k.bytes_read + k.bytes_written for k in softmax) == pytest.approx(36 * scores)


@pytest.mark.parametrize("implementation, gpu, forward, backward", [
    ("triton", "A100-80GB", 1.4, 2.0),    # FlashAttention-2 paper, sec. 4.1: 1.3-1.5x forward, 2x backward
    ("flash1", "A100-80GB", 2.0, 2.0),    # ibid.: about 2x faster than FlashAttention and xformers
    ("xformers", "A100-80GB", 2.0, 2.0),
    ("flash3", "H100-SXM", 1 / 1.75, 1 / 1.625),  # FlashAttention-3 paper, sec. 4.1: 1.5-2x, 1.5-1.75x
])
def test_a_flash_implementation_takes_its_published_ratio_of_flash_attention_2s_time(implementation, gpu,
                                                                                       forward, backward):
    from simulator.hardware import GPUS
    from simulator.kernel_costs import device_for, kernel_s

    block = transformer_block("block", 2048, 16, 16384, 8192, causal=True, pre_norm=True)
    reference, other = (device_for(GPUS[gpu], "bf16", flash_kernel=kind) for kind in ("flash2", implementation))
    launch = reference.parameters.launch_overhead_s
    for phase, slowdown in (("F", forward), ("B", backward)):
        flash = [k for k in layer_kernels(block, phase, 2, dtype="bf16", flash_attention=True)
                 if k.kind == "flash_attention"]
        assert len(flash) == 1
        assert kernel_s(flash[0], other) - launch == pytest.approx(slowdown * (kernel_s(flash[0], reference) - launch))
    rest = [k for k in layer_kernels(block, "B", 2, dtype="bf16", flash_attention=True) if k.kind != "flash_attention"]
    assert [kernel_s(k, other) for k in rest] == [kernel_s(k, reference) for k in rest]


def test_flash_attention_3_runs_on_hopper_only():
    from simulator.errors import ScenarioError
    from simulator.hardware import GPUS
    from simulator.kernel_costs import device_for

    with pytest.raises(ScenarioError, match=r"costs.flash_attention_kernel: 'flash3' runs on Hopper GPUs only \(GPU 'A100-80GB' is ampere\)"):
        device_for(GPUS["A100-80GB"], "bf16", flash_kernel="flash3")


def test_the_triton_flash_kernel_needs_flash_attention_on():
    from simulator.errors import ScenarioError
    from simulator.scenario import scenario_from_dict

    with pytest.raises(ScenarioError, match=r"costs.flash_attention_kernel: 'triton' needs costs.flash_attention: true"):
        scenario_from_dict({"model": {"name": "gpt2"}, "training": {"global_batch_size": 8},
                            "costs": {"flash_attention_kernel": "triton"}})


def test_a_faster_flash_implementation_never_runs_past_the_peak():
    from dataclasses import replace

    from simulator.hardware import GPUS
    from simulator.kernel_costs import device_for, kernel_s

    block = transformer_block("block", 2048, 16, 16384, 8192, causal=True, pre_norm=True)
    flash = [k for k in layer_kernels(block, "F", 2, dtype="bf16", flash_attention=True) if k.kind == "flash_attention"][0]
    fitted = replace(device_for(GPUS["H100-SXM"], "bf16").parameters, flash_attention_efficiency=0.9)
    flash3 = device_for(GPUS["H100-SXM"], "bf16", fitted, flash_kernel="flash3")
    at_peak = device_for(GPUS["H100-SXM"], "bf16", replace(fitted, flash_attention_efficiency=1.0))
    assert kernel_s(flash, flash3) == pytest.approx(kernel_s(flash, at_peak))  # 0.9 x 1.75 capped at 1
