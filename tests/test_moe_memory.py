"""Activation memory of mixture-of-experts blocks (`simulator.memory_activations.moe_block_bytes`):
Korthikanti et al. 2023's per-layer count for the LLaMA attention half, extended by the tensors
Megatron-Core's MoE layer saves (router probabilities s E in fp32, permuted tokens c k s h, the
experts' SwiGLU tensors 3 c k s f_e, the expert outputs c k s h, the shared experts' 3 s f_s), with
Megatron-Core's TP / sequence-parallel split, and the recompute modes of the dense blocks."""

from __future__ import annotations

import pytest

from simulator.memory_activations import Sharding, core_recompute_flops, is_block, kept_bytes, saved_bytes
from simulator.strategies.experts import shard_moe_layer
from simulator.memory_activations import recompute_ranges
from simulator.workload import Workload
from simulator.zoo.moe import moe_block

E = 2  # bf16
MIXTRAL = {"hidden": 4096, "heads": 32, "kv_heads": 8, "seq": 4096, "num_experts": 8, "top_k": 2,
           "expert_ffn": 14336}
DEEPSEEK = {"hidden": 2048, "heads": 16, "kv_heads": 16, "seq": 4096, "num_experts": 64, "top_k": 6,
            "expert_ffn": 1408, "shared_ffn": 2 * 1408}


def block(dims: dict, **extra):
    d = {**dims, **extra}
    return moe_block("block", d.pop("hidden"), d.pop("heads"), d.pop("kv_heads"), d.pop("seq"), **d)


def closed_form(dims: dict, t: int = 1, sp: bool = False, flash: bool = True, c: float = 1.0) -> float:
    """Bytes per sample (b = 1), dropout 0: 4 s h e replicated (/ t with SP); (2 s h + 2 s g d) e / t;
    the core 4 a s (flash) or a s^2 e, / t; router 4 s E (/ t with SP); c k s h e whole;
    (3 c k s f_e + c k s h) e / t; 3 s f_s e / t."""
    s, h, a = dims["seq"], dims["hidden"], dims["heads"]
    gd = dims["kv_heads"] * h // a
    ck = c * dims["top_k"]
    sp_div = t if sp else 1
    attention = 4 * s * h * E / sp_div + (2 * s * h + 2 * s * gd) * E / t
    core = (4 * a * s if flash else a * s * s * E) / t
    router = 4 * s * dims["num_experts"] / sp_div
    experts = ck * s * h * E + (3 * ck * s * dims["expert_ffn"] + ck * s * h) * E / t
    shared = 3 * s * dims.get("shared_ffn", 0) * E / t
    return attention + core + router + experts + shared


@pytest.mark.parametrize("dims", [MIXTRAL, DEEPSEEK], ids=["mixtral", "deepseek"])
@pytest.mark.parametrize("flash", [True, False])
def test_an_moe_block_saves_the_closed_form_without_parallelism(dims, flash):
    saved = saved_bytes(block(dims), E, Sharding(flash_attention=flash))
    assert saved == pytest.approx(closed_form(dims, flash=flash), rel=1e-12)


def test_mixtral_block_saves_just_under_a_gibibyte_per_sequence_with_flash():
    """s h (12 + 4 g d / h) + 4 s E + 4 a s + 4 c k s h + 6 c k s f_e = 1,057,619,968 bytes."""
    saved = saved_bytes(block(MIXTRAL), E, Sharding(flash_attention=True))
    assert saved == 4096 * 4096 * 13 + 4 * 4096 * 8 + 4 * 32 * 4096 + 4 * 2 * 4096 * 4096 + 6 * 2 * 4096 * 14336
    assert saved == 1_057_619_968


@pytest.mark.parametrize("dims", [MIXTRAL, DEEPSEEK], ids=["mixtral", "deepseek"])
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_split_follows_megatron_core(dims, sp):
    t = 4
    layer = shard_moe_layer(block(dims), t, sp, ep=2)
    assert saved_bytes(layer, E, Sharding(t, sp, True)) == pytest.approx(closed_form(dims, t, sp), rel=1e-12)


def test_capacity_factor_scales_the_routed_tensors_only():
    one, more = (saved_bytes(block(MIXTRAL, capacity_factor=c), E, Sharding(flash_attention=True)) for c in (1.0, 1.5))
    s, h, k, f = 4096, 4096, 2, 14336
    assert more - one == pytest.approx(0.5 * k * s * (2 * h + 3 * f) * E, rel=1e-12)


def test_selective_recompute_drops_only_the_attention_core():
    layer = block(MIXTRAL)
    unfused, flash = Sharding(), Sharding(flash_attention=True)
    none = kept_bytes(layer, "none", E, unfused, True)
    assert none - kept_bytes(layer, "selective", E, unfused, True) == 32 * 4096 * 4096 * E
    assert kept_bytes(layer, "selective", E, flash, True) == kept_bytes(layer, "none", E, flash, True)
    assert is_block(layer)
    assert recompute_ranges(Workload("w", (layer,), {}), 0, 1, "selective") == []  # no whole-layer re-run
    s, h = 4096, 4096
    assert core_recompute_flops(layer) == pytest.approx(4 * s * s * h + 5 * 32 * s * s, rel=1e-12)


def test_full_recompute_keeps_the_block_input():
    layer = shard_moe_layer(block(MIXTRAL), 2, True, ep=1)
    assert kept_bytes(layer, "full", E, Sharding(2, True, True), checkpoint=True) == 4096 * 4096 / 2 * E
    assert kept_bytes(layer, "full", E, Sharding(2, True, True), checkpoint=False) == 0.0
