"""Hardware catalogue: preset figures, lookups and inline specs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from simulator.hardware import GPUS, LINKS, GpuSpec, LinkSpec, resolve_gpu, resolve_link

ROOT_SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

GPU_KEYS = {"P100-PCIe", "P100-SXM2", "P40", "GTX-1080Ti", "V100", "V100-16GB", "V100-PCIe", "T4",
            "RTX-2080Ti", "A100-40GB", "A100-80GB", "A100-40GB-PCIe", "A100-80GB-PCIe", "A10", "L4",
            "L40S", "H100-SXM", "H100-PCIe", "H200", "B200", "MI250X", "MI250X-GCD", "MI300X", "cpu"}
LINK_KEYS = {"nvlink1-p100", "nvlink2-v100", "nvlink3-a100", "nvlink4-h100", "nvlink5-b200",
             "nvswitch1-v100", "nvswitch2-a100", "nvswitch3-h100", "nvswitch4-b200",
             "pcie3", "pcie3-no-p2p", "pcie4", "pcie4-no-p2p", "pcie5", "pcie5-no-p2p",
             "ib-edr", "ib-hdr", "ib-ndr", "ib-xdr", "roce-25g", "roce-100g", "roce-200g", "roce-400g",
             "10gbe", "25gbe", "100gbe", "loopback"}


def test_catalogue_keys():
    assert set(GPUS) == GPU_KEYS
    assert set(LINKS) == LINK_KEYS


@pytest.mark.parametrize("key", sorted(GPU_KEYS))
def test_gpu_presets_positive_and_sourced(key):
    spec = GPUS[key]
    assert spec.name == key
    assert spec.source.strip() and spec.source != "user supplied"
    assert "fp32" in spec.peak_flops_per_s
    assert all(v > 0 and math.isfinite(v) for v in spec.peak_flops_per_s.values())
    assert spec.memory_bytes > 0 and spec.memory_bandwidth_bytes_per_s > 0
    for dtype in ("fp32", "fp16", "tf32", *(("bf16",) if "bf16" in spec.peak_flops_per_s else ())):
        assert spec.peak_for(dtype) > 0


@pytest.mark.parametrize("key", sorted(LINK_KEYS))
def test_link_presets_positive_and_sourced(key):
    spec = LINKS[key]
    assert spec.name == key
    assert spec.source.strip() and spec.source != "user supplied"
    assert spec.latency_s > 0 and spec.bandwidth_bytes_per_s > 0
    assert spec.latency_s < 1e-4  # every tier is well under 100 us one-way


def test_datasheet_figures():
    assert GPUS["H100-SXM"].peak_for("bf16") == pytest.approx(989e12, rel=0.01)
    assert GPUS["H100-SXM"].peak_for("fp8") == pytest.approx(1979e12, rel=0.01)
    assert GPUS["A100-80GB"].peak_for("fp16") == 312e12
    assert GPUS["A100-40GB"].peak_for("bf16") == 312e12
    assert GPUS["A100-40GB"].peak_for("tf32") == 156e12
    assert GPUS["V100"].peak_for("fp16") == 125e12
    assert GPUS["V100"].memory_bytes == 32 * 2**30
    assert GPUS["A100-80GB"].memory_bandwidth_bytes_per_s == 2039e9
    assert GPUS["H200"].memory_bandwidth_bytes_per_s == 4.8e12
    # GeForce quirks: Pascal fp16 is 1/64 fp32; Turing fp32-accumulate tensor is half rate
    assert GPUS["GTX-1080Ti"].peak_flops_per_s["fp16"] == pytest.approx(GPUS["GTX-1080Ti"].peak_for("fp32") / 64)
    assert GPUS["RTX-2080Ti"].peak_for("fp16") == pytest.approx(53.8e12)


def test_dense_not_sparse():
    # sparse figures would be 2x these
    assert GPUS["H200"].peak_for("fp16") < 1.0e15
    assert GPUS["A100-40GB"].peak_for("fp16") < 400e12


def test_peak_for_fallbacks():
    v100 = GPUS["V100"]
    assert v100.peak_for("tf32") == v100.peak_for("fp32")
    for dtype in ("int4", "bf16"):  # bf16 tensor cores came with Ampere: no fp16 rate to borrow
        with pytest.raises(KeyError):
            v100.peak_for(dtype)
    assert GPUS["A100-80GB"].peak_for("fp8") == GPUS["A100-80GB"].peak_for("fp16")


@pytest.mark.parametrize("gpu", ["V100", "T4", "RTX-2080Ti", "P100-PCIe"])
def test_bf16_before_ampere_is_refused_in_one_line(gpu):
    from simulator.errors import ScenarioError
    from simulator.scenario import load_scenario
    with pytest.raises(ScenarioError, match=r"training.dtype 'bf16' \(bf16 tensor cores came with Ampere"):
        load_scenario(ROOT_SCENARIOS / "resnet50_dp_a100.yaml", [f"cluster.gpu={gpu}"])
    assert load_scenario(ROOT_SCENARIOS / "resnet50_dp_a100.yaml", [f"cluster.gpu={gpu}", "training.dtype=fp16"])


def test_link_figures():
    assert LINKS["nvlink2-v100"].bandwidth_bytes_per_s == 150e9
    assert LINKS["nvlink3-a100"].bandwidth_bytes_per_s == 300e9
    assert LINKS["nvlink4-h100"].bandwidth_bytes_per_s == 450e9
    assert LINKS["ib-edr"].bandwidth_bytes_per_s == 12.5e9
    assert LINKS["ib-hdr"].bandwidth_bytes_per_s == 25e9
    assert LINKS["ib-ndr"].bandwidth_bytes_per_s == 50e9
    assert LINKS["pcie3"].bandwidth_bytes_per_s == pytest.approx(15.75e9)
    assert LINKS["pcie4"].bandwidth_bytes_per_s == pytest.approx(31.5e9)
    assert LINKS["10gbe"].bandwidth_bytes_per_s == pytest.approx(1.25e9)
    assert LINKS["100gbe"].bandwidth_bytes_per_s == pytest.approx(12.5e9)


@pytest.mark.parametrize("gen", ["pcie3", "pcie4", "pcie5"])
def test_no_p2p_is_half_bandwidth_double_latency(gen):
    p2p, staged = LINKS[gen], LINKS[f"{gen}-no-p2p"]
    assert staged.bandwidth_bytes_per_s == pytest.approx(p2p.bandwidth_bytes_per_s / 2)
    assert staged.latency_s == pytest.approx(2 * p2p.latency_s)


def test_lookup_case_insensitive():
    assert resolve_gpu("a100-80gb") is GPUS["A100-80GB"]
    assert resolve_gpu("H100-sxm") is GPUS["H100-SXM"]
    assert resolve_gpu("CPU") is GPUS["cpu"]
    assert resolve_link("IB-HDR") is LINKS["ib-hdr"]
    assert resolve_link("NVLink3-A100") is LINKS["nvlink3-a100"]


def test_unknown_gpu_suggests_nearest():
    with pytest.raises(ValueError, match="unknown GPU preset") as err:
        resolve_gpu("A100-80G")
    assert "A100-80GB" in str(err.value)


def test_unknown_link_suggests_nearest():
    with pytest.raises(ValueError, match="unknown link preset") as err:
        resolve_link("ib-hdrr")
    assert "ib-hdr" in str(err.value)


def test_unknown_far_name_points_to_the_list_command():
    """No name is near: all of them would overflow the error's one line, so the command that lists them is named."""
    with pytest.raises(ValueError, match="`ghpsim list gpus` lists them"):
        resolve_gpu("zzzzzzzz")
    with pytest.raises(ValueError, match="`ghpsim list links` lists them"):
        resolve_link("zzzzzzzz")


def test_spec_instance_passes_through():
    spec = GPUS["V100"]
    assert resolve_gpu(spec) is spec
    assert resolve_link(LINKS["pcie4"]) is LINKS["pcie4"]


def test_inline_gpu_with_readable_strings():
    spec = resolve_gpu({
        "name": "my-a100",
        "peak_flops_per_s": {"fp16": "312 TFLOP/s", "fp32": "19.5 TFLOPS"},
        "memory_bytes": "80 GiB",
        "memory_bandwidth_bytes_per_s": "2 TB/s",
    })
    assert isinstance(spec, GpuSpec)
    assert spec.peak_for("fp16") == pytest.approx(312e12)
    assert spec.peak_for("fp32") == pytest.approx(19.5e12)
    assert spec.memory_bytes == 80 * 2**30
    assert spec.memory_bandwidth_bytes_per_s == pytest.approx(2e12)
    assert spec.source == "user supplied"


def test_inline_link_with_readable_strings():
    spec = resolve_link({"latency_s": "2 us", "bandwidth_bytes_per_s": "25 GB/s"})
    assert isinstance(spec, LinkSpec)
    assert spec.latency_s == pytest.approx(2e-6)
    assert spec.bandwidth_bytes_per_s == pytest.approx(25e9)
    bits = resolve_link({"latency_s": "1 us", "bandwidth_bytes_per_s": "200 Gb/s"})
    assert bits.bandwidth_bytes_per_s == pytest.approx(25e9)


@pytest.mark.parametrize("bandwidth", [0, -1, "-25 GB/s", "0 GB/s"])
def test_non_positive_bandwidth_rejected(bandwidth):
    with pytest.raises(ValidationError):
        resolve_link({"latency_s": "2 us", "bandwidth_bytes_per_s": bandwidth})
    with pytest.raises(ValidationError):
        resolve_gpu({"peak_flops_per_s": {"fp32": 1e12}, "memory_bytes": "1 GiB",
                     "memory_bandwidth_bytes_per_s": bandwidth})


def test_negative_latency_rejected_zero_allowed():
    with pytest.raises(ValidationError):
        resolve_link({"latency_s": "-1 us", "bandwidth_bytes_per_s": "1 GB/s"})
    assert resolve_link({"latency_s": 0, "bandwidth_bytes_per_s": "1 GB/s"}).latency_s == 0


def test_wrong_unit_kind_rejected():
    with pytest.raises(ValidationError):
        resolve_link({"latency_s": "2 GB", "bandwidth_bytes_per_s": "1 GB/s"})
    with pytest.raises(ValidationError):
        resolve_gpu({"peak_flops_per_s": {"fp32": "1 TB/s"}, "memory_bytes": "1 GiB",
                     "memory_bandwidth_bytes_per_s": "1 TB/s"})


def test_extra_keys_rejected():
    with pytest.raises(ValidationError):
        resolve_link({"latency_s": "2 us", "bandwidth_bytes_per_s": "25 GB/s", "bandwdith": 1})
    with pytest.raises(ValidationError):
        resolve_gpu({"peak_flops_per_s": {"fp32": 1e12}, "memory_bytes": "1 GiB",
                     "memory_bandwidth_bytes_per_s": "1 TB/s", "tdp_w": 400})


def test_missing_required_field_rejected():
    with pytest.raises(ValidationError):
        resolve_link({"latency_s": "2 us"})


def test_other_types_rejected():
    with pytest.raises(ValueError):
        resolve_gpu(42)
    with pytest.raises(ValueError):
        resolve_link(None)


def test_specs_are_frozen():
    with pytest.raises(ValidationError):
        LINKS["ib-hdr"].latency_s = 0  # type: ignore[misc]


@pytest.mark.parametrize("spec, field, wording", [
    ({"num_sms": True}, "num_sms", "not a boolean"), ({"boost_clock_hz": "1.41e9"}, "boost_clock_hz", "not text"),
    ({"boost_clock_hz": True}, "boost_clock_hz", "not a boolean")])
def test_inline_gpu_counts_and_clocks_take_plain_numbers_only(spec, field, wording):
    base = {"name": "x", "peak_flops_per_s": {"fp32": 1e13}, "memory_bytes": 1e10, "memory_bandwidth_bytes_per_s": 1e12}
    with pytest.raises(ValidationError, match=wording) as error:
        GpuSpec(**base, **spec)
    assert error.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_an_inline_link_s_nvls_switch_is_true_or_false_only(value):
    with pytest.raises(ValidationError, match="expected true or false"):
        LinkSpec(latency_s=1e-6, bandwidth_bytes_per_s=1e10, kind="nvlink", nvls=value)
    assert LinkSpec(latency_s=1e-6, bandwidth_bytes_per_s=1e10, kind="nvlink", nvls=True).nvls
